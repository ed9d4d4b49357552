# SPDX-License-Identifier: Apache-2.0
"""DSA indexer ``weights_proj`` LoRA under piecewise/breakable prefill graphs.

Fixes sglang/srt/layers/attention/dsa/dsa_indexer.py: under a piecewise or
breakable prefill CUDA graph the indexer runs as one eager split op, whose head
gate multiplies by the bare ``weights_proj.weight`` and so would drop a LoRA
delta. Upstream therefore refuses (GRAPH_WEIGHTS_PROJ_LORA_ERROR), which with the
default breakable prefill graph means the server cannot start with such an
adapter. The split op is eager, so the LoRA layer can simply run inside it.
"""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.dsa import dsa_indexer
from sglang.srt.layers.attention.dsa.utils import is_graph_dsa_split_op_surface
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    is_in_breakable_cuda_graph,
)


def weights_proj_has_lora(indexer) -> bool:
    """The upstream test: a LoRA adapter owns ``weights_proj`` (fusion folds it
    into ``wk_weights_proj``, and the LoRA manager rejects indexer LoRA then)."""
    return not indexer.use_dsa_indexer_fusion and getattr(
        indexer.weights_proj, "set_lora", False
    )


# What:    Wraps Indexer._get_logits_head_gate: with a LoRA-wrapped weights_proj,
#          the head gate comes from the LoRA layer (base + delta).
# Why:     The graph split op (pcg_dsa_indexer_prefill_split) builds the gate
#          from weights_proj.weight alone, silently dropping the adapter.
# How:     Same two steps as the eager LoRA branch of Indexer.forward_cuda:
#          weights_proj(x) scaled by n_heads**-0.5, then the q/softmax scale.
# Upstream: sglang/srt/layers/attention/dsa/dsa_indexer.py::Indexer._get_logits_head_gate
# Removal: once the upstream split op applies weights_proj LoRA.
def lora_aware_head_gate(original, self, x, q_scale):
    if not weights_proj_has_lora(self):
        return original(self, x, q_scale)
    if isinstance(x, tuple):
        # Quantized activations (ROCm aiter) never reach a CUDA split op.
        raise RuntimeError(dsa_indexer.GRAPH_WEIGHTS_PROJ_LORA_ERROR)
    weights = self.weights_proj(x)[0].float() * self.n_heads**-0.5
    return self._apply_q_scale_and_softmax_scale(weights, q_scale)


# What:    Wraps Indexer.forward_cuda: on the graph split-op surface, dispatch
#          the indexer split op even when weights_proj carries a LoRA adapter.
# Why:     Upstream raises GRAPH_WEIGHTS_PROJ_LORA_ERROR there, which the default
#          breakable prefill graph hits at startup.
# How:     Only for that case (CUDA split-op surface, no prefill CP, LoRA on
#          weights_proj): allocate the padded top-k buffer and call the PCG or BCG
#          split op as upstream's branch does; lora_aware_head_gate makes the
#          split op apply the delta. Everything else runs upstream unchanged,
#          including its error on graph paths without a split op.
# Upstream: sglang/srt/layers/attention/dsa/dsa_indexer.py::Indexer.forward_cuda
# Removal: with lora_aware_head_gate.
def lora_aware_split_op_dispatch(
    original,
    self,
    x,
    q_lora,
    positions,
    forward_batch,
    layer_id,
    return_indices: bool = True,
    use_cuda_graph: bool = True,
):
    if not (
        use_cuda_graph
        and weights_proj_has_lora(self)
        and is_graph_dsa_split_op_surface(forward_batch)
        and not self.dsa_enable_prefill_cp
        and not self.use_gfx950_fused_indexer
    ):
        return original(
            self,
            x,
            q_lora,
            positions,
            forward_batch,
            layer_id,
            return_indices=return_indices,
            use_cuda_graph=use_cuda_graph,
        )
    x_parts = x if isinstance(x, tuple) else (x,)
    rows = x_parts[0].shape[0] if return_indices else 0
    # Static padded buffer the split op fills in place; -1 marks no index.
    topk_result = torch.full(
        (rows, self.index_topk), -1, dtype=torch.int32, device=x_parts[0].device
    )
    split_op = (
        dsa_indexer.bcg_dsa_indexer_prefill_split
        if is_in_breakable_cuda_graph()
        else dsa_indexer.pcg_dsa_indexer_prefill_split
    )
    split_op(
        layer_id=layer_id,
        x=x_parts[0],
        q_lora=q_lora,
        positions=positions,
        topk_result=topk_result,
        x_s=x_parts[1] if len(x_parts) > 1 else None,
        x_bf16=x_parts[2] if len(x_parts) > 2 else None,
    )
    result = dsa_indexer._broadcast_indexer_topk_from_rank0(
        topk_result if return_indices else None
    )
    return dsa_indexer.maybe_capture_indexer_topk(layer_id, result)
