# SPDX-License-Identifier: Apache-2.0
"""Static per-bucket Mamba2 extend metadata for a full prefill CUDA graph.

Extends sglang/srt/layers/attention/mamba/mamba2_metadata.py (issue 16;
docs/mamba2_full_prefill_graph.md): ``full_prefill_graph_metadata`` gives a
Mamba2 backend one ``Mamba2FullGraphMetadata`` per captured token bucket, on
which upstream's own MambaMixer2 extend runs inside a full prefill graph (wired
in by ..hybrid_linear_attn_backend, behind MAMBA2_FULL_PREFILL_GRAPH).

``Mamba2Metadata.prepare_mixed`` derives the SSD chunk metadata on the host: the
request and token counts from ``extend_seq_lens_cpu``, ``prep_initial_states``
with an ``.item()``, the logical chunk count with a device ``.sum()`` that
sizes a tensor, and ``chunk_indices`` / ``chunk_offsets`` in a Python loop over
the requests; ``causal_conv1d_fn`` sizes its grid from ``seq_lens_cpu``. A full
prefill graph records one launch per token bucket, so here the same metadata
comes from the batch's device tensors with torch ops whose shapes depend only on
the bucket (T tokens), the runner's request slots (R) and the chunk size (C):
nothing reads device data on the host and nothing loops over requests, so the
fill can run before a replay or inside the graph itself.

Layout of one bucket:

* R + 1 sequences. Rows 0..R-1 are the request slots (zero-length past the
  batch, as the runner pads them). Row R, the bucket's tail, owns the tokens
  past the batch: the SSD kernels scan every token of the bucket, so those
  tokens form a sequence of their own, on the reserved mamba padding slot and
  without initial state, instead of joining the last request.
* ``query_start_loc`` [R + 2], ``seq_idx`` [1, T], ``has_initial_states`` and
  ``cache_indices`` [R + 1]: what ``prepare_mixed`` builds for those sequences.
* ``chunk_indices`` / ``chunk_offsets`` [cdiv(T, C) + R]: sglang's logical
  chunks of those sequences (zero-length rows included, as the state-passing
  kernel counts them), then inert rows -- the last physical chunk at offset C --
  whose every load and store the chunk-scan kernel masks out. A logical chunk
  starts at every chunk boundary and at every sequence start off the grid, and
  only R sequence starts are not at token 0: hence the bound.
* The conv: upstream's MambaMixer2 calls it with
  ``seq_lens_cpu=extend_seq_lens_cpu`` and no block table, so the metadata's
  ``extend_seq_lens_cpu`` is its launch bound, R + 1 sequences of up to T tokens
  (``Mamba2FullGraphMetadata``). With MAMBA2_CONV_BLOCK_TABLE
  (..full_prefill_graph_capability), also ``conv_block_table``
  [cdiv(T, CAUSAL_CONV1D_FWD_BLOCK_M) + R, 2]: the (sequence, block) rows of the
  batch's tokens, ``(PAD_SLOT_ID, 0)`` past them (same bound argument), which
  ``ConvLaunchLengths`` carries to the conv
  (sglang_graphfix.kernels.ops.mamba.causal_conv1d_triton).

``Mamba2PrefillTrackTables`` holds the prefix-cache snapshot plan the same way:
K rows with a mode instead of the eager path's masked index lists
(``_init_track_ssm_indices`` with ``build_prefill_track_plan(mamba2=True)`` and
``_init_track_conv_indices``), so a captured extend can snapshot with
fixed-shape gathers and one scatter whose filler rows land in the padding slot.
The tracked request slots are packed into the first rows on the device. sglang
tracks a request only when its extend holds at least one cache chunk
(``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``: ``extend_len >=
mamba_checkpoint_grid``, a multiple of ``mamba_cache_chunk_size()``; with DCP a
chunk-aligned span inside the extend), so a T-token bucket needs K = min(R,
T // cache chunk) rows (``track_rows``), and none below one cache chunk: the
recompute and snapshot work of a short prefill is not paid for every slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from sglang.kernels.ops.mamba.causal_conv1d_triton import (
    CAUSAL_CONV1D_FWD_BLOCK_M,
    PAD_SLOT_ID,
)
from sglang.kernels.ops.mamba.kda_prefill_track import (
    TRACK_CHUNK_STATE,
    TRACK_FINAL_STATE,
    TRACK_NONE,
)
from sglang.srt.layers.attention.mamba.mamba2_metadata import Mamba2Metadata
from sglang.srt.runtime_context import mamba_cache_chunk_size
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention.linear.kda_prefill_graph import (
    bucket_tables,
    live_track_inputs,
    request_slots,
)
from sglang_graphfix_kernel.mamba2_prefill_tables import (
    MAX_REQUEST_SLOTS,
    Mamba2TableConstants,
    Mamba2TableViews,
    Mamba2TrackViews,
    fill_mamba2_prefill_tables,
)

# The mamba pools reserve slot 0 for padding (the runner's padded request rows
# carry request-pool row 0, which maps to it): the tail sequence writes there.
PADDING_SLOT = 0

# Snapshot modes of a request slot (the first three are upstream's KDA modes):
# not tracked; the post-extend state (tracked length chunk-aligned); the state at
# a boundary of the flat chunk grid (``states[h_src]`` of the chunk scan); the
# state at a boundary off that grid, recomputed from the sequence start
# (``mamba_chunk_scan_combined(track_seq_idx=, track_end_locs=)``).
TRACK_GRID_STATE = TRACK_CHUNK_STATE
TRACK_RECOMPUTE_STATE = 3
assert TRACK_RECOMPUTE_STATE not in (TRACK_NONE, TRACK_FINAL_STATE, TRACK_CHUNK_STATE)


def max_logical_chunks(num_tokens: int, max_requests: int, chunk_size: int) -> int:
    """Logical SSD chunks of any batch of at most ``max_requests`` requests in a
    ``num_tokens`` bucket (plus its tail sequence)."""
    return triton.cdiv(num_tokens, chunk_size) + max_requests


def max_conv_blocks(num_tokens: int, max_requests: int) -> int:
    """(sequence, block) rows of the conv kernel for the same batches."""
    return triton.cdiv(num_tokens, CAUSAL_CONV1D_FWD_BLOCK_M) + max_requests


class ConvLaunchLengths(list):
    """A bucket's conv launch bound, ``[T] * (R + 1)`` as upstream's conv call
    reads it, carrying the bucket's ``block_table`` for
    sglang_graphfix.kernels.ops.mamba.causal_conv1d_triton."""

    def __init__(self, lengths, block_table: torch.Tensor):
        super().__init__(lengths)
        self.block_table = block_table


def track_rows(num_tokens: int, max_requests: int, cache_chunk_size: int) -> int:
    """Snapshot rows of a bucket: the most requests of a ``num_tokens`` batch
    that sglang tracks, each extending at least ``cache_chunk_size`` tokens."""
    return min(max_requests, num_tokens // cache_chunk_size)


@dataclass(frozen=True)
class Mamba2PrefillGraphTables:
    """The static tables of one token bucket; ``fill`` rewrites them in place."""

    num_tokens: int
    max_requests: int
    chunk_size: int
    query_start_loc: torch.Tensor  # [R + 2] int32
    seq_idx: torch.Tensor  # [1, T] int32
    has_initial_states: torch.Tensor  # [R + 1] bool
    cache_indices: torch.Tensor  # [R + 1]
    chunk_indices: torch.Tensor  # [max_logical_chunks] int32
    chunk_offsets: torch.Tensor  # [max_logical_chunks] int32
    num_logical_tokens: torch.Tensor  # [1] int32, the batch's tokens
    # [max_conv_blocks, 2] int32, with MAMBA2_CONV_BLOCK_TABLE only
    conv_block_table: torch.Tensor | None = None

    @classmethod
    def allocate(
        cls,
        *,
        num_tokens: int,
        max_requests: int,
        chunk_size: int,
        cache_index_dtype: torch.dtype,
        device: torch.device | str,
        conv_blocks: bool = False,
    ) -> Mamba2PrefillGraphTables:
        assert chunk_size > 0 and chunk_size & (chunk_size - 1) == 0, chunk_size
        assert num_tokens >= 1 and max_requests >= 1, (num_tokens, max_requests)

        def table(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=device)

        n_seqs = max_requests + 1
        return cls(
            num_tokens=num_tokens,
            max_requests=max_requests,
            chunk_size=chunk_size,
            query_start_loc=table(n_seqs + 1),
            seq_idx=table(1, num_tokens),
            has_initial_states=table(n_seqs, dtype=torch.bool),
            cache_indices=table(n_seqs, dtype=cache_index_dtype),
            chunk_indices=table(
                max_logical_chunks(num_tokens, max_requests, chunk_size)
            ),
            chunk_offsets=table(
                max_logical_chunks(num_tokens, max_requests, chunk_size)
            ),
            num_logical_tokens=table(1),
            conv_block_table=(
                table(max_conv_blocks(num_tokens, max_requests), 2)
                if conv_blocks
                else None
            ),
        )

    def fill(
        self,
        *,
        extend_seq_lens: torch.Tensor,
        extend_prefix_lens: torch.Tensor,
        slots: torch.Tensor,
        pad_slot: int = PADDING_SLOT,
    ) -> None:
        """Rewrite the tables for a batch given as [R] device tensors: the
        request slots' extend and cached-prefix lengths (zero past the batch)
        and their physical mamba slots. Their sum must fit the bucket (the
        runner's host check); nothing here reads them on the host."""
        R, T, C = self.max_requests, self.num_tokens, self.chunk_size
        for name, t in (
            ("extend_seq_lens", extend_seq_lens),
            ("extend_prefix_lens", extend_prefix_lens),
            ("slots", slots),
        ):
            assert t.shape == (R,), f"{name}: {tuple(t.shape)} != ({R},)"
        device = self.query_start_loc.device
        i64 = dict(dtype=torch.int64, device=device)

        # Sequences: the R request slots, then the bucket's tail.
        ends = torch.cumsum(extend_seq_lens.to(torch.int64), 0)
        cu = torch.cat([torch.zeros(1, **i64), ends, torch.full((1,), T, **i64)])
        starts, seq_ends = cu[:-1], cu[1:]
        self.query_start_loc.copy_(cu)
        self.num_logical_tokens.copy_(ends[-1:])
        tokens = torch.arange(T, **i64)
        self.seq_idx[0].copy_(torch.searchsorted(seq_ends, tokens, right=True))
        no_state = torch.zeros(1, dtype=torch.bool, device=device)
        self.has_initial_states.copy_(torch.cat([extend_prefix_lens > 0, no_state]))
        tail_slot = torch.full((1,), pad_slot, dtype=slots.dtype, device=device)
        self.cache_indices.copy_(torch.cat([slots, tail_slot]))

        # Logical chunks (Mamba2Metadata._query_start_loc_to_chunk_indices_offsets):
        # sequence i covers entries [first[i], last[i]) -- its physical chunks,
        # shifted by the p[i] sequence starts off the chunk grid up to it.
        p = torch.cumsum(starts % C > 0, 0)
        first = starts // C + p
        last = (seq_ends + C - 1) // C + p
        entry = torch.arange(self.chunk_indices.shape[0], **i64)
        seq = torch.searchsorted(last, entry, right=True)
        live = seq <= R
        seq = seq.clamp(max=R)
        offset = torch.where(entry == first[seq], starts[seq] % C, 0)
        self.chunk_indices.copy_(
            torch.where(live, entry - p[seq], triton.cdiv(T, C) - 1)
        )
        self.chunk_offsets.copy_(torch.where(live, offset, C))
        if self.conv_block_table is None:
            return

        # Conv blocks: sequence-major (sequence, block) rows.
        n_blocks = (seq_ends - starts + CAUSAL_CONV1D_FWD_BLOCK_M - 1) // (
            CAUSAL_CONV1D_FWD_BLOCK_M
        )
        block_ends = torch.cumsum(n_blocks, 0)
        row = torch.arange(self.conv_block_table.shape[0], **i64)
        seq = torch.searchsorted(block_ends, row, right=True)
        live = seq <= R
        seq = seq.clamp(max=R)
        block = row - (block_ends[seq] - n_blocks[seq])
        self.conv_block_table[:, 0].copy_(torch.where(live, seq, PAD_SLOT_ID))
        self.conv_block_table[:, 1].copy_(torch.where(live, block, 0))


@dataclass(frozen=True)
class Mamba2PrefillTrackTables:
    """Prefix-cache snapshot plan of one bucket: ``num_rows`` (K) rows, the
    tracked request slots first, then filler rows (mode TRACK_NONE, the
    padding slot, the bucket's tail sequence R)."""

    max_requests: int
    num_rows: int
    conv_len: int
    src: torch.Tensor  # [K] int64 the row's sequence: request slot, R for a filler
    mode: torch.Tensor  # [K] int32, TRACK_*
    dst: torch.Tensor  # [K] int64 track slot, the padding slot for a filler
    h_src: torch.Tensor  # [K] int64 flat chunk of a grid row, else 0
    # [K] int64 snapshot token of a recompute row, the row's end for final and
    # grid rows, the row's start (an empty segment) for a filler
    end_loc: torch.Tensor
    conv_window: torch.Tensor  # [K, conv_len] int64 pre-conv token rows

    @classmethod
    def allocate(
        cls,
        *,
        max_requests: int,
        num_rows: int,
        conv_len: int,
        device: torch.device | str,
    ) -> Mamba2PrefillTrackTables:
        assert 1 <= num_rows <= max_requests, (num_rows, max_requests)

        def table(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        K = num_rows
        return cls(
            max_requests=max_requests,
            num_rows=K,
            conv_len=conv_len,
            src=table(K),
            mode=table(K, dtype=torch.int32),
            dst=table(K),
            h_src=table(K),
            end_loc=table(K),
            conv_window=table(K, conv_len),
        )

    def fill(
        self,
        tables: Mamba2PrefillGraphTables,
        *,
        track_mask: torch.Tensor,
        track_seq_lens: torch.Tensor,
        track_slots: torch.Tensor,
        extend_prefix_lens: torch.Tensor,
        cache_chunk_size: int,
        pad_slot: int = PADDING_SLOT,
    ) -> None:
        """Rewrite the plan for the batch ``tables`` was just filled with. The
        track inputs (``mamba_track_mask`` / ``_seqlens`` / translated
        ``_indices``) may hold only the batch's rows: missing rows are not
        tracked. At most ``num_rows`` rows may be tracked (the caller's host
        check); ``cache_chunk_size`` is ``mamba_cache_chunk_size()``."""
        R, K, C = self.max_requests, self.num_rows, tables.chunk_size
        assert tables.max_requests == R, (tables.max_requests, R)
        device = self.mode.device

        def rows(t, dtype=torch.int64):
            assert t.dim() == 1 and t.shape[0] <= R, tuple(t.shape)
            return torch.nn.functional.pad(t.to(dtype), (0, R - t.shape[0]))

        # Row k snapshots the (k + 1)-th tracked request slot; past the tracked
        # count, src is R: a filler on the bucket's tail sequence, with an empty
        # recompute segment at its start. The SSD recomputes consecutive
        # segments [start, end_loc] of the rows and the gaps between them, and
        # its varlen kernel reads the token before each end: segments in token
        # order and no end at token 0 (the tail starts after the batch's tokens).
        tracked = rows(track_mask) != 0
        row = torch.arange(K, device=device)
        src = torch.searchsorted(torch.cumsum(tracked, 0), row + 1)
        live = src < R
        request = torch.where(live, src, 0)  # for the [R] request-slot inputs
        self.src.copy_(src)
        starts = tables.query_start_loc[src].to(torch.int64)
        seq_ends = tables.query_start_loc[src + 1].to(torch.int64)
        length = (rows(track_seq_lens) - rows(extend_prefix_lens))[request]
        length = torch.where(live, length, 0)
        # build_prefill_track_plan(mamba2=True), per row.
        end = starts + length // C * C
        mode = torch.where(
            length % C == 0,
            TRACK_FINAL_STATE,
            torch.where(end % C == 0, TRACK_GRID_STATE, TRACK_RECOMPUTE_STATE),
        )
        mode = torch.where(live, mode, TRACK_NONE)
        self.mode.copy_(mode)
        self.dst.copy_(torch.where(live, rows(track_slots)[request], pad_slot))
        self.h_src.copy_(torch.where(mode == TRACK_GRID_STATE, end // C, 0))
        # Final and grid rows recompute their whole sequence (the result is not
        # used), fillers nothing.
        self.end_loc.copy_(
            torch.where(
                mode == TRACK_RECOMPUTE_STATE, end, torch.where(live, seq_ends, starts)
            )
        )
        # _init_track_conv_indices: the window ends at the cache-chunk-aligned
        # length, clamped into the batch's tokens.
        aligned = length // cache_chunk_size * cache_chunk_size
        first = starts + aligned - self.conv_len
        window = first[:, None] + torch.arange(self.conv_len, device=device)
        last = tables.num_logical_tokens.to(torch.int64) - 1
        self.conv_window.copy_(torch.minimum(window.clamp(min=0), last))


@dataclass(kw_only=True)
class Mamba2FullGraphMetadata(Mamba2Metadata):
    """Mamba2Metadata of one captured token bucket, on its static tables.

    What MambaMixer2.forward reads, laid out so that its extend branch launches
    over the whole bucket with shapes fixed by it: ``num_prefills`` R + 1
    sequences (the request slots and the tail), ``num_prefill_tokens`` T, no
    decodes, always with initial states and the chunk tables; the conv's
    ``extend_seq_lens_cpu`` is its launch bound, not the batch's lengths (R + 1
    sequences of up to T tokens: the conv kernel skips blocks past a sequence's
    end, which it reads from ``query_start_loc`` on the device). With the
    prefix-cache track on and a bucket of at least one cache chunk, the K
    snapshot rows: the conv window scatter (``track_conv_indices`` [K, conv_len]
    into ``conv_states_mask_indices``, the padding slot for a filler) and the
    SSD's recompute rows (``track_ssm_seq_idx``, the rows' sequences: request
    slots, the tail R for a filler); the
    SSM snapshot copy is
    hybrid_linear_attn_backend.snapshot_mamba2_states_on_graph_tables."""

    tables: Mamba2PrefillGraphTables
    track: Mamba2PrefillTrackTables | None = None

    @classmethod
    def on_tables(
        cls,
        tables: Mamba2PrefillGraphTables,
        track: Mamba2PrefillTrackTables | None,
    ) -> Mamba2FullGraphMetadata:
        R, T = tables.max_requests, tables.num_tokens
        return cls(
            query_start_loc=tables.query_start_loc,
            mamba_cache_indices=tables.cache_indices,
            num_prefills=R + 1,
            num_prefill_tokens=T,
            num_decodes=0,
            has_mamba_track_mask=track is not None,
            track_conv_indices=track.conv_window if track is not None else None,
            conv_states_mask_indices=track.dst if track is not None else None,
            track_ssm_seq_idx=track.src if track is not None else None,
            track_ssm_end_locs=track.end_loc if track is not None else None,
            mixed_metadata=Mamba2Metadata.MixedMetadata(
                has_initial_states=tables.has_initial_states,
                prep_initial_states=True,
                chunk_size=tables.chunk_size,
                seq_idx=tables.seq_idx,
                chunk_indices=tables.chunk_indices,
                chunk_offsets=tables.chunk_offsets,
                extend_seq_lens_cpu=(
                    [T] * (R + 1)
                    if tables.conv_block_table is None
                    else ConvLaunchLengths([T] * (R + 1), tables.conv_block_table)
                ),
            ),
            tables=tables,
            track=track,
        )


def full_prefill_graph_metadata(
    backend, forward_batch, *, in_capture: bool
) -> Mamba2FullGraphMetadata:
    """Allocate (capture) or look up (replay) the bucket's metadata on the
    Mamba2 backend and refill its tables from ``forward_batch``, the full
    prefill runner's slot-padded view of the batch (R request slots, zero
    lengths on pool row 0 past the batch). The track tables exist when the
    capture batch carries a track mask (the mamba extra buffer with the radix
    cache) and the bucket holds a cache chunk: any replay of the bucket may
    snapshot up to ``track_rows`` requests, which a replay checks on the host
    (``mamba_prefill_track_mask_cpu``) and refuses past."""
    bucket = forward_batch.input_ids.shape[0]
    slots = request_slots(backend, forward_batch)
    meta = bucket_tables(
        backend,
        "mamba2_full_prefill_graph_metadata",
        forward_batch,
        in_capture=in_capture,
        allocate=lambda: _allocate_metadata(backend, forward_batch, slots.dtype),
        family="Mamba2",
    )
    if not in_capture:
        _check_tracked_requests(forward_batch, meta, bucket)
    fill_mamba2_tables(
        meta.tables,
        meta.track,
        extend_seq_lens=forward_batch.extend_seq_lens,
        extend_prefix_lens=forward_batch.extend_prefix_lens,
        slots=slots,
        **_track_inputs(backend, forward_batch, meta),
        cache_chunk_size=mamba_cache_chunk_size(),
        on_device=fills_on_device(meta.tables),
    )
    backend.forward_metadata = meta
    return meta


def fills_on_device(tables) -> bool:
    """Whether a bucket's tables are refilled by the one-launch kernel
    (MAMBA2_TABLE_FILL_KERNEL, on CUDA, up to its MAX_REQUEST_SLOTS) rather
    than the torch fills."""
    return (
        capability.MAMBA2_TABLE_FILL_KERNEL
        and tables.seq_idx.device.type == "cuda"
        and tables.max_requests <= MAX_REQUEST_SLOTS
    )


def fill_mamba2_tables(
    tables: Mamba2PrefillGraphTables,
    track: Mamba2PrefillTrackTables | None,
    *,
    extend_seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    slots: torch.Tensor,
    track_mask: torch.Tensor | None,
    track_seq_lens: torch.Tensor | None,
    track_slots: torch.Tensor | None,
    cache_chunk_size: int,
    on_device: bool,
) -> None:
    """Refill a bucket's tables and snapshot plan (``track``, where it has one)
    for a batch of [R] device tensors; the track inputs may hold only the
    batch's rows, or be None (nothing tracked). ``on_device``: one launch of
    sglang_graphfix_kernel.mamba2_prefill_tables; else the torch fills above
    (about 45 launches, and about 75 more with a snapshot plan)."""
    if on_device:
        fill_mamba2_prefill_tables(
            Mamba2TableViews(*(getattr(tables, f) for f in Mamba2TableViews._fields)),
            (
                Mamba2TrackViews(*(getattr(track, f) for f in Mamba2TrackViews._fields))
                if track is not None
                else None
            ),
            extend_seq_lens=extend_seq_lens,
            extend_prefix_lens=extend_prefix_lens,
            slots=slots,
            track_mask=track_mask,
            track_seq_lens=track_seq_lens,
            track_slots=track_slots,
            constants=Mamba2TableConstants(
                chunk=tables.chunk_size,
                conv_block=CAUSAL_CONV1D_FWD_BLOCK_M,
                cache_chunk=cache_chunk_size,
                pad_slot=PADDING_SLOT,
                conv_pad=PAD_SLOT_ID,
                track_none=TRACK_NONE,
                track_final=TRACK_FINAL_STATE,
                track_grid=TRACK_GRID_STATE,
                track_recompute=TRACK_RECOMPUTE_STATE,
            ),
        )
        return
    tables.fill(
        extend_seq_lens=extend_seq_lens,
        extend_prefix_lens=extend_prefix_lens,
        slots=slots,
    )
    if track is None:
        return
    if track_mask is None:
        R, device = tables.max_requests, tables.seq_idx.device
        track_mask = torch.zeros(R, dtype=torch.bool, device=device)
        track_seq_lens = track_slots = torch.zeros(R, dtype=torch.int64, device=device)
    track.fill(
        tables,
        track_mask=track_mask,
        track_seq_lens=track_seq_lens,
        track_slots=track_slots,
        extend_prefix_lens=extend_prefix_lens,
        cache_chunk_size=cache_chunk_size,
    )


def _allocate_metadata(backend, forward_batch, cache_index_dtype):
    """The bucket's tables over the capture batch's request slots, with track
    tables when that batch carries a track mask and the bucket has track rows."""
    R, T = forward_batch.batch_size, forward_batch.input_ids.shape[0]
    tables = Mamba2PrefillGraphTables.allocate(
        num_tokens=T,
        max_requests=R,
        chunk_size=backend.mamba_chunk_size,
        cache_index_dtype=cache_index_dtype,
        device=backend.device,
        conv_blocks=capability.MAMBA2_CONV_BLOCK_TABLE,
    )
    K = track_rows(T, R, mamba_cache_chunk_size())
    track = None
    if forward_batch.mamba_track_mask is not None and K > 0:
        track = Mamba2PrefillTrackTables.allocate(
            max_requests=R,
            num_rows=K,
            conv_len=backend.conv_states_shape[-1],
            device=backend.device,
        )
    return Mamba2FullGraphMetadata.on_tables(tables, track)


def _check_tracked_requests(forward_batch, meta, bucket: int) -> None:
    """A replay snapshots at most the bucket's track rows: counted on the host
    from the scheduler's mask, and refused when the count is missing."""
    if forward_batch.mamba_track_mask is None:
        return
    rows = meta.track.num_rows if meta.track is not None else 0
    mask_cpu = forward_batch.mamba_prefill_track_mask_cpu
    tracked = sum(map(bool, mask_cpu)) if mask_cpu is not None else None
    if tracked is None or tracked > rows:
        raise RuntimeError(
            f"Mamba2 full prefill graph: the {bucket}-token bucket has {rows} "
            f"prefix-cache snapshot row(s) and the batch tracks "
            f"{'an unknown number of' if tracked is None else tracked} "
            "request(s); sglang tracks only requests that extend at least one "
            "mamba cache chunk. Use --cuda-graph-backend-prefill breakable."
        )


def _track_inputs(backend, forward_batch, meta: Mamba2FullGraphMetadata) -> dict:
    """The eager track selection's inputs (MambaAttnBackendBase._forward_metadata:
    the mask, the tracked lengths, the translated track slots), all None where
    the bucket has no snapshot plan or the batch tracks nothing (e.g. a replay
    without the track slots). One dtype each, as the GDN/KDA tables take them
    (live_track_inputs; those of the table-fill kernel's stand-ins for absent
    inputs), so that capture and replay launch the same compiled kernel: with
    the extra buffer every batch carries a mask, and before the dtypes were
    fixed the kernel compiled again on a server's first replay of a bucket with
    a snapshot plan (2.92 s, logged on 2026-12-07)."""
    if meta.track is None or forward_batch.mamba_track_mask is None:
        return dict(track_mask=None, track_seq_lens=None, track_slots=None)
    track = live_track_inputs(backend, forward_batch)
    return dict(
        track_mask=track.mask, track_seq_lens=track.seq_lens, track_slots=track.slots
    )
