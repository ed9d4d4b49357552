# SPDX-License-Identifier: Apache-2.0
"""HybridLinearAttnBackend and its linear backends under full prefill CUDA graphs.

Fixes sglang/srt/layers/attention/hybrid_linear_attn_backend.py: the full prefill
runner plans a plain EXTEND out of graph through init_forward_metadata_out_graph,
which the linear side answers with _replay_metadata. That path only knows decode
and verify, and indexes per-batch-size buffers that only the decode runner
allocates (init_cuda_graph_state), so the first prefill capture fails with
``IndexError: list index out of range``. The Mamba2 extend (behind
MAMBA2_FULL_PREFILL_GRAPH) runs upstream's MambaMixer2 on per-bucket static
metadata planned here, with its prefix-cache snapshot copies made fixed-shape.
"""

from __future__ import annotations

import copy
import inspect

import torch

from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
    Mamba2AttnBackend,
)
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
from sglang.srt.layers.attention.linear.kernels.gdn_flashinfer import (
    FlashInferGDNKernel,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention.linear.gdn_backend import (
    prepare_full_prefill_graph_tables,
)
from sglang_graphfix.srt.layers.attention.linear.kda_backend import (
    prepare_kda_full_prefill_graph_tables,
)
from sglang_graphfix.srt.layers.attention.linear.kda_prefill_graph import (
    num_real_requests,
)
from sglang_graphfix.srt.layers.attention.linear.short_conv_backend import (
    prepare_short_conv_full_prefill_graph_tables,
)
from sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph import (
    TRACK_FINAL_STATE,
    TRACK_GRID_STATE,
    TRACK_RECOMPUTE_STATE,
    Mamba2FullGraphMetadata,
    full_prefill_graph_metadata,
)
from sglang_graphfix_kernel.masked_state_rows import snapshot_state_rows


# What:    Wraps HybridLinearAttnBackend.init_forward_metadata_out_graph for a
#          plain EXTEND on a GDN or KDA model, or a Mamba2 model under
#          MAMBA2_FULL_PREFILL_GRAPH (LFM2's short conv under
#          LFM2_FULL_PREFILL_GRAPH too): the full prefill graph's capture/replay.
# Why:     The linear side's _replay_metadata handles decode/verify only and
#          reads state_indices_list[bs - 1], which nothing has allocated when the
#          prefill graph captures (before the decode runner):
#          "IndexError: list index out of range".
# How:     Plan the full-attention side as before; give the linear side its own
#          per-graph tables (GDN: prepare_full_prefill_graph_tables; KDA:
#          upstream's breakable-graph tables, prepare_kda_full_prefill_graph_tables;
#          Mamba2: prepare_mamba2_full_prefill_graph_metadata, the forward
#          metadata upstream's MambaMixer2 extend runs on; LFM2:
#          prepare_short_conv_full_prefill_graph_tables, what its conv layers
#          read through conv_state_metadata), over the first request slots
#          only when the graph is a request bucket's (linear_request_rows).
#          Decode's per-batch-size buffers stay decode's. Every other mode and
#          backend, including Inkling's capturable sidecar, takes the upstream
#          path.
# Upstream: sglang/srt/layers/attention/hybrid_linear_attn_backend.py::HybridLinearAttnBackend.init_forward_metadata_out_graph
# Removal: once upstream plans linear-attention extend for full prefill graphs.
def linear_extend_tables_for_full_prefill_graph(
    original, self, forward_batch: ForwardBatch, in_capture: bool = False
):
    linear = self.linear_attn_backend
    mamba2 = (
        isinstance(linear, Mamba2AttnBackend) and capability.MAMBA2_FULL_PREFILL_GRAPH
    )
    short_conv = (
        capability.MAMBA2_FULL_PREFILL_GRAPH
        and capability.LFM2_FULL_PREFILL_GRAPH
        and capability.is_lfm2_short_conv(linear)
    )
    if not (
        (mamba2 or short_conv or isinstance(linear, (GDNAttnBackend, KDAAttnBackend)))
        and HybridLinearAttnBackend._is_plain_extend(forward_batch)
    ):
        return original(self, forward_batch, in_capture=in_capture)
    _plan_full_attention_extend(self.full_attn_backend, forward_batch, in_capture)
    forward_batch = linear_request_rows(self, forward_batch, in_capture=in_capture)
    if short_conv:
        prepare_short_conv_full_prefill_graph_tables(
            linear, forward_batch, in_capture=in_capture
        )
    elif mamba2:
        prepare_mamba2_full_prefill_graph_metadata(
            linear, forward_batch, in_capture=in_capture
        )
    elif isinstance(linear, KDAAttnBackend):
        prepare_kda_full_prefill_graph_tables(
            linear, forward_batch, in_capture=in_capture
        )
    else:
        prepare_full_prefill_graph_tables(linear, forward_batch, in_capture=in_capture)


# The request buckets of a full prefill graph, on the HybridLinearAttnBackend:
# per token bucket, the request counts below the runner's slots that also have a
# graph (set by the runner as it captures them), and the count whose graph is
# being captured (None: the graph over all slots).
REQUEST_BUCKETS = "graph_request_buckets"
CAPTURE_REQUEST_SLOTS = "capture_request_slots"


def capture_request_buckets(
    linear, num_tokens: int, slots: int, context_len: int | None = None
) -> tuple[int, ...]:
    """The request counts below ``slots`` for which the ``num_tokens`` bucket
    also captures a graph: on a Mamba2 backend, capability.mamba2_request_buckets
    (MAMBA2_REQUEST_BUCKETS up to REQUEST_BUCKET_MAX_TOKENS, one slot above up to
    MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS; those holding the capture batch's
    requests of at most ``context_len`` tokens); on a GDN backend whose prefill
    kernel is FlashInfer's, capability.gdn_request_buckets (one slot above
    REQUEST_BUCKET_MAX_TOKENS, GDN_SINGLE_REQUEST_GRAPHS); none for the other
    families and kernels (their padding request slots move no state)."""
    if isinstance(linear, Mamba2AttnBackend):
        return capability.mamba2_request_buckets(num_tokens, slots, context_len)
    if isinstance(linear, GDNAttnBackend) and isinstance(
        linear.kernel_dispatcher.extend_kernel, FlashInferGDNKernel
    ):
        return capability.gdn_request_buckets(num_tokens, slots, context_len)
    return ()


def single_request_graph_setting(linear) -> str:
    """The capability setting behind a family's graphs over one request slot
    above REQUEST_BUCKET_MAX_TOKENS (capture_request_buckets), for the log."""
    if isinstance(linear, GDNAttnBackend):
        return "GDN_SINGLE_REQUEST_GRAPHS"
    return "MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS"


def replay_request_slots(hybrid, num_tokens: int, requests: int) -> int | None:
    """The request slots of the graph a batch of ``requests`` replays in the
    ``num_tokens`` bucket: the smallest captured request bucket that holds it;
    None for the graph over all of the runner's slots. The runner picks its
    graph with the same call."""
    for slots in getattr(hybrid, REQUEST_BUCKETS, {}).get(num_tokens, ()):
        if requests <= slots:
            return slots
    return None


_REQUEST_AXIS = (
    "req_pool_indices", "seq_lens", "seq_lens_cpu", "orig_seq_lens",
    "extend_seq_lens", "extend_prefix_lens", "extend_start_loc",
    "extend_seq_lens_cpu", "extend_prefix_lens_cpu", "mamba_track_mask",
    "mamba_track_indices", "mamba_track_seqlens", "mamba_prefill_track_mask_cpu",
    "mamba_track_seqlens_cpu",
)  # fmt: skip


def linear_request_rows(hybrid, forward_batch, *, in_capture: bool):
    """The linear side's view of the runner's slot-padded batch: the batch
    itself, or, under a request bucket's graph, its first request slots (the
    requests, then zero-length padding), with batch_size set to them. The
    full-attention side keeps every slot."""
    if not getattr(
        hybrid, CAPTURE_REQUEST_SLOTS if in_capture else REQUEST_BUCKETS, None
    ):
        return forward_batch  # no request buckets (as upstream)
    requests = num_real_requests(forward_batch.extend_seq_lens_cpu)
    bucket = forward_batch.input_ids.shape[0]
    slots = (
        getattr(hybrid, CAPTURE_REQUEST_SLOTS)
        if in_capture
        else replay_request_slots(hybrid, bucket, requests)
    )
    if slots is None:
        return forward_batch
    if requests > slots:
        raise RuntimeError(
            f"Full prefill graph: the {bucket}-token capture batch holds "
            f"{requests} requests, more than the {slots} request slots of the "
            "request bucket being captured"
        )
    view = copy.copy(forward_batch)
    view.batch_size = slots
    for name in _REQUEST_AXIS:
        value = getattr(forward_batch, name, None)
        if value is not None:
            setattr(view, name, value[:slots])
    return view


def prepare_mamba2_full_prefill_graph_metadata(
    backend, forward_batch: ForwardBatch, *, in_capture: bool
) -> Mamba2FullGraphMetadata:
    """The bucket's Mamba2FullGraphMetadata, refilled and set as the backend's
    forward metadata (Mamba2AttnBackend.forward hands it to MambaMixer2); the
    capability model asserts first at capture."""
    if in_capture:
        capability.require_capturable_full_prefill_graph(backend)
    return full_prefill_graph_metadata(backend, forward_batch, in_capture=in_capture)


# What:    Wraps MambaAttnBackendBase._track_mamba_state_extend: on a Mamba2
#          full prefill graph's metadata, snapshot the bucket's K track rows'
#          SSM states with one fixed-shape select and one scatter.
# Why:     Upstream copies through index lists whose lengths are the batch's
#          tracked rows per kind (track_ssm_h_src / _recompute_dst / _final_src,
#          built on the host, guarded by .numel() > 0), which a graph captured
#          for every batch of the bucket cannot hold.
# How:     Per track row (Mamba2PrefillTrackTables: the tracked request slots
#          packed first, mode per row): the post-extend state (mode final), the
#          chunk-grid state h[h_src] (grid) or the recomputed state (recompute,
#          the SSD's row), written to its track slot; filler rows write the
#          reserved padding slot 0 (with MAMBA2_SNAPSHOT_KERNEL, one launch of
#          sgl-kernel's snapshot_state_rows instead, whose filler rows write
#          nothing). A bucket without track rows (under one
#          mamba cache chunk: sglang tracks no request there, checked on the
#          host at replay) copies nothing. Any other metadata takes the
#          upstream path.
# Upstream: sglang/srt/layers/attention/hybrid_linear_attn_backend.py::MambaAttnBackendBase._track_mamba_state_extend
# Removal: once upstream captures the Mamba2 extend in a full prefill graph.
def snapshot_mamba2_states_on_graph_tables(
    original, self, forward_batch, h, ssm_states, forward_metadata, *args, **kwargs
):
    if not isinstance(forward_metadata, Mamba2FullGraphMetadata):
        return original(
            self, forward_batch, h, ssm_states, forward_metadata, *args, **kwargs
        )
    track = forward_metadata.track
    if track is None:
        return
    track_states = kwargs.get("track_states", args[0] if args else None)
    if capability.MAMBA2_SNAPSHOT_KERNEL:
        snapshot_state_rows(
            ssm_states, track.dst, track.mode,
            cache_slots=forward_metadata.tables.cache_indices, src=track.src,
            grid=h[0], grid_rows=track.h_src, recomputed=track_states[0],
            modes=(TRACK_FINAL_STATE, TRACK_GRID_STATE, TRACK_RECOMPUTE_STATE),
        )  # fmt: skip
        return
    slots = forward_metadata.tables.cache_indices.to(torch.int64)[track.src]

    def rows(mode):
        return (track.mode == mode)[:, None, None, None]

    dtype = ssm_states.dtype
    snapshot = torch.where(
        rows(TRACK_FINAL_STATE),
        ssm_states[slots],
        torch.where(
            rows(TRACK_GRID_STATE),
            h[0, track.h_src].to(dtype),
            track_states[0].to(dtype),
        ),
    )
    ssm_states[track.dst] = snapshot


def _plan_full_attention_extend(full_attn_backend, forward_batch, in_capture):
    """The full-attention child's plan, with the backend and the way out named
    when it has no full prefill graph path (FlashInfer MLA, for one, raises
    ``Invalid mode`` for EXTEND)."""
    try:
        full_attn_backend.init_forward_metadata_out_graph(
            forward_batch, in_capture=in_capture
        )
    except ValueError as exc:
        if not in_capture:
            raise
        raise ValueError(
            f"Full prefill CUDA graph: the full-attention backend "
            f"{type(full_attn_backend).__name__} could not plan a plain extend "
            f"({exc}). Use an attention backend with full prefill graph support "
            "(e.g. --attention-backend fa3 for MLA models such as Kimi-Linear) "
            "or --cuda-graph-backend-prefill breakable."
        ) from exc


# What:    Wraps MambaAttnBackendBase.init_cuda_graph_state: allocate once, and
#          answer later calls that the allocation covers without touching it.
# Why:     Upstream appends to its per-batch-size lists and reassigns its
#          buffers on every call, and only the decode runner calls it. Once the
#          full prefill runner also allocates (before it captures), the decode
#          runner's call would double the lists and move buffers that captured
#          graphs point to.
# How:     The first call runs upstream's allocation and records its bounds
#          (max_bs, tokens per request); a later call within them returns; one
#          beyond them raises, naming both.
# Upstream: sglang/srt/layers/attention/hybrid_linear_attn_backend.py::MambaAttnBackendBase.init_cuda_graph_state
# Removal: once upstream's init_cuda_graph_state is idempotent.
def init_linear_graph_state_once(original, self, max_bs: int, max_num_tokens: int):
    bounds = getattr(self, "graph_state_bounds", None)
    if bounds is None:
        original(self, max_bs, max_num_tokens)
        self.graph_state_bounds = (max_bs, max_num_tokens // max_bs)
        return
    allocated_bs, tokens_per_req = bounds
    if max_bs <= allocated_bs and max_num_tokens == max_bs * tokens_per_req:
        return
    raise RuntimeError(
        f"{type(self).__name__}.init_cuda_graph_state(max_bs={max_bs}, "
        f"max_num_tokens={max_num_tokens}): the CUDA-graph state was already "
        f"allocated for max_bs={allocated_bs} with {tokens_per_req} token(s) per "
        "request, and graphs captured since read those buffers; reallocating "
        "them would leave those graphs on freed memory."
    )


# What:    Wraps MambaAttnBackendBase._replay_metadata: a batch size without
#          allocated CUDA-graph state raises a RuntimeError that says so.
# Why:     Upstream indexes state_indices_list[bs - 1] unchecked, so a capture
#          or replay before init_cuda_graph_state (the reported full prefill
#          crash) fails with a bare "IndexError: list index out of range".
# How:     Check the list length, then call the original unchanged (decode and
#          verify replays take exactly the upstream path).
# Upstream: sglang/srt/layers/attention/hybrid_linear_attn_backend.py::MambaAttnBackendBase._replay_metadata
# Removal: once upstream checks its per-batch-size buffers.
def replay_metadata_requires_graph_state(original, self, bs: int, *args, **kwargs):
    allocated = len(self.state_indices_list)
    if bs > allocated:
        raise RuntimeError(
            f"{type(self).__name__}: no CUDA-graph state for batch size {bs}: "
            f"init_cuda_graph_state has allocated {allocated} per-batch-size "
            f"buffer(s); it must run with max_bs >= {bs} before a graph captures "
            "or replays this batch size."
        )
    return original(self, bs, *args, **kwargs)


# What:    Wraps HybridLinearAttnBackend.__init__: expose the full-attention
#          child's chunked-prefix full prefill graph support on the wrapper.
# Why:     On an MLA hybrid (Kimi-Linear) with a chunked-prefix backend (fa3),
#          the full prefill runner captures its cached-prefix variants and
#          asserts the wrapper supports them; the wrapper keeps the base's False,
#          so the runner dies at init. Without those variants, a batch with a
#          cached prefix would replay a graph captured without one.
# How:     After the original, copy the child's flag and route
#          prepare_full_cuda_graph_chunked_prefix to it (as upstream's
#          InklingShortConvHybridAttnBackend does); subclasses that define their
#          own are left alone.
# Upstream: sglang/srt/layers/attention/hybrid_linear_attn_backend.py::HybridLinearAttnBackend.__init__
# Removal: once upstream's HybridLinearAttnBackend forwards both.
def expose_full_attn_chunked_prefix_capture(original, self, *args, **kwargs):
    original(self, *args, **kwargs)
    full = self.full_attn_backend
    own = inspect.getattr_static(type(self), "supports_full_cuda_graph_chunked_prefix")
    if isinstance(own, bool) and full.supports_full_cuda_graph_chunked_prefix:
        self.supports_full_cuda_graph_chunked_prefix = True
        self.prepare_full_cuda_graph_chunked_prefix = (
            full.prepare_full_cuda_graph_chunked_prefix
        )
