"""Cases for sgl-kernel's masked_state_rows (gather / scatter of per-request
state rows; and a Mamba2 graph's snapshot of track rows, make_snapshot_case)
on random prefill-graph tables: request slots padded with slot -1 at random
rows, real slots scattered over the pool (never the reserved padding
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
    snapshot_state_rows,
)

POOL_SLOTS = 12
STATE = (3, 40, 50)  # 6000 elements: two 4096-element programs, the second a tail


def _pool(seed, g, device):
    """A pool of POOL_SLOTS slots, fp32 or bf16 by the seed's parity, its
    padding slot zero; one seed in three a slot-strided view (one layer of a
    [slots, 2, ...] buffer, as sglang's envelope-strided pools can be), with
    the neighbouring layer beside it. Made on the device before the view: a
    strided view moved there would come out contiguous."""
    dtype = (torch.float32, torch.bfloat16)[seed % 2]
    base = torch.randn(POOL_SLOTS, 2, *STATE, generator=g).to(dtype).to(device)
    strided = seed % 3 == 1
    pool = base[:, 1] if strided else base[:, 1].contiguous()
    pool[0] = 0  # the reserved padding slot
    return pool, base[:, 0], strided


def make_case(seed, *, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 9, (1,), generator=g))
    real = int(torch.randint(0, rows + 1, (1,), generator=g))
    slots = torch.full((rows,), -1, dtype=torch.int32)
    where = torch.randperm(rows, generator=g)[:real]
    slots[where] = (torch.randperm(POOL_SLOTS - 1, generator=g)[:real] + 1).int()
    pool, other_layer, strided = _pool(seed, g, device)
    return {
        "seed": seed,
        "rows": rows,
        "real": real,
        "strided": strided,
        "slots": slots.to(device),
        "pool": pool,
        "other_layer": other_layer,
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


# ---- snapshot_state_rows: a Mamba2 graph's prefix-cache snapshot ----

NONE, FINAL, GRID, RECOMPUTE = (
    0,
    1,
    2,
    3,
)  # the track plan's modes (mamba2_prefill_graph)
GRID_ROWS = 5  # chunk-grid states of the extend (h[0])


def make_snapshot_case(seed, *, device="cpu"):
    """K track rows with random modes, untracked fillers among them (their
    destination the padding slot 0, as the plan's); request cache slots 1-5 for
    the final rows' sources, track slots 6-11 for the tracked rows'
    destinations (distinct); the grid and recomputed states fp32, the pool fp32
    or bf16, contiguous or slot-strided."""
    g = torch.Generator().manual_seed(seed)
    k = int(torch.randint(1, 7, (1,), generator=g))
    mode = torch.randint(0, 4, (k,), generator=g)
    if seed % 5 == 0:
        mode[:] = NONE  # fillers only
    requests = 1 + torch.randperm(5, generator=g)[:3]  # the batch's cache slots
    cache_slots = torch.cat([requests, torch.zeros(1, dtype=torch.int64)])  # + tail
    src = torch.randint(0, 3, (k,), generator=g)
    src[mode == NONE] = 3  # a filler's sequence: the tail
    dst = torch.zeros(k, dtype=torch.int64)
    tracked = mode != NONE
    dst[tracked] = 6 + torch.randperm(6, generator=g)[: int(tracked.sum())]
    pool, other_layer, strided = _pool(seed, g, device)
    return {
        "seed": seed,
        "rows": k,
        "modes": sorted(set(mode.tolist())),
        "strided": strided,
        "pool": pool,
        "other_layer": other_layer,
        "dst": dst.to(device),
        "mode": mode.int().to(device),  # int32, as the track plan's
        "cache_slots": cache_slots.int().to(device),
        "src": src.to(device),
        "grid": torch.randn(GRID_ROWS, *STATE, generator=g).to(device),
        "grid_rows": torch.randint(0, GRID_ROWS, (k,), generator=g).to(device),
        "recomputed": torch.randn(k, *STATE, generator=g).to(device),
    }


def snapshot_mismatches(case, *, interpreted=False) -> list:
    """What snapshot_state_rows gets wrong on ``case`` against the torch
    reference (each tracked row's source by its mode, read before any write;
    untracked rows write nothing, so the padding slot stays zero)."""
    pool = case["pool"]
    before = pool.cpu().clone()
    other_layer = case["other_layer"].cpu().clone()
    mode, dst = case["mode"].cpu(), case["dst"].cpu()
    sources = {
        FINAL: before[case["cache_slots"].cpu().long()[case["src"].cpu()]].float(),
        GRID: case["grid"].cpu()[case["grid_rows"].cpu()],
        RECOMPUTE: case["recomputed"].cpu(),
    }
    want = before.clone()
    rounded = before.clone()  # fp32 -> bf16 toward zero (the interpreter's)
    for m, rows in sources.items():
        picked = mode == m
        want[dst[picked]] = rows[picked].to(pool.dtype)
        if pool.dtype == torch.bfloat16:
            rounded[dst[picked]] = _bf16_toward_zero(rows[picked])
    snapshot_state_rows(
        pool, case["dst"], case["mode"], cache_slots=case["cache_slots"],
        src=case["src"], grid=case["grid"], grid_rows=case["grid_rows"],
        recomputed=case["recomputed"], modes=(FINAL, GRID, RECOMPUTE),
    )  # fmt: skip
    got = pool.cpu()
    ok = got == want
    if interpreted and pool.dtype == torch.bfloat16:
        ok |= got == rounded
    bad = []
    if not ok.all():
        bad.append("snapshot: values")
    if got[0].any():
        bad.append("snapshot: an untracked row wrote the padding slot")
    if not torch.equal(case["other_layer"].cpu(), other_layer):
        bad.append("snapshot: wrote outside the pool's view")
    return bad
