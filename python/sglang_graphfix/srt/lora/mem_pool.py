# SPDX-License-Identifier: Apache-2.0
"""sglang's LoRA memory pool and the DSA indexer's merged weights_proj
(dsa_indexer.merged_weights_proj): their memory is reserved with the pool,
and adapter loads and unloads drop the merged weights they make stale.
Mirrors sglang/srt/lora/mem_pool.py."""

from __future__ import annotations

import logging

from sglang.srt.utils import get_available_gpu_memory
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer

logger = logging.getLogger(__name__)


# What:    Wraps LoRAMemoryPool.init_buffers: with the pool's A/B buffers,
#          reserve the DSA indexer's merged weights_proj (one per pool slot
#          and indexer whose gate can take the merged path) and log its size.
# Why:     Merged weights allocated on a request (112 MB per adapter per rank
#          on DeepSeek-V3.2, up to --max-loras-per-batch of them) come out of
#          the headroom sglang leaves after sizing the KV cache from the free
#          memory it measures after the LoRA pool is allocated.
# How:     dsa_indexer.reserve_merged_weights_proj after the pool's buffers:
#          the KV cache is sized after it, as for the pool's own buffers. The
#          merged weights are built into it (slot of the adapter), so their
#          memory is bounded and accounted. One INFO line gives the size.
# Upstream: sglang/srt/lora/mem_pool.py::LoRAMemoryPool.init_buffers
# Removal: with dsa_indexer.merged_weights_proj (upstream would merge at load).
def reserve_merged_gates_with_lora_pool(original, self, base_model, *args, **kwargs):
    result = original(self, base_model, *args, **kwargs)
    reserved = dsa_indexer.reserve_merged_weights_proj(self, base_model)
    if reserved:
        halves = reserved[0].halves
        total = sum(r.halves.numel() * r.halves.element_size() for r in reserved)
        logger.info(
            "sglang-graphfix: reserved %.2f MB with the LoRA memory pool for the "
            "DSA indexer's merged weights_proj (%d layers x %d slots x %.2f MB, "
            "W + s*B*A as two %s halves), before the KV cache is sized. "
            "avail mem=%.2f GB",
            total / (1 << 20),
            len(reserved),
            halves.shape[0],
            halves[0].numel() * halves.element_size() / (1 << 20),
            str(halves.dtype).removeprefix("torch."),
            get_available_gpu_memory(halves.device.type, halves.device.index),
        )
    return result


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


# What:    Wraps LoRAMemoryPool.remove_lora (what LoRAManager.unload_lora_adapter
#          runs): the unloaded adapter's merged weights_proj are dropped.
# Why:     They were kept for adapters already unloaded: up to 112 MB per
#          adapter per rank on DeepSeek-V3.2 outside any reservation, and a
#          stale entry if the id came back before another load dropped it.
# How:     dsa_indexer.drop_adapter_merged_weights_proj(uid) after the pool
#          clears the slot; without a reservation their memory is freed, with
#          one the slot's storage waits for the next adapter. An INFO line
#          names the adapter and how many layers held one.
# Upstream: sglang/srt/lora/mem_pool.py::LoRAMemoryPool.remove_lora
# Removal: with dsa_indexer.merged_weights_proj.
def drop_merged_gates_on_adapter_unload(original, self, uid, *args, **kwargs):
    result = original(self, uid, *args, **kwargs)
    dropped = dsa_indexer.drop_adapter_merged_weights_proj(uid)
    if dropped:
        logger.info(
            "sglang-graphfix: dropped the merged DSA indexer weights_proj of "
            "unloaded LoRA adapter %s (%d layers)",
            uid,
            dropped,
        )
    return result
