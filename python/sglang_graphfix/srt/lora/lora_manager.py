# SPDX-License-Identifier: Apache-2.0
"""The DSA indexer's merged-gate scaling kernel is compiled when sglang's LoRA
memory pool is set up, not on a user's first request. Mirrors
sglang/srt/lora/lora_manager.py."""

from __future__ import annotations

import logging
import time

from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer

logger = logging.getLogger(__name__)


# What:    Wraps LoRAManager.init_memory_pool: after the pool (and the merged
#          weights_proj reservation, reserve_merged_gates_with_lora_pool) is
#          set up, compile dsa_indexer.scale_merged_head_gates.
# Why:     That pointwise kernel (torch.compile, Inductor) is only reached by
#          a batch on one adapter outside stream capture, so it compiled on the
#          first such user request (first generate 12.4 s vs 9.9 s on
#          DeepSeek-V3.2).
# How:     dsa_indexer.warm_up_merged_gate_scaling on the model: one call per
#          distinct indexer shape with a reservation, dynamic in the token
#          count, before the KV cache and CUDA graphs (never under capture).
#          One INFO line with the time it took.
# Upstream: sglang/srt/lora/lora_manager.py::LoRAManager.init_memory_pool
# Removal: with dsa_indexer.merged_weights_proj.
def compile_merged_gate_scaling_at_pool_init(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    start = time.perf_counter()
    compiled = dsa_indexer.warm_up_merged_gate_scaling(self.base_model)
    if compiled:
        logger.info(
            "sglang-graphfix: compiled the DSA indexer's merged head-gate scaling "
            "(scale_merged_head_gates) at startup in %.1f s",
            time.perf_counter() - start,
        )
    return result
