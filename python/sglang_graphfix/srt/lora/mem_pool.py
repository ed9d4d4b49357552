# SPDX-License-Identifier: Apache-2.0
"""Adapter loads into sglang's LoRA memory pool drop the DSA indexer's merged
weights_proj (dsa_indexer.merged_weights_proj). Mirrors sglang/srt/lora/mem_pool.py."""

from __future__ import annotations

from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer


# What:    Wraps LoRAMemoryPool.load_lora_weight_to_buffer: a load drops every
#          merged weights_proj.
# Why:     A load may rewrite the pool slot a merged weight was built from, and
#          an adapter id can come back with other weights (--lora-paths ids
#          derive from name and path): a kept merged weight would be stale.
# How:     dsa_indexer.drop_merged_weights_proj before the load; the next batch
#          on one adapter merges again. Loads are rare (an adapter enters the
#          pool).
# Upstream: sglang/srt/lora/mem_pool.py::LoRAMemoryPool.load_lora_weight_to_buffer
# Removal: with dsa_indexer.merged_weights_proj (upstream would merge at load).
def drop_merged_gates_on_pool_load(original, self, *args, **kwargs):
    dsa_indexer.drop_merged_weights_proj()
    return original(self, *args, **kwargs)
