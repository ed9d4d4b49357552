# SPDX-License-Identifier: Apache-2.0
"""GDN extend captured inside full prefill CUDA graphs.

Sibling of sglang/srt/layers/attention/linear/kda_prefill_graph.py, for GDN.

The eager GDN extend sizes its launches from host-side data: ``causal_conv1d_fn``
takes ``seq_lens_cpu`` and the FLA chunk kernels build ``chunk_indices`` with a
``.tolist()`` (``prepare_chunk_indices``), whose ``tensor_cache`` would also replay
capture-time values. A full prefill graph records one launch per token bucket,
so every launch here reads the static tables of ``KDAPrefillGraphMetadata``
instead: the same delta-rule chunk size (64) and conv blocks, refilled before
each replay. Padded table rows point past their sequence or carry
``PAD_SLOT_ID`` and do no work; tokens past the batch belong to no sequence and
their output rows stay zero.

The delta rule runs on the prefill kernel the backend was built with: sglang's
Triton chunk kernels on the tables, or -- where FLASHINFER_GDN_CAPTURE_SM lets
the backend keep sglang's Hopper default -- FlashInfer's GDN prefill, which
takes ``cu_seqlens`` on the device and sizes its launch from tensor shapes; its
per-row states move from and to the pool for the rows with a request only
(sgl-kernel's masked_state_rows), not for every request slot of the bucket. It
picks its algorithm (context-parallel or not) from the number of sequences,
here the table's request slots, so a replay may run the other algorithm than an
eager batch of fewer requests (a graph over one request slot,
GDN_SINGLE_REQUEST_GRAPHS, runs eager's for one request). It also loads whole
64-token tiles and masks them by multiplying, so the token rows past the batch
that its tiles reach (which no conv block writes) are zeroed before it. The
delta-rule kernels are sglang's (and FlashInfer's) own; only their table
arguments change. The prefix-cache snapshot of tracked rows is sglang's
kda_track_ssm_state on one gathered chunk state per table row, or one launch of
sgl-kernel's snapshot_state_rows that reads the tracked rows' chunk states
where they lie (GDN_TRACK_SNAPSHOT_KERNEL).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import triton

from sglang.kernels.ops.attention.fla.chunk_delta_h import (
    CHUNK_SIZE,
    chunk_gated_delta_rule_fwd_h,
)
from sglang.kernels.ops.attention.fla.chunk_fwd import chunk_gated_delta_rule_fwd_intra
from sglang.kernels.ops.attention.fla.chunk_o import chunk_fwd_kernel_o
from sglang.kernels.ops.attention.fla.cumsum import chunk_local_cumsum
from sglang.kernels.ops.attention.fla.l2norm import (
    gdn_prefill_qkv_prepare_fwd,
    l2norm_fwd,
)
from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating
from sglang.kernels.ops.attention.triton_gdn_fused_proj import (
    fused_qkv_split_gdn_prefill,
)
from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_fn
from sglang.kernels.ops.mamba.kda_prefill_track import (
    TRACK_CHUNK_STATE,
    TRACK_FINAL_STATE,
    TRACK_NONE,
    kda_track_ssm_state,
)
from sglang.srt.layers.attention.linear.gdn_backend import (
    MAX_FUSED_QKV_SPLIT_DIM,
    GDNKernelDispatcher,
)
from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDA_CHUNK_SIZE,
    KDAPrefillGraphMetadata,
)
from sglang.srt.layers.attention.linear.kernels.gdn_flashinfer import (
    FlashInferGDNKernel,
)
from sglang.srt.layers.attention.linear.utils import (
    LinearAttnBackends,
    LinearAttnKernelBackend,
)
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix_kernel.masked_state_rows import (
    gather_state_rows,
    scatter_state_rows,
    snapshot_state_rows,
)

# The tables are KDA's; they describe GDN's chunking only because both use the
# FLA delta-rule chunk of 64 tokens.
assert KDA_CHUNK_SIZE == CHUNK_SIZE, (KDA_CHUNK_SIZE, CHUNK_SIZE)

# The rows a tile of FlashInfer's SM90 GDN prefill loads (its varlen_helper.BLK;
# both its plain kernel and its context-parallel pipeline load 64-row tiles from
# each sequence's start): how far past the batch it reads.
FLASHINFER_GDN_TILE_ROWS = 64

# Untracked rows of a snapshot scatter land in the reserved mamba padding slot.
_PADDING_SLOT = 0
# snapshot_state_rows' recompute mode, which GDN never uses: no track row has
# it (kda_prefill_track's modes are 0, 1 and 2).
_UNUSED_RECOMPUTE_MODE = -1


class GDNForwardTables(NamedTuple):
    """What a captured GDN extend derives from the bucket's tables, the same for
    every layer of one forward (None where its kernel or bucket needs none)."""

    past: torch.Tensor | None  # [tokens] bool, rows_past_batch (FlashInfer)
    reach_rows: torch.Tensor | None  # kernel_reach_rows (FlashInfer, reach-only)
    reach_past: torch.Tensor | None
    cu_seqlens: torch.Tensor | None  # int64 (FlashInfer)
    checkpoint_starts: torch.Tensor | None  # FlashInfer, a bucket with snapshots
    conv_rows: torch.Tensor | None  # conv_window_rows (tracking buckets)
    conv_dst: torch.Tensor | None
    ssm_rows: torch.Tensor | None  # each table row's chunk state to track
    track_src: torch.Tensor | None  # arange(rows) (GDN_TRACK_SNAPSHOT_KERNEL)


def build_forward_tables(
    meta, *, flashinfer: bool, conv_window: int, device
) -> GDNForwardTables:
    """GDNForwardTables for ``meta``: a few small device ops on its tables (31
    with FlashInfer's prefill and prefix-cache tracking, 14 with Triton's)."""
    num_checkpoints = flashinfer_num_checkpoints(meta)
    past = reach_rows = reach_past = cu_seqlens = starts = None
    conv_rows = conv_dst = ssm_rows = track_src = None
    if flashinfer:
        past = rows_past_batch(meta)
        if capability.GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY:
            reach_rows, reach_past = kernel_reach_rows(meta, meta.num_tokens)
        cu_seqlens = meta.cu_seqlens.to(torch.int64)
        if num_checkpoints:
            starts = flashinfer_checkpoint_starts(meta.cu_seqlens)
    if meta.track:
        conv_rows, conv_dst = conv_window_rows(meta, conv_window, device)
        if flashinfer and num_checkpoints:
            # A tracked state before a row's first chunk has no snapshot:
            # sglang's eager FlashInfer plan raises there; fail as loudly (before
            # any layer's copy), never copy another row's state into the prefix
            # cache.
            torch._assert_async(
                (
                    (meta.track_mode != TRACK_CHUNK_STATE) | (meta.track_chunk_idx > 0)
                ).all()
            )
            ssm_rows = flashinfer_checkpoint_rows(meta, num_checkpoints, starts)
        elif not flashinfer:
            ssm_rows = chunk_state_rows(meta, meta.chunk_indices.shape[0])
        if capability.GDN_TRACK_SNAPSHOT_KERNEL:
            track_src = torch.arange(meta.track_mode.shape[0], device=device)
    return GDNForwardTables(
        past, reach_rows, reach_past, cu_seqlens, starts, conv_rows, conv_dst,
        ssm_rows, track_src,
    )  # fmt: skip


class ForwardTablesMemo:
    """GDNForwardTables built once per forward (GDN_TABLES_ONCE_PER_FORWARD), by
    the first GDN layer that asks for a bucket's tables; every later forward of
    the capture (the warm-ups, the recorded one) runs that layer first too, so
    each builds its own and a replay rebuilds them from the refilled tables
    before any other layer reads them. In graph, rather than where the tables
    are refilled: that is host work before every replay (issue 13's host-time
    goal), these are device ops once a replay. A layer that reads twice without
    the builder rebuilding in between (the forward's first GDN layer changed),
    or asks for tables built another way, raises instead of reading stale ones.
    One memo per capture (prepare_full_prefill_graph_tables); entries per
    tables object."""

    def __init__(self):
        # id(meta) -> [meta (held, so that its id stays its own), build spec,
        # builder's layer id, tables, readers since the build]
        self._built = {}

    def get(self, meta, layer_id, spec, build) -> GDNForwardTables:
        entry = self._built.get(id(meta))
        if entry is None or entry[2] == layer_id:
            entry = [meta, spec, layer_id, build(), set()]
            self._built[id(meta)] = entry
        elif entry[1] != spec:
            raise RuntimeError(
                f"GDN layer {layer_id} asks for its forward's tables built as "
                f"{spec}; layer {entry[2]} built them as {entry[1]}"
            )
        elif layer_id in entry[4]:
            raise RuntimeError(
                f"GDN layer {layer_id} reads its forward's tables twice without "
                f"layer {entry[2]}, which built them, rebuilding them: the "
                "forward's first GDN layer changed"
            )
        else:
            entry[4].add(layer_id)
        return entry[3]


def gdn_extend_in_graph(
    *,
    layer,
    meta: KDAPrefillGraphMetadata,
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    extend_kernel=None,
    forward_tables: ForwardTablesMemo | None = None,
) -> torch.Tensor:
    """GDNAttnBackend.forward_extend (plain extend) with launch grids that depend
    only on the bucket. ``conv_states`` / ``ssm_states`` are the layer's
    [slots, dim, kernel-1] and [slots, H, V, K] pools; ``extend_kernel`` is the
    backend's prefill kernel (its dispatcher's extend_kernel; None: Triton);
    ``forward_tables`` the capture's GDNForwardTables, None to build them here.
    Returns [1, num_tokens, H, V]."""
    flashinfer = isinstance(extend_kernel, FlashInferGDNKernel)
    spec = dict(flashinfer=flashinfer, conv_window=conv_states.shape[-1])

    def build():
        return build_forward_tables(meta, **spec, device=mixed_qkv.device)

    if forward_tables is None:
        tables = build()
    else:
        tables = forward_tables.get(meta, layer.layer_id, spec, build)
    if meta.track:
        # Before the conv kernel shifts the cache; the windows come from the raw input.
        _snapshot_conv_windows(conv_states, mixed_qkv, tables)

    x = causal_conv1d_fn(
        mixed_qkv.transpose(0, 1),
        layer.conv_weights,
        layer.bias,
        conv_states=conv_states,
        query_start_loc=meta.cu_seqlens,
        seq_lens_cpu=None,
        cache_indices=meta.cache_indices,
        has_initial_state=meta.has_initial_state,
        activation=layer.activation,
        block_table=meta.conv_block_table,
    ).transpose(0, 1)
    if flashinfer:
        if tables.reach_rows is not None:
            zero_rows_in_kernel_reach(x, tables.reach_rows, tables.reach_past)
        else:
            x = x.masked_fill(tables.past.unsqueeze(-1), 0)

    if layer.q_dim + layer.k_dim + layer.v_dim <= MAX_FUSED_QKV_SPLIT_DIM:
        q, k, v = fused_qkv_split_gdn_prefill(
            x,
            layer.num_q_heads,
            layer.num_k_heads,
            layer.num_v_heads,
            layer.head_q_dim,
            layer.head_k_dim,
            layer.head_v_dim,
        )
    else:
        q, k, v = (
            t.reshape(1, x.shape[0], heads, dim).contiguous()
            for t, heads, dim in zip(
                x.split([layer.q_dim, layer.k_dim, layer.v_dim], dim=-1),
                (layer.num_q_heads, layer.num_k_heads, layer.num_v_heads),
                (layer.head_q_dim, layer.head_k_dim, layer.head_v_dim),
            )
        )
    g, beta = fused_gdn_gating(layer.A_log, a, b, layer.dt_bias)

    if flashinfer:
        o, checkpoints = flashinfer_delta_rule_on_tables(
            extend_kernel, q, k, v, g, beta, ssm_states, meta, tables
        )
        if meta.track:
            _snapshot_ssm_states(ssm_states, checkpoints, meta, tables, flashinfer=True)
        return o
    o, h = chunk_gated_delta_rule_on_tables(q, k, v, g, beta, ssm_states, meta)
    if meta.track:
        _snapshot_ssm_states(ssm_states, h, meta, tables)
    return o


def rows_past_batch(meta) -> torch.Tensor:
    """[num_tokens] bool: the bucket's token rows that belong to no sequence."""
    return meta.token_index >= meta.num_logical_tokens


def zero_rows_in_kernel_reach(x: torch.Tensor, rows, past) -> None:
    """Zero, in place, the rows of ``x`` [num_tokens, dim] past the batch that
    FlashInfer's GDN prefill loads: it reads whole tiles of
    FLASHINFER_GDN_TILE_ROWS from each sequence's start, so the last sequence's
    last tile reaches at most FLASHINFER_GDN_TILE_ROWS - 1 rows past the batch,
    and the bucket's padding sequences (no tokens) all start where the batch
    ends. Rows further on are never read and keep whatever they held. Fixed
    shape: FLASHINFER_GDN_TILE_ROWS row indices from the on-device batch length,
    clamped to the bucket's last row. Indices the clamp repeats always carry
    equal values, so the order of the copies does not matter: zero where the
    bucket's last row is past the batch, its own value (written back unchanged)
    where the batch fills the bucket. ``rows``, ``past``: kernel_reach_rows'."""
    x.index_copy_(0, rows, x[rows].masked_fill(past, 0))


def kernel_reach_rows(meta, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The FLASHINFER_GDN_TILE_ROWS row indices from the batch's end, clamped to
    the last of ``num_rows``, and [rows, 1] which of them are past the batch."""
    end = meta.num_logical_tokens.to(torch.int64)
    offsets = torch.arange(
        FLASHINFER_GDN_TILE_ROWS, device=end.device, dtype=torch.int64
    )
    rows = (end + offsets).clamp(max=num_rows - 1)
    return rows, (rows >= end).unsqueeze(-1)


def flashinfer_delta_rule_on_tables(kernel, q, k, v, g, beta, ssm_states, meta, tables):
    """FlashInferGDNKernel.extend's SM90 prefill (GDNAttnBackend's call; the
    only FlashInfer prefill the graph captures, FLASHINFER_GDN_CAPTURE_SM) on the
    bucket's tables, written here rather than called because the extend moves the
    SSM states of every request slot (below); the same kernel inputs for the
    real rows: l2-normalised q/k, alpha = exp(g) and beta in fp32, int64
    cu_seqlens, fp32 states.
    Tokens past the batch (``tables.past``, rows_past_batch: q/k/v zeroed by
    the caller, gates here) keep zero output rows.

    The states move between the pool and the kernel's per-row buffers only for
    rows with a request (masked_state_rows), not for every request slot of the
    bucket as the extend's ``ssm_states[indices]`` / ``index_copy_`` would: a
    padding row (slot -1) is a zero-length sequence, whose state the kernel
    neither reads nor writes, so its buffer rows stay unset and nothing is
    written back for it; the reserved padding slot's SSM state (which sglang's
    padded decode rows read) is never written. (On a bucket that snapshots states
    for the prefix cache, untracked rows' conv-window snapshots still land in the
    padding slot's conv state, as before.)

    With prefix-cache tracking, the kernel snapshots every 64-token chunk
    boundary into a buffer sized by the bucket, located per row by on-device
    starts: bucket/64 fp32 states per layer on every replay of a tracking bucket,
    where eager takes them only for a batch with a tracked row. Returns
    (o, checkpoints [1, n, H, V, K] or None)."""
    pad = tables.past.view(1, -1, 1)
    g, beta = g.masked_fill(pad, 0), beta.masked_fill(pad, 0)
    num_checkpoints = flashinfer_num_checkpoints(meta)
    slots = meta.cache_indices
    initial = ssm_states.new_empty(
        (slots.shape[0], *ssm_states.shape[1:]), dtype=torch.float32
    )
    gather_state_rows(ssm_states, slots, initial)
    checkpoints = None
    if num_checkpoints:
        checkpoints = initial.new_empty((num_checkpoints, *initial.shape[1:]))
    q, k, v = gdn_prefill_qkv_prepare_fwd(q[0], k[0], v[0])
    o, final = kernel._prefill_fn(
        q=q,
        k=k,
        v=v,
        g=torch.exp(g[0].to(torch.float32)),
        beta=beta[0].to(torch.float32),
        scale=None,
        initial_state=initial,
        output_final_state=True,
        cu_seqlens=tables.cu_seqlens,
        use_qk_l2norm_in_kernel=False,
        output=torch.zeros_like(v),
        output_state=torch.empty_like(initial),
        state_checkpoints=checkpoints,
        checkpoint_cu_starts=tables.checkpoint_starts,
        checkpoint_every_n_tokens=CHUNK_SIZE if num_checkpoints else 0,
    )
    scatter_state_rows(ssm_states, slots, final)
    if checkpoints is not None:
        checkpoints = checkpoints.unsqueeze(0)
    return o.unsqueeze(0), checkpoints


def flashinfer_num_checkpoints(meta) -> int:
    """FlashInfer's chunk-boundary snapshots a replay of the bucket takes: one
    every 64 tokens of the bucket where it tracks (any replay may), else none."""
    return meta.num_tokens // CHUNK_SIZE if meta.track else 0


def flashinfer_checkpoint_starts(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per row, the index of its first FlashInfer chunk-boundary snapshot: the
    exclusive prefix sum of floor(len / 64) (as sglang's eager checkpoint plan
    builds it on the host), computed on the device."""
    counts = torch.diff(cu_seqlens.to(torch.int64)) // CHUNK_SIZE
    return torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))


def chunk_gated_delta_rule_on_tables(q, k, v, g, beta, ssm_states, meta):
    """chunk_gated_delta_rule (qk l2norm in kernel, states updated in place) with
    every varlen launch reading ``meta``'s chunk tables. Returns (o, h)."""
    scale = k.shape[-1] ** -0.5
    q, k = l2norm_fwd(q), l2norm_fwd(k)
    cu_seqlens, chunk_indices = meta.cu_seqlens, meta.chunk_indices
    g = chunk_local_cumsum(
        g, chunk_size=CHUNK_SIZE, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices
    )
    w, u, _ = chunk_gated_delta_rule_fwd_intra(
        k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices
    )
    h, v_new = chunk_gated_delta_rule_fwd_h(
        k=k,
        w=w,
        u=u,
        g=g,
        initial_state=ssm_states,
        initial_state_indices=meta.cache_indices,
        cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices,
        chunk_offsets=meta.chunk_offsets,
    )
    # chunk_fwd_o has no chunk_indices argument (it derives them on the host),
    # so launch its kernel on the table: one program per (V block, chunk row, head).
    _, T, Hg, K = q.shape
    H, V = v_new.shape[-2], v_new.shape[-1]
    o = torch.zeros_like(v_new)
    block_v = 64
    chunk_fwd_kernel_o[(triton.cdiv(V, block_v), meta.max_chunks, H)](
        q=q,
        k=k,
        v=v_new,
        h=h,
        g=g,
        o=o,
        cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices,
        scale=scale,
        T=T,
        H=H,
        Hg=Hg,
        K=K,
        V=V,
        BT=CHUNK_SIZE,
        BK=128,
        BV=block_v,
        USE_G=True,
        IS_VARLEN=True,
        num_warps=4,
        num_stages=2,
    )
    return o, h


def conv_window_rows(meta, window: int, device) -> tuple:
    """Per table row: the token rows of its conv-window snapshot (eager GDN:
    start + arange(window) clamped to the batch's tokens) and its destination
    slot (the padding slot for untracked rows)."""
    offsets = torch.arange(window, device=device, dtype=torch.int64)
    rows = meta.track_conv_start.to(torch.int64).unsqueeze(1) + offsets
    last = meta.num_logical_tokens.to(torch.int64) - 1
    rows = torch.minimum(rows.clamp(min=0), last)
    dst = torch.where(meta.track_mode != TRACK_NONE, meta.track_dst, _PADDING_SLOT)
    return rows, dst


def chunk_state_rows(meta, num_chunk_rows: int) -> torch.Tensor:
    """Per table row: the row of ``h`` (per-chunk states, sequence-major) holding
    the state at its tracked chunk boundary (eager GDN's track_ssm_h_src)."""
    first_chunk = meta.chunk_offsets[:-1].to(torch.int64)
    rows = first_chunk + meta.track_chunk_idx.clamp(min=0)
    return rows.clamp(max=num_chunk_rows - 1)


def flashinfer_checkpoint_rows(meta, num_checkpoints: int, starts) -> torch.Tensor:
    """Per table row: the FlashInfer snapshot holding the state at its tracked
    chunk boundary. Triton's ``h`` names the state before chunk c, FlashInfer
    snapshots after each chunk: c - 1 (sglang's eager checkpoint plan).
    ``starts``: flashinfer_checkpoint_starts' result."""
    first = starts[:-1]
    rows = first + meta.track_chunk_idx.to(torch.int64) - 1
    return rows.clamp(min=0, max=num_checkpoints - 1)


def _snapshot_conv_windows(conv_states, mixed_qkv, tables) -> None:
    """Eager GDN: conv_states[dst] = mixed_qkv[window rows].T per tracked row
    (conv_window_rows, in ``tables``)."""
    rows, dst = tables.conv_rows, tables.conv_dst
    conv_states[dst] = mixed_qkv[rows].transpose(1, 2).to(conv_states.dtype)


def _snapshot_ssm_states(ssm_states, h, meta, tables, flashinfer: bool = False) -> None:
    """Eager GDN tracks the per-chunk state at the row's last chunk boundary
    (Triton's bf16 ``h``, FlashInfer's fp32 snapshots), or the final state of
    chunk-aligned rows; kda_track_ssm_state does the per-row copy on a grid fixed
    by the table. Without snapshots (a bucket under one chunk) no row tracks a
    chunk state, so the chunk source is a placeholder. The rows of ``h`` to
    track are ``tables.ssm_rows`` (flashinfer_checkpoint_rows, chunk_state_rows)."""
    if h is None:
        h_track = ssm_states.new_empty((meta.max_seqs, *ssm_states.shape[1:]))
    else:
        # The rows were built for this many chunk states: FlashInfer's snapshots
        # every 64 tokens of the bucket, Triton's one per chunk row
        # (chunk_gated_delta_rule_fwd_h's NT = len(chunk_indices) with cu_seqlens).
        assert h.shape[1] == (
            flashinfer_num_checkpoints(meta)
            if flashinfer
            else meta.chunk_indices.shape[0]
        ), (h.shape, meta.num_tokens, meta.chunk_indices.shape)
        if capability.GDN_TRACK_SNAPSHOT_KERNEL:
            snapshot_chunk_states(
                ssm_states, h[0], tables.ssm_rows, meta, tables.track_src
            )
            return
        h_track = h[0].index_select(0, tables.ssm_rows)
    kda_track_ssm_state(
        ssm_pool=ssm_states,
        h_track=h_track,
        track_mode=meta.track_mode,
        track_dst=meta.track_dst,
        cache_indices=meta.cache_indices,
    )


def snapshot_chunk_states(ssm_states, chunk_states, rows, meta, src) -> None:
    """kda_track_ssm_state's copies in one launch of sgl-kernel's
    snapshot_state_rows (GDN_TRACK_SNAPSHOT_KERNEL), a tracked row reading its
    chunk state at ``rows[r]`` of ``chunk_states`` [n, H, V, K] itself: the
    index_select of one state per table row before sglang's kernel is skipped, so
    untracked and padding rows move nothing. Same modes and sources: a
    chunk-aligned row's final state from its cache slot, the others' chunk state,
    cast to the pool's dtype, into the row's track slot. ``src``: arange(rows)."""
    num_rows = meta.track_mode.shape[0]
    snapshot_state_rows(
        ssm_states,
        meta.track_dst,
        meta.track_mode,
        cache_slots=meta.cache_indices,
        src=src,
        grid=chunk_states,
        grid_rows=rows,
        # GDN recomputes no state: a mode no row has, and a source never read.
        recomputed=ssm_states[:1].expand(num_rows, *ssm_states.shape[1:]),
        modes=(TRACK_FINAL_STATE, TRACK_CHUNK_STATE, _UNUSED_RECOMPUTE_MODE),
    )


def use_default_eager_gdn_prefill(linear, model_runner, default: str) -> None:
    """Eager GDN extends -- the prefill batches a full prefill graph does not
    take -- on the kernel sglang picks by default (``default``, e.g. FlashInfer
    on SM90/SM100): sglang's own dispatcher for that choice. Captured extends are
    unaffected: the graphs hold the Triton kernels the dispatcher had at capture,
    on the same [slots, HV, V, K] state pool the FlashInfer kernel uses."""
    backends = linear.linear_attn_backends
    resolved = LinearAttnBackends(
        decode=backends.decode,
        prefill=LinearAttnKernelBackend(default),
        verify=backends.verify,
    )
    linear.kernel_dispatcher = GDNKernelDispatcher(
        resolved.decode, resolved.prefill, resolved.verify
    )
    linear.linear_attn_backends = resolved
    if getattr(model_runner, "linear_attn_backends", None) is backends:
        model_runner.linear_attn_backends = resolved


def warm_eager_gdn_prefill(linear) -> None:
    """Run the eager extend kernel on scratch state, so that what it builds on
    first use is built at startup, not on a user's batch the graph does not take
    (on a fresh H200 such a batch waited 7 s). FlashInfer's GDN prefill picks a
    context-parallel kernel for few sequences and its plain one for many
    (flashinfer's should_use_cp_host), each with and without the prefix-cache
    snapshots: a batch of one request and one of many, each both ways. This
    rank's head layout; touches no pool slot."""
    cache = linear.req_to_token_pool.mamba_pool.mamba_cache
    num_v_heads, v_dim, k_dim = cache.temporal.shape[-3:]
    conv_dim = linear.conv_states_shape[-2]  # q + k + v channels
    num_k_heads = (conv_dim - num_v_heads * v_dim) // (2 * k_dim)
    device, dtype = cache.temporal.device, linear_prefill_activation_dtype(linear)
    few = (70,)  # one request over a 64-token chunk
    heads = max(num_k_heads, num_v_heads)  # flashinfer's parallel work per sequence
    many = (3,) * (_plain_kernel_sequences(heads, device) - 1) + (70,)
    for lens in (few, many):
        tokens = sum(lens)
        cu_seqlens = torch.tensor(
            [0, *itertools.accumulate(lens)], device=device, dtype=torch.int32
        )

        def randn(*shape):
            return torch.randn(1, tokens, *shape, device=device, dtype=dtype) * 0.1

        for snapshots in (False, True):
            checkpoints = {}
            if snapshots:  # every 64 tokens, as a prefix-cache tracking batch
                checkpoints = dict(
                    state_checkpoint_cu_starts=flashinfer_checkpoint_starts(cu_seqlens),
                    num_state_checkpoints=sum(n // CHUNK_SIZE for n in lens),
                    state_checkpoint_every_n_tokens=CHUNK_SIZE,
                )
            linear.kernel_dispatcher.extend_kernel.extend(
                randn(num_k_heads, k_dim),
                randn(num_k_heads, k_dim),
                randn(num_v_heads, v_dim),
                -torch.rand(1, tokens, num_v_heads, device=device, dtype=torch.float32),
                torch.rand(1, tokens, num_v_heads, device=device, dtype=dtype),
                ssm_states=torch.zeros(
                    (len(lens), num_v_heads, v_dim, k_dim),
                    device=device,
                    dtype=cache.temporal.dtype,
                ),
                cache_indices=torch.arange(len(lens), device=device, dtype=torch.int32),
                query_start_loc=cu_seqlens,
                **checkpoints,
            )


def _plain_kernel_sequences(heads: int, device, most: int = 64) -> int:
    """The fewest sequences (at least 4) for which FlashInfer's GDN prefill takes
    its plain, not context-parallel, kernel on this GPU; ``most`` where its rule
    cannot be asked or picks the plain kernel for none below it."""
    try:
        from flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper import (
            should_use_cp_host,
        )
        from flashinfer.utils import (
            get_compute_capability,
            get_device_name,
            get_device_sm_count,
        )

        sms, name = get_device_sm_count(device), get_device_name(device)
        capability = get_compute_capability(device)
    except Exception:  # no CUDA device, or another flashinfer
        return most
    for num_seqs in range(4, most):
        if not should_use_cp_host(
            num_seqs * heads, sms, name, device_capability=capability
        ):
            return num_seqs
    return most


def linear_prefill_activation_dtype(linear) -> torch.dtype:
    """The model's activation dtype (q/k/v of the extend)."""
    runner = getattr(linear, "_model_runner", None)
    return getattr(runner, "dtype", None) or torch.bfloat16
