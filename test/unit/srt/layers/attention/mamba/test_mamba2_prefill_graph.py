"""Mamba2 full prefill graph tables on CPU, against sglang's own eager builders.

Many random batches (test/mamba2_prefill_graph_cases.py), padded as the full
prefill runner pads a replay, with cached prefixes and prompts around the chunk
size: the static tables must describe the real batch exactly as
Mamba2AttnBackend.init_forward_metadata -> Mamba2Metadata.prepare_mixed does
(query_start_loc, seq_idx, has_initial_states, slots, chunk_indices /
chunk_offsets), the padded sequences as sglang's chunk helper does, the conv
blocks as sglang's KDAPrefillGraphMetadata.fill does; the fill must run on
tensors without data (no host read, shapes from the bucket only); and sglang's
own conv and SSD kernels, run in Triton's CPU interpreter over the whole bucket
on the tables, must reproduce the eager extend on the real batch."""

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import triton
from mamba2_prefill_graph_cases import (
    filled_tables,
    filled_track,
    mismatches,
    random_case,
    recompute_segment_errors,
    track_mismatches,
)
from triton_interpreter import run_interpreted

from sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph import (
    TRACK_FINAL_STATE,
    TRACK_GRID_STATE,
    TRACK_RECOMPUTE_STATE,
    max_conv_blocks,
    max_logical_chunks,
)

CASES = 400
INTERPRETED_CASES = 16
SCRIPT = Path(__file__).with_name("interpret_mamba2_prefill_graph.py")
DIFFS = (
    "conv_out",
    "conv_state",
    "conv_out_table",
    "conv_state_table",
    "ssd_out",
    "chunk_states",
    "varlen_state",
    "track_state",
)


@pytest.fixture(scope="module")
def cases():
    rng = random.Random(16)
    return [random_case(rng) for _ in range(CASES)]


def test_cases_cover_padding_prefixes_tails_and_chunk_edges(cases):
    assert any(len(c.lens) < c.slots for c in cases)  # zero-length request slots
    assert any(len(c.lens) == c.slots > 1 for c in cases)
    assert any(sum(c.lens) == c.bucket for c in cases)  # no tail
    assert any(any(c.prefix) for c in cases) and any(not any(c.prefix) for c in cases)
    assert any(any(n % c.chunk == 0 for n in c.lens) for c in cases)
    assert any(any(n % c.chunk == c.chunk - 1 for n in c.lens) for c in cases)
    assert any(any(n % c.chunk == 1 and n > 1 for n in c.lens) for c in cases)


def test_tables_equal_sglangs_eager_metadata(cases):
    bad = {}
    for i, case in enumerate(cases):
        found = mismatches(case, filled_tables(case))
        if found:
            bad[i] = (vars(case), found)
    assert not bad, bad


def test_track_plan_equals_sglangs_eager_track_selection(cases):
    bad, modes = {}, set()
    for i, case in enumerate(cases):
        tables = filled_tables(case)
        track = filled_track(case, tables)
        if track is None:
            continue
        modes.update(track.mode.tolist())
        found = track_mismatches(case, track) + recompute_segment_errors(tables, track)
        if found:
            bad[i] = (vars(case), found)
    assert not bad, bad
    assert {TRACK_FINAL_STATE, TRACK_GRID_STATE, TRACK_RECOMPUTE_STATE} <= modes


def test_bounds_are_reached_and_hold(cases):
    """Every request and the tail start off the chunk grid: the logical chunks
    fill the table exactly (and the comparison above saw no overflow)."""
    C, R = 8, 4
    case = SimpleNamespace(
        chunk=C, bucket=5 * C + 3, slots=R, lens=[3, 9, 5, 13], prefix=[0, 4, 0, 1],
        rows=[1, 2, 3, 4], tracked=None,
    )  # fmt: skip
    tables = filled_tables(case)
    assert tables.chunk_indices.shape[0] == max_logical_chunks(case.bucket, R, C)
    assert (tables.chunk_offsets < C).all()  # no inert row left
    assert tables.conv_block_table.shape[0] == max_conv_blocks(case.bucket, R)
    assert not mismatches(case, tables)


def test_a_wrong_table_is_detected(cases):
    case = next(
        c for c in cases if any(c.prefix) and 1 < len(c.lens) and sum(c.lens) < c.bucket
    )
    for field, index, delta in [
        ("chunk_offsets", 1, 1),
        ("chunk_indices", 1, 1),
        ("seq_idx", (0, 0), 1),
        ("query_start_loc", -2, 1),
        ("conv_block_table", (0, 1), 1),
        ("cache_indices", -1, 1),
    ]:
        tables = filled_tables(case)
        getattr(tables, field)[index] += delta
        assert mismatches(case, tables), field
    # The tail merged into the last request (no tail sequence) is caught too.
    tables = filled_tables(case)
    tables.seq_idx[tables.seq_idx == case.slots] = len(case.lens) - 1
    assert mismatches(case, tables)

    tracked = [(c, filled_track(c, filled_tables(c))) for c in cases if c.tracked]
    tracked = [(c, t) for c, t in tracked if t is not None]
    for field, mode in [
        ("mode", None),
        ("src", None),
        ("dst", None),
        ("conv_window", None),
        ("h_src", TRACK_GRID_STATE),  # read only by rows of its mode
        ("end_loc", TRACK_RECOMPUTE_STATE),
    ]:
        case, track = next(
            (c, t) for c, t in tracked if t.mode.max() > 0 and mode in (None, *t.mode)
        )
        getattr(track, field)[:] += 1
        assert track_mismatches(case, track), field


def test_fill_reads_no_device_data_on_the_host():
    """On the meta device tensors have shapes but no data: an .item(), a
    .tolist(), a nonzero() or any data-dependent shape would raise."""
    case = SimpleNamespace(
        chunk=16, bucket=96, slots=5, lens=[30, 1], prefix=[0, 7], rows=[3, 4],
        tracked=[True, False], track_lens=[20, 8], track_dst=[9, 9], cache_chunk=32,
    )  # fmt: skip
    tables = filled_tables(case, device="meta")
    track = filled_track(case, tables)
    assert tables.seq_idx.shape == (1, 96) and track.conv_window.shape == (3, 3)
    assert tables.chunk_indices.shape == (triton.cdiv(96, 16) + 5,)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=900, CASES=str(INTERPRETED_CASES))


def test_sglangs_kernels_on_the_tables_equal_the_eager_extend(interpreted):
    """sglang's causal_conv1d_fn (block_table) and mamba_chunk_scan_combined
    (always with initial states, snapshot rows for the tracked request slots) over the
    whole bucket on the tables give the eager extend's outputs, per-chunk,
    final, conv and prefix-cache snapshot states on the real batch, and finite
    values on the tail."""
    plain = [r for r in interpreted if not r["mutate"]]
    assert len(plain) == INTERPRETED_CASES
    assert any(r["prefix"] for r in plain) and not all(r["prefix"] for r in plain)
    assert any(r["requests"] < r["slots"] for r in plain)
    assert any(r["tokens"] < r["bucket"] for r in plain)
    modes = {m for r in plain for m in r["modes"]}
    assert {TRACK_FINAL_STATE, TRACK_GRID_STATE, TRACK_RECOMPUTE_STATE} <= modes
    bad = [r for r in plain if not r["finite"] or max(r[k] for k in DIFFS) > 1e-5]
    assert not bad, bad


def test_a_wrong_table_changes_the_kernels_results(interpreted):
    mutated = {}
    for r in interpreted:
        if r["mutate"]:
            mutated.setdefault(r["mutate"], []).append(max(r[k] for k in DIFFS))
    assert set(mutated) == {
        "inert-rows-at-offset-0",
        "tail-in-last-request",
        "recompute-end-off-by-one",
    }
    assert all(max(diffs) > 0.1 for diffs in mutated.values()), mutated


# ---- the backend's own call path (interpret_mamba2_backend.py) ----

BACKEND_SCRIPT = Path(__file__).with_name("interpret_mamba2_backend.py")
BACKEND_CASES = 16
BACKEND_DIFFS = ("out", "conv_pool", "ssm_pool")


# Seeds run again with MAMBA2_SNAPSHOT_KERNEL on: fillers only (0), final
# (3, 10: on 3 and 8 slots), grid (7) and recompute (14) snapshot rows.
SNAPSHOT_KERNEL_SEEDS = (0, 3, 7, 10, 14)


@pytest.fixture(scope="module")
def through_the_backend():
    return run_interpreted(
        BACKEND_SCRIPT, timeout=1500, CASES=str(BACKEND_CASES),
        SNAPSHOT_KERNEL_SEEDS=",".join(map(str, SNAPSHOT_KERNEL_SEEDS)),
    )  # fmt: skip


def test_captured_mamba2_extend_equals_sglangs_eager_extend(through_the_backend):
    """Mamba2AttnBackend.forward -> MambaMixer2.forward (upstream's code, sglang's
    kernels in Triton's interpreter) on the static metadata that
    HybridLinearAttnBackend.init_forward_metadata_out_graph (patched, switch on)
    gives the runner's capture batch and then its padded replay view: the real
    tokens' outputs and every conv/SSM pool slot but the padding slot (request
    slots, prefix-cache track slots, untouched slots) equal the eager extend's,
    through the Triton conv (NemotronH, Granite) and the conv wrapper
    (Falcon-H1), with and without track tables, in every snapshot mode, on graphs
    over all request slots and over request buckets."""
    plain = [
        r
        for r in through_the_backend
        if not r["mutate"] and "snapshot_kernel_launches" not in r
    ]
    assert len(plain) == BACKEND_CASES
    assert any(r["prefix"] for r in plain) and any(r["tracked"] for r in plain)
    assert any(r["requests"] < r["slots"] for r in plain)
    # Request buckets' graphs (odd seeds), with and without padding slots.
    assert any(r["graph_slots"] == r["requests"] < r["slots"] for r in plain)
    assert any(r["requests"] < r["graph_slots"] < r["slots"] for r in plain)
    assert any(r["tokens"] < r["bucket"] for r in plain)
    assert {True, False} == {r["triton_conv"] for r in plain}
    assert any(r["track_tables"] and not r["tracked"] for r in plain)
    modes = {m for r in plain for m in r["modes"]}
    assert {TRACK_FINAL_STATE, TRACK_GRID_STATE, TRACK_RECOMPUTE_STATE} <= modes
    bad = [
        r for r in plain if not r["finite"] or max(r[k] for k in BACKEND_DIFFS) > 1e-5
    ]
    assert not bad, bad


def test_wrong_graph_metadata_changes_the_backends_results(through_the_backend):
    mutated = {
        r["mutate"]: max(r[k] for k in BACKEND_DIFFS)
        for r in through_the_backend
        if r["mutate"]
    }
    assert set(mutated) == {
        "no-initial-states",
        "recompute-end-off-by-one",
        "snapshots-dropped",
    }
    assert all(d > 0.1 for d in mutated.values()), mutated


def test_snapshot_kernel_in_the_captured_extend_equals_sglangs_eager_extend(
    through_the_backend,
):
    """With MAMBA2_SNAPSHOT_KERNEL on, the same comparison (the patched
    _track_mamba_state_extend launching sgl-kernel's snapshot_state_rows, in
    the warm-up forward on the capture batch and in the replayed one): every
    snapshot mode and a plan of fillers
    only, the outputs and pools (the padding slot aside, which the kernel's
    fillers leave alone) equal to the eager extend's."""
    runs = {
        r["seed"]: r for r in through_the_backend if "snapshot_kernel_launches" in r
    }
    assert set(runs) == set(SNAPSHOT_KERNEL_SEEDS)
    modes = {m for r in runs.values() for m in r["modes"]}
    assert {TRACK_FINAL_STATE, TRACK_GRID_STATE, TRACK_RECOMPUTE_STATE} <= modes
    assert all(r["snapshot_kernel_launches"] == 2 for r in runs.values()), runs
    bad = [
        r
        for r in runs.values()
        if not r["finite"] or max(r[k] for k in BACKEND_DIFFS) > 1e-5
    ]
    assert not bad, bad
