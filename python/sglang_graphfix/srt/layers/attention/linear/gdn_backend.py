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
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.full_prefill_graph_capability import (
    device_sm,
    flashinfer_gdn_prefill_captures,
    require_capturable_full_prefill_graph,
)
from sglang_graphfix.srt.layers.attention.linear.gdn_prefill_graph import (
    ForwardTablesMemo,
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
        backend.full_prefill_graph_forward_tables = ForwardTablesMemo()
    return meta


# What:    Wraps GDNAttnBackend.forward_extend: while a full prefill graph bucket
#          warms up and is captured, run the extend on that bucket's tables.
# Why:     The eager extend launches from host-side lengths (causal_conv1d_fn's
#          seq_lens_cpu, FLA's prepare_chunk_indices .tolist()), which capture
#          either rejects or freezes at the capture batch.
# How:     gdn_extend_in_graph: the backend's own prefill kernel (Triton, or
#          FlashInfer's where FLASHINFER_GDN_CAPTURE_SM allows it) fed the static
#          tables that prepare_full_prefill_graph_tables refills before each replay
#          (what the layers derive from them built by the first layer of each
#          forward, GDN_TABLES_ONCE_PER_FORWARD).
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
        extend_kernel=self.kernel_dispatcher.extend_kernel,
        forward_tables=getattr(self, "full_prefill_graph_forward_tables", None)
        if capability.GDN_TABLES_ONCE_PER_FORWARD
        else None,
    )


# What:    Wraps flashinfer_gdn_prefill_default: under a full prefill CUDA graph,
#          build the GDN backend with the Triton prefill kernel, and remember
#          sglang's default for the batches the graph does not take.
# Why:     The captured GDN extend runs the Triton chunk kernels on static
#          tables (FlashInfer's GDN prefill only where
#          FLASHINFER_GDN_CAPTURE_SM says it was checked to capture), and an
#          automatic FlashInfer prefill would fail the capture-time check.
#          Keeping Triton for every prefill (as before) also put the eager
#          fallback on Triton instead of sglang's default (issue 13).
# How:     Where FlashInfer's GDN prefill captures, sglang's default unchanged.
#          Else return None (Triton) and record the default on the model runner
#          (EAGER_GDN_PREFILL_DEFAULT); once the prefill graph has captured,
#          prefill_cuda_graph_runner.route_full_prefill_fallback puts the eager
#          extend back on it. An explicit --linear-attn-prefill-backend never
#          reaches this default.
# Upstream: sglang/srt/layers/attention/linear/gdn_backend.py::flashinfer_gdn_prefill_default
# Removal: with gdn_extend_on_full_graph_tables, or once FlashInfer GDN prefill
#          captures on every GPU that picks it.
def keep_triton_gdn_prefill_for_full_graph(original, model_runner):
    default = original(model_runner)
    if default is None or not check_cuda_graph_backend(Phase.PREFILL, Backend.FULL):
        return default
    if flashinfer_gdn_prefill_captures(default, device_sm()):
        return default
    if model_runner is not None:
        setattr(model_runner, EAGER_GDN_PREFILL_DEFAULT, default)
    logger.warning(
        "Keeping the Triton GDN prefill kernel instead of the %s default for the "
        "full prefill CUDA graph, which captures the Triton GDN extend here; "
        "prefill batches the graph does not take run %s once it is captured.",
        default,
        default,
    )
    return None


# The model runner attribute holding sglang's GDN prefill default under a full
# prefill graph (set above, read after capture).
EAGER_GDN_PREFILL_DEFAULT = "graphfix_eager_gdn_prefill_default"
