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
