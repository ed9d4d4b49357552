"""sgl-kernel's Mamba2 prefill-graph table fill (one Triton program) in Triton's
CPU interpreter, on test/mamba2_prefill_graph_cases.py's random batches padded as
the full prefill runner pads a replay and on batches of a served graph's shapes
(PRODUCTION_SHAPES: up to 48 request slots, 8192 tokens), and on each bucket's
capture batch, with
and without the conv block table and a snapshot plan: every table equals the
torch fill (Mamba2PrefillGraphTables.fill, Mamba2PrefillTrackTables.fill), which
test_mamba2_prefill_graph.py holds against sglang's eager builders."""

from pathlib import Path

import pytest
from mamba2_prefill_graph_cases import PRODUCTION_SHAPES
from triton_interpreter import run_interpreted

SCRIPT = Path(__file__).with_name("interpret_mamba2_prefill_tables.py")
CASES = 24


@pytest.fixture(scope="module")
def results():
    return run_interpreted(SCRIPT, timeout=600, CASES=str(CASES))


def test_the_cases_cover_padding_prefixes_snapshots_and_both_conv_launches(results):
    assert len(results) == 2 * (CASES + len(PRODUCTION_SHAPES))
    # A served graph's shapes: lane widths 16, 32 and 64, buckets of 8192 tokens.
    assert {r["slots"] for r in results} >= {1, 16, 17, 48}
    assert max(r["bucket"] for r in results) == 8192
    replays = [r for r in results if r["batch"] == "replay"]
    assert any(r["tracked"] for r in replays)
    assert any(r["track_rows"] and not r["tracked"] for r in results)  # fillers only
    assert any(not r["track_rows"] for r in results)
    assert any(r["requests"] < r["slots"] for r in replays)
    assert {r["conv_blocks"] for r in results} == {True, False}


def test_kernel_tables_equal_the_torch_fill(results):
    bad = [r for r in results if r["mismatches"]]
    assert not bad, bad


def test_more_request_slots_than_one_launch_takes_refill_with_torch(monkeypatch):
    """The kernel's snapshot plan holds a [slots + 1]-square tile, which Triton
    refuses above 2**20 elements: above MAX_REQUEST_SLOTS the launcher refuses
    before compiling, and the runner's tables refill with the torch fills."""
    from types import SimpleNamespace

    import torch
    import triton

    from sglang_graphfix.srt import full_prefill_graph_capability as capability
    from sglang_graphfix.srt.layers.attention.mamba import mamba2_prefill_graph
    from sglang_graphfix_kernel import mamba2_prefill_tables as kernel

    most = kernel.MAX_REQUEST_SLOTS
    assert triton.next_power_of_2(most + 1) ** 2 <= 1 << 20  # the launch's tile
    with pytest.raises(ValueError, match=f"{most + 1} request slots"):
        kernel.fill_mamba2_prefill_tables(
            None, None, extend_seq_lens=torch.zeros(most + 1, dtype=torch.int32),
            extend_prefix_lens=None, slots=None, track_mask=None,
            track_seq_lens=None, track_slots=None, constants=None,
        )  # fmt: skip

    def tables(slots, device="cuda"):
        return SimpleNamespace(
            seq_idx=SimpleNamespace(device=torch.device(device)), max_requests=slots
        )

    monkeypatch.setattr(capability, "MAMBA2_TABLE_FILL_KERNEL", True)
    on_device = mamba2_prefill_graph.fills_on_device
    assert on_device(tables(most)) and not on_device(tables(most + 1))
    assert not on_device(tables(16, "cpu"))
    monkeypatch.setattr(capability, "MAMBA2_TABLE_FILL_KERNEL", False)
    assert not on_device(tables(16))
