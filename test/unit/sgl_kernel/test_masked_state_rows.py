"""sgl-kernel's masked state-row gather / scatter (the per-request GDN states
of a captured FlashInfer prefill) in Triton's CPU interpreter, and its torch
path off CUDA, on random tables padded with slot -1 at random rows: real rows
equal the torch reference, padding rows are neither read into the rows nor
written to the pool, the reserved padding slot stays zero."""

from pathlib import Path

import masked_state_rows_cases as cases
import pytest
from triton_interpreter import run_interpreted

SCRIPT = Path(__file__).with_name("interpret_masked_state_rows.py")
CASES = 30


@pytest.fixture(scope="module")
def results():
    return run_interpreted(SCRIPT, timeout=300, CASES=str(CASES))


def test_the_cases_cover_padding_dtypes_and_strides(results):
    results = [r for r in results if not r.get("snapshot")]
    assert len(results) == CASES
    assert any(r["real"] == 0 for r in results)  # every row padding
    assert any(r["real"] == r["rows"] > 1 for r in results)  # no padding
    assert any(0 < r["real"] < r["rows"] for r in results)
    assert {r["dtype"] for r in results} == {"torch.float32", "torch.bfloat16"}
    assert any(r["strided"] for r in results) and not all(r["strided"] for r in results)


def test_kernel_copies_only_the_real_rows(results):
    bad = [r for r in results if not r.get("snapshot") and r["mismatches"]]
    assert not bad, bad


@pytest.mark.parametrize("seed", range(CASES))
def test_torch_path_copies_only_the_real_rows(seed):
    assert cases.mismatches(cases.make_case(seed)) == []


def test_snapshot_cases_cover_every_mode_fillers_dtypes_and_strides(results):
    snapshots = [r for r in results if r.get("snapshot")]
    assert len(snapshots) == CASES
    assert {m for r in snapshots for m in r["modes"]} == {0, 1, 2, 3}
    assert any(r["modes"] == [0] for r in snapshots)  # fillers only
    assert any(len(r["modes"]) == 4 for r in snapshots)  # every mode in one plan
    assert {r["dtype"] for r in snapshots} == {"torch.float32", "torch.bfloat16"}
    assert {r["strided"] for r in snapshots} == {True, False}


def test_snapshot_kernel_writes_each_tracked_row_from_its_source(results):
    """snapshot_state_rows (MAMBA2_SNAPSHOT_KERNEL): final rows from the pool's
    request slot, grid rows from the chunk-grid state, recompute rows from the
    recomputed state, each into its track slot; fillers write nothing."""
    bad = [r for r in results if r.get("snapshot") and r["mismatches"]]
    assert not bad, bad


@pytest.mark.parametrize("seed", range(CASES))
def test_snapshot_torch_path_writes_each_tracked_row_from_its_source(seed):
    assert cases.snapshot_mismatches(cases.make_snapshot_case(seed)) == []


def test_snapshot_refuses_rows_that_do_not_match_the_pool():
    case = cases.make_snapshot_case(1)
    with pytest.raises(ValueError, match="do not match the pool"):
        cases.snapshot_state_rows(
            case["pool"], case["dst"], case["mode"], cache_slots=case["cache_slots"],
            src=case["src"], grid=case["grid"], grid_rows=case["grid_rows"],
            recomputed=case["recomputed"][:, :1], modes=(1, 2, 3),
        )  # fmt: skip


def test_snapshot_kernel_ships_off():
    """Off until a GPU runs it (MAMBA2_SNAPSHOT_KERNEL's comment)."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    assert capability.MAMBA2_SNAPSHOT_KERNEL is False
