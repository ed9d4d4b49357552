# SPDX-License-Identifier: Apache-2.0
"""Linear-attention prefill-graph tables, filled on the device in one launch.

sglang's ``KDAPrefillGraphMetadata.fill`` (kda_prefill_graph.py) rebuilds the
static per-bucket tables a captured KDA / GDN extend reads -- ``cu_seqlens``, the
(seq, chunk) rows of the delta-rule chunk kernels, ``chunk_offsets``, the (seq,
block) rows of the conv kernel, the prefix-cache track rows -- from the batch's
host-side lengths with numpy and per-row Python, then copies them over. This
kernel computes the same tables from the batch's device tensors (extend lengths,
prefix lengths, mamba slots, track mask / lengths / slots) in one program: its
host cost is one launch, whatever the number of requests, and nothing waits for
the device.

Rows ``>= bs`` of the inputs are never read (the full prefill runner pads its
request slots with zero-length sentinels); table rows past the batch get the
same padding as sglang's host fill. ``fill_linear_prefill_tables`` takes the
table views as tensors, so it does not depend on sglang's struct.

Off CUDA (CPU tests, in-process) the same tables come from a few torch ops
(``_fill_with_torch``, the kernel's steps one for one); the kernel itself runs in
Triton's interpreter in a fresh process (test/unit/sgl_kernel).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _store_segment_rows(
    table_ptr, counts, ends, total, n_rows, seq_pad, offset_pad,
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Rows 0..n_rows of a (sequence, offset in it) table over sequences of
    ``counts`` rows each (``ends``: their cumulative sums); rows past ``total``
    get (seq_pad, offset_pad)."""
    for start in range(0, n_rows, BLOCK_R):
        row = start + tl.arange(0, BLOCK_R)
        # Sequences that end at or before this row precede its sequence.
        before = ends[None, :] <= row[:, None]
        seq = tl.sum(before.to(tl.int32), 1)
        done = tl.sum(tl.where(before, counts[None, :], 0), 1)
        live = row < total
        keep = row < n_rows
        tl.store(table_ptr + 2 * row, tl.where(live, seq, seq_pad), mask=keep)
        tl.store(
            table_ptr + 2 * row + 1, tl.where(live, row - done, offset_pad), mask=keep
        )


@triton.jit(do_not_specialize=["bs"])
def _fill_linear_prefill_tables(
    lens_ptr,  # [>= bs] extend lengths
    prefix_ptr,  # [>= bs] cached-prefix lengths
    slot_src_ptr,  # [>= bs] mamba state slots
    track_mask_ptr,  # [>= bs] (HAS_TRACK)
    track_len_ptr,  # [>= bs] sequence length at the snapshot (HAS_TRACK)
    track_slot_ptr,  # [>= bs] snapshot slots (HAS_TRACK)
    cu_seqlens_ptr,  # [max_seqs + 1] int32
    chunk_indices_ptr,  # [max_chunks, 2] int32
    chunk_offsets_ptr,  # [max_seqs + 1] int32
    conv_block_table_ptr,  # [max_conv_blocks, 2] int32
    track_chunk_idx_ptr,  # [max_seqs] int32
    track_mode_ptr,  # [max_seqs] int32
    track_conv_start_ptr,  # [max_seqs] int32
    num_logical_tokens_ptr,  # [1] int32
    cache_indices_ptr,  # [max_seqs]
    has_initial_state_ptr,  # [max_seqs] bool
    track_dst_ptr,  # [max_seqs] int64 (HAS_TRACK)
    bs,
    max_seqs,
    max_chunks,
    max_conv_blocks,
    HAS_TRACK: tl.constexpr,
    CHUNK: tl.constexpr,  # delta-rule chunk (64)
    CONV_BLOCK: tl.constexpr,  # conv kernel block (CAUSAL_CONV1D_FWD_BLOCK_M)
    STATE_CHUNK: tl.constexpr,  # the backend's mamba_chunk_size
    CACHE_CHUNK: tl.constexpr,  # mamba_cache_chunk_size()
    CONV_LEN: tl.constexpr,  # conv window, kernel_size - 1
    PAD_CHUNK: tl.constexpr,
    PAD_SLOT: tl.constexpr,
    TRACK_FINAL: tl.constexpr,
    TRACK_CHUNK: tl.constexpr,
    BLOCK_S: tl.constexpr,  # >= max_seqs, power of two
    BLOCK_R: tl.constexpr,  # table rows per step
):
    s = tl.arange(0, BLOCK_S)
    real = s < bs
    in_table = s < max_seqs
    first = s == 0
    zero = tl.zeros([BLOCK_S], dtype=tl.int32)

    lens = tl.load(lens_ptr + s, mask=real, other=0).to(tl.int32)
    prefix = tl.load(prefix_ptr + s, mask=real, other=0).to(tl.int32)
    ends = tl.cumsum(lens, 0)
    starts = ends - lens
    total = tl.sum(lens, 0)
    tl.store(cu_seqlens_ptr + s, zero, mask=first)
    tl.store(cu_seqlens_ptr + 1 + s, ends, mask=in_table)
    tl.store(num_logical_tokens_ptr + s, zero + total, mask=first)

    # Delta-rule chunks: sequence-major (seq, chunk) rows, padded past the end
    # of every sequence so the chunk kernels return on their bounds guard.
    n_chunks = (lens + CHUNK - 1) // CHUNK
    chunk_ends = tl.cumsum(n_chunks, 0)
    total_chunks = tl.sum(n_chunks, 0)
    tl.store(chunk_offsets_ptr + s, zero, mask=first)
    tl.store(chunk_offsets_ptr + 1 + s, chunk_ends, mask=in_table)
    _store_segment_rows(
        chunk_indices_ptr, n_chunks, chunk_ends, total_chunks, max_chunks, 0, PAD_CHUNK,
        BLOCK_R,
    )  # fmt: skip

    # Conv blocks: (seq, block) rows, PAD_SLOT past the batch.
    n_blocks = (lens + CONV_BLOCK - 1) // CONV_BLOCK
    block_ends = tl.cumsum(n_blocks, 0)
    total_blocks = tl.sum(n_blocks, 0)
    _store_segment_rows(
        conv_block_table_ptr, n_blocks, block_ends, total_blocks, max_conv_blocks,
        PAD_SLOT, 0, BLOCK_R,
    )  # fmt: skip

    # Per-sequence state slots: PAD_SLOT past the batch (no work, no write).
    slots = tl.load(slot_src_ptr + s, mask=real, other=PAD_SLOT)
    tl.store(cache_indices_ptr + s, tl.where(real, slots, PAD_SLOT), mask=in_table)
    tl.store(has_initial_state_ptr + s, real & (prefix > 0), mask=in_table)

    # Prefix-cache snapshots (build_prefill_track_plan, mamba2=False): a tracked
    # row whose tracked length is chunk-aligned keeps its final state, any other
    # the state at its last chunk boundary; its conv window ends at the
    # cache-chunk-aligned length.
    mode = zero
    chunk_idx = zero - 1
    conv_start = zero
    if HAS_TRACK:
        tracked = tl.load(track_mask_ptr + s, mask=real, other=0) != 0
        track_len = tl.load(track_len_ptr + s, mask=real, other=0).to(tl.int32)
        length = track_len - prefix
        aligned = (length % STATE_CHUNK) == 0
        mode = tl.where(tracked, tl.where(aligned, TRACK_FINAL, TRACK_CHUNK), 0)
        chunk_idx = tl.where(tracked & (~aligned), length // STATE_CHUNK, -1)
        conv_start = tl.where(
            tracked, starts + (length // CACHE_CHUNK) * CACHE_CHUNK - CONV_LEN, 0
        )
        dst = tl.load(track_slot_ptr + s, mask=real, other=0)
        tl.store(track_dst_ptr + s, dst.to(tl.int64), mask=real & in_table)
    tl.store(track_chunk_idx_ptr + s, chunk_idx, mask=in_table)
    tl.store(track_mode_ptr + s, mode, mask=in_table)
    tl.store(track_conv_start_ptr + s, conv_start, mask=in_table)


class TableViews(NamedTuple):
    """The static tables of one bucket (sglang's KDAPrefillGraphMetadata fields)."""

    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    conv_block_table: torch.Tensor
    track_chunk_idx: torch.Tensor
    track_mode: torch.Tensor
    track_conv_start: torch.Tensor
    num_logical_tokens: torch.Tensor
    cache_indices: torch.Tensor
    has_initial_state: torch.Tensor
    track_dst: torch.Tensor


class TrackInputs(NamedTuple):
    """The batch's prefix-cache track inputs, on the device."""

    mask: torch.Tensor
    seq_lens: torch.Tensor
    slots: torch.Tensor


class TableConstants(NamedTuple):
    chunk: int
    conv_block: int
    state_chunk: int
    cache_chunk: int
    conv_len: int
    pad_chunk: int
    pad_slot: int
    track_final: int
    track_chunk: int


def fill_linear_prefill_tables(
    tables: TableViews,
    *,
    bs: int,
    max_seqs: int,
    extend_seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    slots: torch.Tensor,
    track: TrackInputs | None,
    constants: TableConstants,
) -> None:
    """Fill ``tables`` for the first ``bs`` rows of the batch tensors: one
    launch, no host read of device data."""
    if extend_seq_lens.device.type == "cpu" and not _interpreting():
        _fill_with_torch(
            tables,
            bs=bs,
            max_seqs=max_seqs,
            extend_seq_lens=extend_seq_lens,
            extend_prefix_lens=extend_prefix_lens,
            slots=slots,
            track=track,
            c=constants,
        )
        return
    block_s = max(16, triton.next_power_of_2(max_seqs))
    block_r = max(16, min(128, 4096 // block_s))
    has_track = track is not None
    if track is None:  # unused pointers
        track = TrackInputs(extend_seq_lens, extend_seq_lens, extend_seq_lens)
    _fill_linear_prefill_tables[(1,)](
        extend_seq_lens,
        extend_prefix_lens,
        slots,
        track.mask,
        track.seq_lens,
        track.slots,
        *tables,
        bs,
        max_seqs,
        tables.chunk_indices.shape[0],
        tables.conv_block_table.shape[0],
        HAS_TRACK=has_track,
        CHUNK=constants.chunk,
        CONV_BLOCK=constants.conv_block,
        STATE_CHUNK=constants.state_chunk,
        CACHE_CHUNK=constants.cache_chunk,
        CONV_LEN=constants.conv_len,
        PAD_CHUNK=constants.pad_chunk,
        PAD_SLOT=constants.pad_slot,
        TRACK_FINAL=constants.track_final,
        TRACK_CHUNK=constants.track_chunk,
        BLOCK_S=block_s,
        BLOCK_R=block_r,
        num_warps=4,
    )


def _interpreting() -> bool:
    return isinstance(_fill_linear_prefill_tables, InterpretedFunction)


def _fill_with_torch(
    tables, *, bs, max_seqs, extend_seq_lens, extend_prefix_lens, slots, track, c
):
    """The kernel's steps as torch ops, for tensors off CUDA."""
    device = tables.cu_seqlens.device
    s = torch.arange(max_seqs, device=device)
    real = s < bs

    def rows(src, fill=0):
        out = torch.full((max_seqs,), fill, dtype=torch.int64, device=device)
        out[:bs] = src[:bs].to(torch.int64)
        return out

    lens, prefix = rows(extend_seq_lens), rows(extend_prefix_lens)
    ends = lens.cumsum(0)
    starts = ends - lens
    tables.cu_seqlens[0] = 0
    tables.cu_seqlens[1:] = ends
    tables.num_logical_tokens.copy_(ends[-1:])

    def pairs(table, counts, pad):
        row = torch.arange(table.shape[0], device=device)
        before = counts.cumsum(0)[None, :] <= row[:, None]
        seq = before.sum(1)
        done = torch.where(before, counts[None, :], 0).sum(1)
        live = row < counts.sum()
        table[:, 0] = torch.where(live, seq, pad[0])
        table[:, 1] = torch.where(live, row - done, pad[1])
        return counts.cumsum(0)

    n_chunks = (lens + c.chunk - 1) // c.chunk
    tables.chunk_offsets[0] = 0
    tables.chunk_offsets[1:] = pairs(tables.chunk_indices, n_chunks, (0, c.pad_chunk))
    n_blocks = (lens + c.conv_block - 1) // c.conv_block
    pairs(tables.conv_block_table, n_blocks, (c.pad_slot, 0))

    tables.cache_indices.copy_(rows(slots, c.pad_slot))
    tables.has_initial_state.copy_(real & (prefix > 0))

    mode = torch.zeros_like(s)
    chunk_idx = torch.full_like(s, -1)
    conv_start = torch.zeros_like(s)
    if track is not None:
        tracked = rows(track.mask) != 0
        length = rows(track.seq_lens) - prefix
        aligned = length % c.state_chunk == 0
        mode = torch.where(
            tracked,
            torch.where(aligned, c.track_final, c.track_chunk),
            0,
        )
        chunk_idx = torch.where(tracked & ~aligned, length // c.state_chunk, -1)
        conv_start = torch.where(
            tracked,
            starts + length // c.cache_chunk * c.cache_chunk - c.conv_len,
            0,
        )
        tables.track_dst[:bs] = track.slots[:bs]
    tables.track_chunk_idx.copy_(chunk_idx)
    tables.track_mode.copy_(mode)
    tables.track_conv_start.copy_(conv_start)
