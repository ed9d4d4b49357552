# SPDX-License-Identifier: Apache-2.0
"""GDNAttnBackend under a full prefill CUDA graph.

Fixes sglang/srt/layers/attention/linear/gdn_backend.py: the GDN extend reads
host-side sequence lengths, so a full prefill graph cannot capture it. The
backend gets one set of static tables per captured token bucket (allocated at
capture, refilled before every replay) and runs the extend on them.
"""

from __future__ import annotations

import logging
from typing import Optional

from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
    KDAPrefillTrackRows,
    build_track_rows,
)
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.model_executor.cuda_graph_config import (
    Backend,
    Phase,
    check_cuda_graph_backend,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.runner_utils.prefill_graph import (
    is_in_full_prefill_graph,
)
from sglang.srt.runtime_context import get_memory, mamba_cache_chunk_size
from sglang_graphfix.srt.layers.attention.linear.gdn_prefill_graph import (
    gdn_extend_in_graph,
)

logger = logging.getLogger(__name__)

_USE_INSTEAD = "or use --cuda-graph-backend-prefill breakable (the default)"


def prepare_full_prefill_graph_tables(
    backend, forward_batch: ForwardBatch, *, in_capture: bool
) -> KDAPrefillGraphMetadata:
    """Allocate (capture) or look up (replay) the bucket's tables and fill them
    from ``forward_batch``, the runner's slot-padded view of the batch."""
    bucket = forward_batch.input_ids.shape[0]
    lens = _real_extend_lens(forward_batch.extend_seq_lens_cpu)
    # Same slot resolution as MambaAttnBackendBase._forward_metadata.
    cache_indices = backend._translate_mamba_indices(
        backend.req_to_token_pool.get_mamba_indices(forward_batch.req_pool_indices)
    )
    if in_capture:
        require_capturable_gdn_extend(backend)
        meta = KDAPrefillGraphMetadata.allocate(
            num_tokens=bucket,
            max_seqs_cap=forward_batch.batch_size,
            # Any replay of the bucket may carry prefix-cache snapshots.
            track=backend.req_to_token_pool.enable_mamba_extra_buffer,
            cache_index_dtype=cache_indices.dtype,
            device=backend.device,
        )
        if not hasattr(backend, "full_prefill_graph_tables"):
            backend.full_prefill_graph_tables = {}
        backend.full_prefill_graph_tables[bucket] = meta
        # Read by forward_extend while this bucket warms up and is captured.
        backend.full_prefill_graph_capture = meta
        track_rows = None  # the capture batch tracks nothing
    else:
        meta = backend.full_prefill_graph_tables[bucket]
        track_rows = _track_rows(backend, forward_batch, lens)
    meta.fill(
        extend_seq_lens=lens,
        cache_indices=cache_indices,
        extend_prefix_lens=forward_batch.extend_prefix_lens,
        track_rows=track_rows,
    )
    return meta


def require_capturable_gdn_extend(backend) -> None:
    """The in-graph extend runs sglang's Triton chunk kernels on contiguous state
    pools; fail at capture, naming the setting, for anything else."""
    problem = None
    if not isinstance(backend.kernel_dispatcher.extend_kernel, TritonGDNKernel):
        problem = (
            f"the GDN prefill kernel is "
            f"{type(backend.kernel_dispatcher.extend_kernel).__name__}; set "
            "--linear-attn-prefill-backend triton"
        )
    elif backend.enable_mis:
        problem = "multi-item scoring needs host-side metadata; drop --enable-mis"
    elif get_memory().enable_page_major_kv_layout:
        problem = (
            "the page-major KV layout strides the GDN state pools; drop "
            "--enable-page-major-kv-layout"
        )
    if problem is not None:
        raise ValueError(
            f"Full prefill CUDA graph cannot capture this GDN extend: {problem}, "
            f"{_USE_INSTEAD}."
        )


def _real_extend_lens(extend_seq_lens_cpu) -> list:
    """Extend lengths of the real requests: the runner pads the capture batch
    (and replays) with zero-length request slots at the end."""
    lens = [int(n) for n in extend_seq_lens_cpu]
    while lens and lens[-1] == 0:
        lens.pop()
    return lens


def _track_rows(
    backend, forward_batch: ForwardBatch, lens: list
) -> Optional[KDAPrefillTrackRows]:
    """The eager track selection (MambaAttnBackendBase._init_track_ssm_indices,
    _init_track_conv_indices) as per-row lists."""
    if forward_batch.mamba_track_mask is None:
        return None
    n = len(lens)
    host = (
        forward_batch.mamba_prefill_track_mask_cpu,
        forward_batch.mamba_track_seqlens_cpu,
        forward_batch.extend_prefix_lens_cpu,
    )
    if all(v is not None and len(v) == n for v in host):
        mask, track_seq_lens, prefix_lens = (list(v) for v in host)
    else:  # the same host copies the eager path takes without CPU metadata
        mask = forward_batch.mamba_track_mask[:n].tolist()
        track_seq_lens = forward_batch.mamba_track_seqlens[:n].tolist()
        prefix_lens = forward_batch.extend_prefix_lens[:n].tolist()
    return build_track_rows(
        track_mask=mask,
        track_seq_lens=track_seq_lens,
        extend_seq_lens=lens,
        extend_prefix_lens=prefix_lens,
        state_chunk_size=backend.mamba_chunk_size,
        cache_chunk_size=mamba_cache_chunk_size(),
        conv_len=backend.conv_states_shape[-1],
        dst=backend._translate_mamba_indices(forward_batch.mamba_track_indices),
    )


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
