# SPDX-License-Identifier: Apache-2.0
"""Per-request state rows to and from a state pool, skipping padding rows.

A captured prefill has one row per request slot of its bucket (16 with sglang's
default chunking), whatever the number of requests replayed on it; the slots
without a request carry a negative slot id. ``pool[slots]`` / ``index_copy_``
move every row, padding included: a 2 MiB fp32 GDN state per row and layer at
Qwen3-Next-80B dims. These copy only the rows whose slot id is ``>= 0``: a
padding row's program returns before any load or store, so the launch grid
stays fixed (it is replayed in a CUDA graph) while the bytes moved follow the
real requests.

- ``gather_state_rows(pool, slots, rows)``: ``rows[r] = pool[slots[r]]`` (cast
  to ``rows``' dtype); padding rows of ``rows`` are left as they were.
- ``scatter_state_rows(pool, slots, rows)``: ``pool[slots[r]] = rows[r]`` (cast
  to the pool's dtype); padding rows write nothing.
- ``snapshot_state_rows(pool, dst, mode, ...)``: a captured Mamba2 (or GDN)
  extend's prefix-cache snapshot, one launch a layer: per track row, by its
  mode, the request's post-extend state from the pool, a chunk-grid state or a
  recomputed one, written to the row's track slot; an untracked row (a filler)
  moves nothing.

``pool`` may have any slot stride (sglang's pools can be views into a larger
buffer), but each slot must be contiguous; ``rows`` is contiguous. Off CUDA (the
CPU tests, in-process) the same copies are torch ops (``_copy_with_torch``); the
kernel itself runs in Triton's interpreter in a fresh process
(test/unit/sgl_kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

_BLOCK = 4096  # elements per program


@triton.jit
def _copy_state_rows(
    pool_ptr, rows_ptr, slots_ptr, pool_slot_stride, row_numel,
    GATHER: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if slot < 0:  # a padding row: no load, no store
        return
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row_numel
    pool_at = pool_ptr + slot * pool_slot_stride + offs
    rows_at = rows_ptr + row * row_numel + offs
    if GATHER:
        val = tl.load(pool_at, mask=mask)
        tl.store(rows_at, val.to(rows_ptr.dtype.element_ty), mask=mask)
    else:
        val = tl.load(rows_at, mask=mask)
        tl.store(pool_at, val.to(pool_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _snapshot_state_rows(
    pool_ptr, dst_ptr, mode_ptr, cache_slots_ptr, src_ptr, grid_ptr, grid_rows_ptr,
    rec_ptr, pool_slot_stride, grid_row_stride, rec_row_stride, row_numel,
    FINAL: tl.constexpr, GRID: tl.constexpr, RECOMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    mode = tl.load(mode_ptr + row)
    if (mode != FINAL) & (mode != GRID) & (mode != RECOMPUTE):
        return  # an untracked row: no load, no store
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row_numel
    out = pool_ptr.dtype.element_ty
    if mode == FINAL:
        slot = tl.load(cache_slots_ptr + tl.load(src_ptr + row)).to(tl.int64)
        val = tl.load(pool_ptr + slot * pool_slot_stride + offs, mask=mask).to(out)
    elif mode == GRID:
        at = tl.load(grid_rows_ptr + row).to(tl.int64)
        val = tl.load(grid_ptr + at * grid_row_stride + offs, mask=mask).to(out)
    else:
        val = tl.load(rec_ptr + row * rec_row_stride + offs, mask=mask).to(out)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    tl.store(pool_ptr + dst * pool_slot_stride + offs, val, mask=mask)


def snapshot_state_rows(
    pool: torch.Tensor,
    dst: torch.Tensor,
    mode: torch.Tensor,
    *,
    cache_slots: torch.Tensor,
    src: torch.Tensor,
    grid: torch.Tensor,
    grid_rows: torch.Tensor,
    recomputed: torch.Tensor,
    modes: tuple[int, int, int],
) -> None:
    """For every track row ``k`` whose ``mode[k]`` is one of ``modes`` (final,
    grid, recompute): ``pool[dst[k]] =`` ``pool[cache_slots[src[k]]]`` (final),
    ``grid[grid_rows[k]]`` (grid) or ``recomputed[k]`` (recompute), cast to the
    pool's dtype; other rows write nothing. The track slots ``dst`` must not be
    a final row's source slot (sglang's track slots are the requests' extra
    buffer slots): the rows are copied in parallel."""
    K, state = dst.shape[0], pool.shape[1:]
    if (
        mode.shape != (K,) or src.shape != (K,) or grid_rows.shape != (K,)
        or recomputed.shape != (K, *state) or grid.shape[1:] != state
    ):  # fmt: skip
        raise ValueError(
            f"track rows {tuple(dst.shape)} (mode {tuple(mode.shape)}, src "
            f"{tuple(src.shape)}, grid rows {tuple(grid_rows.shape)}, recomputed "
            f"{tuple(recomputed.shape)}, grid {tuple(grid.shape)}) do not match the "
            f"pool {tuple(pool.shape)}"
        )
    for name, t in (("pool", pool), ("grid", grid), ("recomputed", recomputed)):
        if not t[:1].is_contiguous():
            raise ValueError(f"each {name} row must be contiguous")
    if pool.device.type == "cpu" and not _interpreting():
        final, on_grid, recompute = modes
        for m, rows in (
            (final, pool[cache_slots.to(torch.int64)[src]]),
            (on_grid, grid[grid_rows]),
            (recompute, recomputed),
        ):
            picked = mode == m
            pool[dst[picked]] = rows[picked].to(pool.dtype)
        return
    if K == 0:
        return
    row_numel = pool[0].numel()
    final, on_grid, recompute = modes
    _snapshot_state_rows[(K, triton.cdiv(row_numel, _BLOCK))](
        pool, dst, mode, cache_slots, src, grid, grid_rows, recomputed,
        pool.stride(0), grid.stride(0), recomputed.stride(0), row_numel,
        FINAL=final, GRID=on_grid, RECOMPUTE=recompute, BLOCK=_BLOCK, num_warps=8,
    )  # fmt: skip


def gather_state_rows(
    pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor
) -> None:
    """``rows[r] = pool[slots[r]]`` for every ``r`` with ``slots[r] >= 0``."""
    _copy(pool, slots, rows, gather=True)


def scatter_state_rows(
    pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor
) -> None:
    """``pool[slots[r]] = rows[r]`` for every ``r`` with ``slots[r] >= 0``."""
    _copy(pool, slots, rows, gather=False)


def _copy(pool, slots, rows, *, gather: bool) -> None:
    if rows.shape[1:] != pool.shape[1:] or slots.shape != rows.shape[:1]:
        raise ValueError(
            f"state rows {tuple(rows.shape)} with slots {tuple(slots.shape)} do not "
            f"match the pool {tuple(pool.shape)}"
        )
    if not rows.is_contiguous() or not pool[:1].is_contiguous():
        raise ValueError("state rows and each pool slot must be contiguous")
    if pool.device.type == "cpu" and not _interpreting():
        _copy_with_torch(pool, slots, rows, gather=gather)
        return
    if rows.shape[0] == 0:
        return  # nothing to copy (and no zero-program launch)
    row_numel = rows[0].numel()
    grid = (rows.shape[0], triton.cdiv(row_numel, _BLOCK))
    _copy_state_rows[grid](
        pool, rows, slots, pool.stride(0), row_numel, GATHER=gather, BLOCK=_BLOCK,
        num_warps=8,
    )  # fmt: skip


def _interpreting() -> bool:
    return isinstance(_copy_state_rows, InterpretedFunction)


def _copy_with_torch(pool, slots, rows, *, gather: bool) -> None:
    """The kernel's copies as torch ops, for tensors off CUDA."""
    real = slots >= 0
    picked = slots[real].to(torch.int64)
    if gather:
        rows[real] = pool[picked].to(rows.dtype)
    else:
        pool[picked] = rows[real].to(pool.dtype)
