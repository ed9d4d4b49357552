# SPDX-License-Identifier: Apache-2.0
"""Adapter loads into sglang's LoRA memory pool, counted.

Mirrors sglang/srt/lora/mem_pool.py. The DSA indexer caches each adapter's
weights_proj merged into the base weight (dsa_indexer.merged_weights_proj); a
load may overwrite the pool slot such a cache was built from, and an adapter id
can come back with other weights (ids of --lora-paths adapters derive from name
and path), so every cache built before the latest load is stale.
"""

from __future__ import annotations

pool_loads = 0  # adapter loads into any LoRA memory pool of this process


# What:    Wraps LoRAMemoryPool.load_lora_weight_to_buffer: counts the loads.
# Why:     Merged weights_proj caches (dsa_indexer.merged_weights_proj) must not
#          outlive the pool contents they were built from.
# How:     Bump pool_loads before the load; caches keyed by an older count are
#          rebuilt. Loads are rare (a new adapter enters the pool).
# Upstream: sglang/srt/lora/mem_pool.py::LoRAMemoryPool.load_lora_weight_to_buffer
# Removal: with dsa_indexer.merged_weights_proj (upstream would merge at load).
def count_lora_pool_loads(original, self, *args, **kwargs):
    global pool_loads
    pool_loads += 1
    return original(self, *args, **kwargs)
