# SPDX-License-Identifier: Apache-2.0
"""Mamba2 prefill-graph tables, filled on the device in one launch.

A Mamba2 full prefill graph's bucket reads static tables that
sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph refills before
every replay (``Mamba2PrefillGraphTables.fill`` and, with the prefix-cache
track, ``Mamba2PrefillTrackTables.fill``): the sequences' starts, each token's
sequence, the SSD's logical chunks, the conv's (sequence, block) rows and the
snapshot plan. There they are about 45 and 75 small torch ops, each a launch
on the host. This kernel writes the same tables from the same device tensors in
one program (the host cost of one launch, whatever the number of requests;
nothing waits for the device); those torch fills stay the reference it is
tested against and the path off CUDA.

R request slots, then the bucket's tail (sequence R: the tokens past the
batch); rows ``>= n_track`` of the track inputs are not tracked. Lengths are
non-negative (Triton's ``//`` and ``%`` truncate where torch's floor: they
differ only below zero, e.g. a tracked length under its cached prefix, which
sglang never sends).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

# The most request slots one launch takes: the snapshot plan's searches hold a
# [slots + 1, slots + 1] tile (rounded up to a power of two) in one program.
# Triton refuses a tile over 2**20 elements (above 1023 slots: 1024 failed to
# compile); 255 keeps it at 256 x 256, a margin chosen for the registers, not
# measured on a GPU (served graphs have 16-48 slots). Above it the torch fill runs.
MAX_REQUEST_SLOTS = 255


@triton.jit
def _pick(values, index, lanes):
    """values[index] per element of ``index``, for a [BLOCK_S] register vector
    ``values`` over ``lanes`` (a gather by one-hot sum)."""
    return tl.sum(tl.where(lanes[None, :] == index[:, None], values[None, :], 0), 1)


@triton.jit
def _owner(ends, row, seq):
    """Per table row, the sequence (of ``seq``'s lanes) whose rows hold it: how
    many end at or before it (searchsorted(ends, row, right=True))."""
    return tl.sum(((ends[None, :] <= row[:, None]) & seq[None, :]).to(tl.int64), 1)


@triton.jit(do_not_specialize=["n_track", "R", "T", "NC", "NB", "K"])
def _fill_mamba2_prefill_tables(
    lens_ptr,  # [R] extend lengths
    prefix_ptr,  # [R] cached-prefix lengths
    slots_ptr,  # [R] mamba state slots
    track_mask_ptr,  # [n_track]
    track_len_ptr,  # [n_track] sequence length at the snapshot
    track_slot_ptr,  # [n_track] snapshot slots
    query_start_loc_ptr,  # [R + 2] int32
    seq_idx_ptr,  # [T] int32
    has_initial_states_ptr,  # [R + 1] bool
    cache_indices_ptr,  # [R + 1]
    chunk_indices_ptr,  # [NC] int32
    chunk_offsets_ptr,  # [NC] int32
    num_logical_tokens_ptr,  # [1] int32
    conv_block_table_ptr,  # [NB, 2] int32 (CONV_TABLE)
    track_src_ptr,  # [K] int64 (K > 0)
    track_mode_ptr,  # [K] int32
    track_dst_ptr,  # [K] int64
    track_h_src_ptr,  # [K] int64
    track_end_loc_ptr,  # [K] int64
    track_conv_window_ptr,  # [K, CONV_LEN] int64
    n_track,
    R,  # request slots
    T,  # the bucket's tokens
    NC,  # chunk table rows
    NB,  # conv table rows
    K,  # snapshot rows
    C: tl.constexpr,  # SSD chunk size
    CONV_TABLE: tl.constexpr,
    HAS_TRACK: tl.constexpr,
    CONV_BLOCK: tl.constexpr,  # CAUSAL_CONV1D_FWD_BLOCK_M
    CONV_LEN: tl.constexpr,
    CACHE_CHUNK: tl.constexpr,  # mamba_cache_chunk_size()
    PAD_SLOT: tl.constexpr,  # the mamba pools' padding slot
    CONV_PAD: tl.constexpr,  # the conv's PAD_SLOT_ID
    TRACK_NONE: tl.constexpr,
    TRACK_FINAL: tl.constexpr,
    TRACK_GRID: tl.constexpr,
    TRACK_RECOMPUTE: tl.constexpr,
    BLOCK_S: tl.constexpr,  # >= R + 1, power of two
    BLOCK_ROWS: tl.constexpr,  # table rows per step
):
    s = tl.arange(0, BLOCK_S)
    slot = s < R
    seq = s <= R  # the request slots and the tail
    lens = tl.load(lens_ptr + s, mask=slot, other=0).to(tl.int64)
    prefix = tl.load(prefix_ptr + s, mask=slot, other=0).to(tl.int64)
    total = tl.sum(lens, 0)
    ends = tl.cumsum(lens, 0)
    starts = tl.where(slot, ends - lens, total)
    seq_ends = tl.where(slot, ends, T)
    first = s == 0
    tl.store(query_start_loc_ptr + s, tl.zeros_like(s), mask=first)
    tl.store(query_start_loc_ptr + 1 + s, seq_ends.to(tl.int32), mask=seq)
    tl.store(num_logical_tokens_ptr + s, (total + tl.zeros_like(s)).to(tl.int32),
             mask=first)  # fmt: skip
    slots = tl.load(slots_ptr + s, mask=slot, other=PAD_SLOT)
    tl.store(cache_indices_ptr + s, tl.where(slot, slots, PAD_SLOT), mask=seq)
    tl.store(has_initial_states_ptr + s, slot & (prefix > 0), mask=seq)

    # Each token's sequence: how many sequences end at or before it.
    for start in range(0, T, BLOCK_ROWS):
        token = start + tl.arange(0, BLOCK_ROWS)
        owner = _owner(seq_ends, token, seq)
        tl.store(seq_idx_ptr + token, owner.to(tl.int32), mask=token < T)

    # The SSD's logical chunks: sequence i covers entries [first_i, last_i),
    # shifted by the p_i sequence starts off the chunk grid up to it.
    p = tl.cumsum(((starts % C) > 0).to(tl.int64), 0)
    first_entry = starts // C + p
    last_entry = (seq_ends + C - 1) // C + p
    for start in range(0, NC, BLOCK_ROWS):
        entry = start + tl.arange(0, BLOCK_ROWS)
        owner = _owner(last_entry, entry, seq)
        live = owner <= R
        owner = tl.minimum(owner, R)
        offset = tl.where(
            entry == _pick(first_entry, owner, s), _pick(starts, owner, s) % C, 0
        )
        index = tl.where(live, entry - _pick(p, owner, s), (T + C - 1) // C - 1)
        keep = entry < NC
        tl.store(chunk_indices_ptr + entry, index.to(tl.int32), mask=keep)
        tl.store(chunk_offsets_ptr + entry, tl.where(live, offset, C).to(tl.int32),
                 mask=keep)  # fmt: skip

    if CONV_TABLE:
        n_blocks = tl.where(seq, (seq_ends - starts + CONV_BLOCK - 1) // CONV_BLOCK, 0)
        block_ends = tl.cumsum(n_blocks, 0)
        for start in range(0, NB, BLOCK_ROWS):
            row = start + tl.arange(0, BLOCK_ROWS)
            owner = _owner(block_ends, row, seq)
            live = owner <= R
            owner = tl.minimum(owner, R)
            block = row - (_pick(block_ends, owner, s) - _pick(n_blocks, owner, s))
            keep = row < NB
            tl.store(conv_block_table_ptr + 2 * row,
                     tl.where(live, owner, CONV_PAD).to(tl.int32), mask=keep)  # fmt: skip
            tl.store(conv_block_table_ptr + 2 * row + 1,
                     tl.where(live, block, 0).to(tl.int32), mask=keep)  # fmt: skip

    if HAS_TRACK:
        # Row k snapshots the (k + 1)-th tracked request slot; past the tracked
        # count it is a filler on the tail sequence R.
        tracked_in = slot & (s < n_track)
        tracked = tl.load(track_mask_ptr + s, mask=tracked_in, other=0) != 0
        track_len = tl.load(track_len_ptr + s, mask=tracked_in, other=0).to(tl.int64)
        track_slot = tl.load(track_slot_ptr + s, mask=tracked_in, other=0).to(tl.int64)
        count = tl.cumsum(tracked.to(tl.int64), 0)
        k = tl.arange(0, BLOCK_S)
        row_live = k < K
        # searchsorted(count, k + 1): the slots with at most k tracked up to them.
        src = _owner(count, k, slot)
        live = src < R
        request = tl.where(live, src, 0)
        row_start = _pick(starts, src, s)
        row_end = _pick(seq_ends, src, s)
        length = tl.where(live, _pick(track_len - prefix, request, s), 0)
        end = row_start + length // C * C
        mode = tl.where(
            length % C == 0,
            TRACK_FINAL,
            tl.where(end % C == 0, TRACK_GRID, TRACK_RECOMPUTE),
        )
        mode = tl.where(live, mode, TRACK_NONE)
        tl.store(track_src_ptr + k, src, mask=row_live)
        tl.store(track_mode_ptr + k, mode.to(tl.int32), mask=row_live)
        tl.store(track_dst_ptr + k, tl.where(live, _pick(track_slot, request, s), PAD_SLOT),
                 mask=row_live)  # fmt: skip
        tl.store(track_h_src_ptr + k, tl.where(mode == TRACK_GRID, end // C, 0),
                 mask=row_live)  # fmt: skip
        end_loc = tl.where(
            mode == TRACK_RECOMPUTE, end, tl.where(live, row_end, row_start)
        )
        tl.store(track_end_loc_ptr + k, end_loc, mask=row_live)
        window_first = row_start + length // CACHE_CHUNK * CACHE_CHUNK - CONV_LEN
        last = total - 1
        for j in range(CONV_LEN):
            token = tl.minimum(tl.maximum(window_first + j, 0), last)
            tl.store(track_conv_window_ptr + k * CONV_LEN + j, token, mask=row_live)


class Mamba2TableViews(NamedTuple):
    """The bucket's tables (Mamba2PrefillGraphTables' fields); conv_block_table
    None when the bucket has none."""

    query_start_loc: torch.Tensor
    seq_idx: torch.Tensor
    has_initial_states: torch.Tensor
    cache_indices: torch.Tensor
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    num_logical_tokens: torch.Tensor
    conv_block_table: torch.Tensor | None


class Mamba2TrackViews(NamedTuple):
    """The bucket's snapshot plan (Mamba2PrefillTrackTables' fields)."""

    src: torch.Tensor
    mode: torch.Tensor
    dst: torch.Tensor
    h_src: torch.Tensor
    end_loc: torch.Tensor
    conv_window: torch.Tensor


class Mamba2TableConstants(NamedTuple):
    chunk: int
    conv_block: int
    cache_chunk: int
    pad_slot: int
    conv_pad: int
    track_none: int
    track_final: int
    track_grid: int
    track_recompute: int


def fill_mamba2_prefill_tables(
    tables: Mamba2TableViews,
    track: Mamba2TrackViews | None,
    *,
    extend_seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    slots: torch.Tensor,
    track_mask: torch.Tensor | None,
    track_seq_lens: torch.Tensor | None,
    track_slots: torch.Tensor | None,
    constants: Mamba2TableConstants,
) -> None:
    """Fill ``tables`` (and ``track``, when the bucket has one) for a batch given
    as [R] device tensors; the track inputs may hold fewer rows (the rest are
    not tracked) or be None (nothing tracked). One launch."""
    R = extend_seq_lens.shape[0]
    if R > MAX_REQUEST_SLOTS:
        raise ValueError(
            f"{R} request slots: one launch takes at most {MAX_REQUEST_SLOTS}"
        )
    T = tables.seq_idx.shape[-1]
    K = 0 if track is None else track.src.shape[0]
    n_track = 0 if track_mask is None else track_mask.shape[0]
    # What the torch fills assert: the kernel would write past the tables.
    assert tables.query_start_loc.shape[0] == R + 2, (tables.query_start_loc.shape, R)
    assert n_track <= R and K <= R, (n_track, K, R)
    if track_mask is None:  # never read; of the usual dtypes (one compile)
        track_mask = tables.has_initial_states
        track_seq_lens = track_slots = extend_seq_lens if track is None else track.src
    conv_table = tables.conv_block_table
    dummy = tables.chunk_indices  # for absent outputs: never written
    track_out = track or Mamba2TrackViews(*([dummy] * 6))
    block_s = max(16, triton.next_power_of_2(R + 1))
    _fill_mamba2_prefill_tables[(1,)](
        extend_seq_lens, extend_prefix_lens, slots,
        track_mask, track_seq_lens, track_slots,
        tables.query_start_loc, tables.seq_idx, tables.has_initial_states,
        tables.cache_indices, tables.chunk_indices, tables.chunk_offsets,
        tables.num_logical_tokens,
        dummy if conv_table is None else conv_table,
        *track_out,
        n_track,
        R, T, tables.chunk_indices.shape[0],
        0 if conv_table is None else conv_table.shape[0],
        K,
        C=constants.chunk,
        CONV_TABLE=conv_table is not None,
        HAS_TRACK=track is not None,
        CONV_BLOCK=constants.conv_block,
        CONV_LEN=1 if track is None else track.conv_window.shape[1],
        CACHE_CHUNK=constants.cache_chunk,
        PAD_SLOT=constants.pad_slot,
        CONV_PAD=constants.conv_pad,
        TRACK_NONE=constants.track_none,
        TRACK_FINAL=constants.track_final,
        TRACK_GRID=constants.track_grid,
        TRACK_RECOMPUTE=constants.track_recompute,
        BLOCK_S=block_s,
        BLOCK_ROWS=max(16, min(128, 4096 // block_s)),
        num_warps=4,
    )  # fmt: skip
