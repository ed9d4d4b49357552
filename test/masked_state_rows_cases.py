"""Cases for sgl-kernel's masked_state_rows (gather / scatter of per-request
state rows) on random prefill-graph tables: request slots padded with slot -1 at
random rows, real slots scattered over the pool (never the reserved padding
slot 0, which holds zeros), fp32 and bf16 pools, contiguous and slot-strided
pools, rows of several programs with a tail. Each result is compared with a
plain torch reference; the padding rows are NaN on the side that must not be
read or written, so an ignored mask shows. Shared by the CPU test (Triton's
interpreter, test/unit/sgl_kernel/interpret_masked_state_rows.py) and the
in-process torch path (test/unit/sgl_kernel/test_masked_state_rows.py)."""

import torch

from sglang_graphfix_kernel.masked_state_rows import (
    gather_state_rows,
    scatter_state_rows,
)

POOL_SLOTS = 12
STATE = (3, 40, 50)  # 6000 elements: two 4096-element programs, the second a tail


def make_case(seed, *, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 9, (1,), generator=g))
    real = int(torch.randint(0, rows + 1, (1,), generator=g))
    slots = torch.full((rows,), -1, dtype=torch.int32)
    where = torch.randperm(rows, generator=g)[:real]
    slots[where] = (torch.randperm(POOL_SLOTS - 1, generator=g)[:real] + 1).int()
    dtype = (torch.float32, torch.bfloat16)[seed % 2]
    base = torch.randn(POOL_SLOTS, 2, *STATE, generator=g).to(dtype).to(device)
    # One seed in three: the pool is a slot-strided view (one layer of a
    # [slots, 2, ...] buffer), as sglang's envelope-strided pools can be.
    strided = seed % 3 == 1
    pool = base[:, 1] if strided else base[:, 1].contiguous()
    pool[0] = 0  # the reserved padding slot
    return {
        "seed": seed,
        "rows": rows,
        "real": real,
        "strided": strided,
        "slots": slots.to(device),
        "pool": pool,
        "other_layer": base[:, 0],
        "values": torch.randn(rows, *STATE, generator=g).to(device),
    }


def mismatches(case, *, interpreted=False) -> list:
    """What gather_state_rows and scatter_state_rows get wrong on ``case``
    (``interpreted``: in Triton's interpreter)."""
    slots, pool, values = case["slots"], case["pool"], case["values"]
    real = (slots >= 0).cpu()
    bad = []

    # Gather into fp32 rows that hold NaN: padding rows must keep it.
    rows = torch.full_like(values, float("nan"))
    gather_state_rows(pool, slots, rows)
    want = torch.full_like(values, float("nan")).cpu()
    want[real] = pool.cpu()[slots.cpu()[real].long()].float()
    if not torch.equal(rows.cpu().isnan(), want.isnan()):
        bad.append("gather: padding rows written or real rows left unset")
    if not torch.equal(rows.cpu().nan_to_num(), want.nan_to_num()):
        bad.append("gather: values")

    # Scatter rows whose padding rows are NaN: the pool must never see it.
    values = values.clone()
    values[~real.to(values.device)] = float("nan")
    before = pool.clone().cpu()
    other_layer = case["other_layer"].clone().cpu()
    scatter_state_rows(pool, slots, values)
    got, picked = pool.cpu(), slots.cpu()[real].long()
    want = before.clone()
    want[picked] = values.cpu()[real].to(pool.dtype)
    ok = got == want
    if interpreted and pool.dtype == torch.bfloat16:
        # Triton's interpreter rounds fp32 -> bf16 toward zero (the GPU, like
        # torch, to nearest even): either rounding passes there.
        want[picked] = _bf16_toward_zero(values.cpu()[real])
        ok |= got == want
    if pool.isnan().any():
        bad.append("scatter: a padding row was written")
    if not ok.all():
        bad.append("scatter: values")
    if not torch.equal(case["other_layer"].cpu(), other_layer):
        bad.append("scatter: wrote outside the pool's view")
    if pool[0].any():
        bad.append("scatter: the padding slot is not zero")
    return bad


def _bf16_toward_zero(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 by dropping the low 16 bits."""
    return (x.float().view(torch.int32) & -65536).view(torch.float32).bfloat16()
