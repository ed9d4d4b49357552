# SPDX-License-Identifier: Apache-2.0
"""GDNAttnBackend under a full prefill CUDA graph.

Fixes sglang/srt/layers/attention/linear/gdn_backend.py: the GDN extend reads
host-side sequence lengths, so a full prefill graph cannot capture it. The
backend gets one set of static tables per captured token bucket (allocated at
capture, refilled before every replay) and runs the extend on them.
"""

from __future__ import annotations

import logging

from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
)
from sglang.srt.model_executor.cuda_graph_config import (
    Backend,
    Phase,
    check_cuda_graph_backend,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.runner_utils.prefill_graph import (
    is_in_full_prefill_graph,
)

from sglang_graphfix.srt.full_prefill_graph_capability import (
    require_capturable_full_prefill_graph,
)
from sglang_graphfix.srt.layers.attention.linear.gdn_prefill_graph import (
    gdn_extend_in_graph,
)
from sglang_graphfix.srt.layers.attention.linear.kda_prefill_graph import (
    full_prefill_graph_tables,
)

logger = logging.getLogger(__name__)


def prepare_full_prefill_graph_tables(
    backend, forward_batch: ForwardBatch, *, in_capture: bool
) -> KDAPrefillGraphMetadata:
    """The bucket's tables (full_prefill_graph_tables); at capture, the capability
    model asserts first (the two-batch-overlap path reaches only this check)."""
    if in_capture:
        require_capturable_full_prefill_graph(backend)
    meta = full_prefill_graph_tables(
        backend, forward_batch, in_capture=in_capture, family="GDN"
    )
    if in_capture:
        # Read by forward_extend while this bucket warms up and is captured.
        backend.full_prefill_graph_capture = meta
    return meta


# What:    Wraps GDNAttnBackend.forward_extend: while a full prefill graph bucket
#          warms up and is captured, run the extend on that bucket's tables.
# Why:     The eager extend launches from host-side lengths (causal_conv1d_fn's
#          seq_lens_cpu, FLA's prepare_chunk_indices .tolist()), which capture
#          either rejects or freezes at the capture batch.
# How:     gdn_extend_in_graph: the same Triton kernels, fed the static tables
#          that prepare_full_prefill_graph_tables refills before each replay.
# Upstream: sglang/srt/layers/attention/linear/gdn_backend.py::GDNAttnBackend.forward_extend
# Removal: once upstream GDN captures its extend (as KDA does for breakable graphs).
def gdn_extend_on_full_graph_tables(
    original, self, layer, forward_batch, mixed_qkv, a, b, **kwargs
):
    meta = getattr(self, "full_prefill_graph_capture", None)
    if meta is None or not is_in_full_prefill_graph():
        return original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
    if meta.num_tokens != mixed_qkv.shape[0]:
        raise RuntimeError(
            f"GDN full prefill graph tables hold {meta.num_tokens} tokens but the "
            f"captured extend has {mixed_qkv.shape[0]}"
        )
    layer_cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
    return gdn_extend_in_graph(
        layer=layer,
        meta=meta,
        conv_states=layer_cache.conv[0],
        ssm_states=layer_cache.temporal,
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
    )


# What:    Wraps flashinfer_gdn_prefill_default: no FlashInfer default for GDN
#          prefill when the prefill CUDA graph backend is full.
# Why:     The captured GDN extend runs the Triton chunk kernels; an automatic
#          FlashInfer prefill would make the capture fail (or leave eager and
#          graph prefill on different kernels).
# How:     Return None (keep Triton) with a warning; an explicit
#          --linear-attn-prefill-backend never reaches this default.
# Upstream: sglang/srt/layers/attention/linear/gdn_backend.py::flashinfer_gdn_prefill_default
# Removal: with gdn_extend_on_full_graph_tables, or once FlashInfer GDN prefill
#          can be captured.
def keep_triton_gdn_prefill_for_full_graph(original, model_runner):
    default = original(model_runner)
    if default is None or not check_cuda_graph_backend(Phase.PREFILL, Backend.FULL):
        return default
    logger.warning(
        "Keeping the Triton GDN prefill kernel instead of the %s default: the full "
        "prefill CUDA graph captures the Triton GDN extend.",
        default,
    )
    return None
