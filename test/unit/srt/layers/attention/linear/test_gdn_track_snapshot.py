"""GDN_TRACK_SNAPSHOT_KERNEL: the captured GDN extend's prefix-cache snapshot in
one launch of sgl-kernel's snapshot_state_rows writes the pool exactly as
sglang's gather and kda_track_ssm_state do, on tables a replay refilled through
sglang's table hooks, for Triton's chunk states and FlashInfer's checkpoints;
both kernels run in Triton's CPU interpreter (interpret_gdn_track_snapshot.py)."""

from pathlib import Path

import pytest
from triton_interpreter import run_interpreted

from sglang.kernels.ops.mamba.kda_prefill_track import (
    TRACK_CHUNK_STATE,
    TRACK_FINAL_STATE,
    TRACK_NONE,
)
from sglang_graphfix.srt import full_prefill_graph_capability as capability

SCRIPT = Path(__file__).with_name("interpret_gdn_track_snapshot.py")
CASES = 3


@pytest.fixture(scope="module")
def results():
    return run_interpreted(SCRIPT, timeout=300, CASES=str(CASES))


def test_the_cases_cover_every_track_mode_and_both_kernels(results):
    assert len(results) == 2 * CASES
    assert {r["flashinfer"] for r in results} == {True, False}
    for r in results:
        assert {TRACK_CHUNK_STATE, TRACK_FINAL_STATE, TRACK_NONE} <= set(r["modes"])
        assert r["slots_written"]  # sglang's kernel wrote the tracked rows' slots


def test_the_snapshot_kernel_writes_the_pool_as_sglangs_kernel_does(results):
    bad = [r for r in results if not r["equal"]]
    assert not bad, bad


def test_a_wrong_source_row_is_detected(results):
    """Can-fail control: each row's chunk state read one row on."""
    assert all(r["control_differs"] for r in results), results


def test_the_switch_picks_one_launch_of_the_snapshot_kernel(results):
    for r in results:
        assert r["launches_off"] == {"snapshot_state_rows": 0, "kda_track": 1}, r
        assert r["launches_on"] == {"snapshot_state_rows": 1, "kda_track": 0}, r


def test_the_snapshot_kernel_ships_off():
    """Off until a GPU runs it (GDN_TRACK_SNAPSHOT_KERNEL's comment)."""
    assert capability.GDN_TRACK_SNAPSHOT_KERNEL is False
