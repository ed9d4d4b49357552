# SPDX-License-Identifier: Apache-2.0
"""KDAAttnBackend under a full prefill CUDA graph.

Fixes sglang/srt/layers/attention/linear/kda_backend.py: the KDA extend reads
host-side sequence lengths, so a full prefill graph cannot capture it eagerly.
Upstream already captures it for breakable graphs on static per-bucket tables
(``KDAPrefillGraphMetadata``, ``kda_extend_in_graph``): ``forward_extend`` runs on
``prefill_graph_metadata`` whenever it is set, and every eager
``init_forward_metadata`` clears it. The full prefill graph reuses those tables:
one per token bucket, allocated at capture, refilled from the runner's
slot-padded batch before every replay.
"""

from __future__ import annotations

from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang_graphfix.srt.full_prefill_graph_capability import (
    require_capturable_full_prefill_graph,
)
from sglang_graphfix.srt.layers.attention.linear.kda_prefill_graph import (
    full_prefill_graph_tables,
)


def prepare_kda_full_prefill_graph_tables(
    backend, forward_batch: ForwardBatch, *, in_capture: bool
) -> KDAPrefillGraphMetadata:
    """The bucket's tables (full_prefill_graph_tables), asserted capturable by the
    capability model at capture, and pointed at by upstream's forward_extend
    (kda_extend_in_graph) while the bucket warms up, is captured or replays; an
    eager init_forward_metadata clears it."""
    if in_capture:
        require_capturable_full_prefill_graph(backend)
    meta = full_prefill_graph_tables(
        backend, forward_batch, in_capture=in_capture, family="KDA"
    )
    backend.prefill_graph_metadata = meta
    return meta


# What:    Wraps KDAAttnBackend.forward_extend: on prefill-graph tables, hands
#          the KDA gate to kda_extend_in_graph flattened to (1, T, H*K).
# Why:     kda_extend_in_graph passes beta_is_raw=True (sigmoid of beta inside
#          the kernel) only for a flat gate; Kimi-Linear's arrives as
#          (1, T, H, K), so graph prefills ran the delta rule on raw beta while
#          eager always applies the sigmoid: outputs differ from the first token.
# How:     Flatten a 4-D gate (a view); the graph extend unflattens it again.
# Upstream: sglang/srt/layers/attention/linear/kda_prefill_graph.py::kda_extend_in_graph
# Removal: once upstream passes beta_is_raw=True there, as the eager path does.
def kda_graph_extend_applies_beta_sigmoid(
    original, self, layer, forward_batch, mixed_qkv, a, b, **kwargs
):
    if (
        self.prefill_graph_metadata is not None
        and a.ndim == 4
        and not forward_batch.forward_mode.is_target_verify()
    ):
        a = a.flatten(-2)
    return original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
