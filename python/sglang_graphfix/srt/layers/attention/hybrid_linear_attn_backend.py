# SPDX-License-Identifier: Apache-2.0
"""HybridLinearAttnBackend metadata for full prefill CUDA graphs.

Fixes sglang/srt/layers/attention/hybrid_linear_attn_backend.py: the full prefill
runner plans a plain EXTEND out of graph through init_forward_metadata_out_graph,
which the linear side answers with _replay_metadata. That path only knows decode
and verify, and indexes per-batch-size buffers that only the decode runner
allocates (init_cuda_graph_state), so the first prefill capture fails with
``IndexError: list index out of range``.
"""

from __future__ import annotations

from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
)
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang_graphfix.srt.layers.attention.linear.gdn_backend import (
    prepare_full_prefill_graph_tables,
)


# What:    Wraps HybridLinearAttnBackend.init_forward_metadata_out_graph for a
#          plain EXTEND on a GDN model (the full prefill graph's capture/replay).
# Why:     The linear side's _replay_metadata handles decode/verify only and
#          reads state_indices_list[bs - 1], which nothing has allocated when the
#          prefill graph captures (before the decode runner):
#          "IndexError: list index out of range".
# How:     Plan the full-attention side as before; give the GDN side its own
#          per-token-bucket tables (prepare_full_prefill_graph_tables). Decode's
#          per-batch-size buffers stay decode's. Every other mode and backend,
#          including Inkling's capturable sidecar, takes the upstream path.
# Upstream: sglang/srt/layers/attention/hybrid_linear_attn_backend.py::HybridLinearAttnBackend.init_forward_metadata_out_graph
# Removal: once upstream plans linear-attention extend for full prefill graphs.
def linear_extend_tables_for_full_prefill_graph(
    original, self, forward_batch: ForwardBatch, in_capture: bool = False
):
    if not (
        isinstance(self.linear_attn_backend, GDNAttnBackend)
        and HybridLinearAttnBackend._is_plain_extend(forward_batch)
    ):
        return original(self, forward_batch, in_capture=in_capture)
    self.full_attn_backend.init_forward_metadata_out_graph(
        forward_batch, in_capture=in_capture
    )
    prepare_full_prefill_graph_tables(
        self.linear_attn_backend, forward_batch, in_capture=in_capture
    )
