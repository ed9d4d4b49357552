"""The captured Mamba2 extend on a GPU (issue 16; docs/mamba2_full_prefill_graph.md,
GPU step 1), with MAMBA2_FULL_PREFILL_GRAPH on for the test only: per random
padded batch (prefixes, prefix-cache snapshots in every mode, zero-length
request slots, a tail past the batch), Mamba2AttnBackend.forward ->
MambaMixer2.forward on the bucket's static metadata is captured in a
torch.cuda.CUDAGraph after a warm-up forward, the metadata is refilled for the
batch and the graph replayed with host synchronisation forbidden
(torch.cuda.set_sync_debug_mode("error")); the real tokens' outputs and every
conv/SSM pool slot but the padding slot must equal sglang's eager extend of the
same batch on the compiled kernels. The same comparison runs on CPU in Triton's
interpreter (test/unit/srt/layers/attention/mamba/test_mamba2_prefill_graph.py),
without the graph. On odd seeds the graph is a request bucket's (its tables over
the first request slots: mamba2_backend_cases.run_case)."""

import pytest

import sglang_graphfix

CASES = 24
# float32 pools and activations; the graph side runs the SSD over the bucket
# (other chunk tables), so sums may associate differently.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def run_case():
    sglang_graphfix.register()
    from mamba2_backend_cases import run_case

    return run_case


@pytest.mark.parametrize(
    "conv_block_table, table_fill_kernel, snapshot_kernel",
    [
        (False, False, False),
        (True, False, False),
        (True, True, False),
        (False, True, False),
        (False, True, True),
    ],
    ids=["", "conv_table", "conv_table_fill_kernel", "fill_kernel", "snapshot_kernel"],
)
@pytest.mark.parametrize("seed", range(CASES))
def test_replayed_graph_equals_the_eager_extend(
    run_case, seed, conv_block_table, table_fill_kernel, snapshot_kernel, monkeypatch
):
    """Also with the conv launched on the bucket's block table
    (MAMBA2_CONV_BLOCK_TABLE, off as shipped): the same numbers either way, so the
    kernel's launches are recorded to show which one ran; with the tables
    refilled by sgl-kernel's one-launch fill (MAMBA2_TABLE_FILL_KERNEL, on as
    shipped) instead of the torch ops; and with the prefix-cache snapshot in
    sgl-kernel's one launch (MAMBA2_SNAPSHOT_KERNEL, off as shipped)."""
    import sglang.kernels.ops.mamba.causal_conv1d_triton as triton_conv
    from sglang_graphfix.srt import full_prefill_graph_capability as capability
    from sglang_graphfix.srt.layers.attention.mamba import mamba2_prefill_graph
    from sglang_graphfix_kernel import masked_state_rows

    monkeypatch.setattr(capability, "MAMBA2_CONV_BLOCK_TABLE", conv_block_table)
    monkeypatch.setattr(capability, "MAMBA2_TABLE_FILL_KERNEL", table_fill_kernel)
    monkeypatch.setattr(capability, "MAMBA2_SNAPSHOT_KERNEL", snapshot_kernel)
    snapshot, snapshots = masked_state_rows._snapshot_state_rows, []

    class CountedSnapshot:
        def __getitem__(self, grid):
            snapshots.append(grid)
            return snapshot[grid]

    monkeypatch.setattr(masked_state_rows, "_snapshot_state_rows", CountedSnapshot())
    kernel_fills, fill = [], mamba2_prefill_graph.fill_mamba2_prefill_tables

    def counted_fill(*args, **kwargs):
        kernel_fills.append(1)
        return fill(*args, **kwargs)

    monkeypatch.setattr(
        mamba2_prefill_graph, "fill_mamba2_prefill_tables", counted_fill
    )
    kernel, flags = triton_conv._causal_conv1d_fwd_kernel, []

    class Recorded:
        def __getitem__(self, grid):
            launch = kernel[grid]

            def run(*args, **meta):
                flags.append(meta.get("USE_BLOCK_TABLE"))
                return launch(*args, **meta)

            return run

    monkeypatch.setattr(triton_conv, "_causal_conv1d_fwd_kernel", Recorded())
    result = run_case(seed, device="cuda", capture_graph=True, chunks=(8, 16, 64))
    # The eager extend never has a table; the captured one has one exactly when
    # the switch is on.
    assert False in flags and (True in flags) is conv_block_table, flags
    assert bool(kernel_fills) is table_fill_kernel  # the one-launch fill ran
    # The snapshot kernel ran exactly when switched on and the bucket has track rows.
    assert bool(snapshots) is (snapshot_kernel and result["track_tables"]), snapshots
    assert result["finite"], result
    assert max(result[k] for k in ("out", "conv_pool", "ssm_pool")) < TOLERANCE, result


def test_table_fill_kernel_equals_the_torch_fill():
    """sgl-kernel's Mamba2 table fill, compiled, against the torch fill on the
    same random replay and capture batches (the CPU test runs it in Triton's
    interpreter: test/unit/sgl_kernel/test_mamba2_prefill_tables.py)."""
    from mamba2_prefill_graph_cases import table_fill_cases

    results = list(table_fill_cases(range(CASES), device="cuda"))
    assert any(r["tracked"] for r in results)
    assert not [r for r in results if r["mismatches"]]


@pytest.mark.parametrize(
    "mutate, seed",
    [("no-initial-states", 0), ("snapshots-dropped", 4)],
)
def test_wrong_metadata_is_seen_on_the_gpu(run_case, mutate, seed):
    result = run_case(
        seed, mutate, device="cuda", capture_graph=True, chunks=(4, 8, 16)
    )
    assert max(result[k] for k in ("out", "conv_pool", "ssm_pool")) > 0.1, result


def test_cases_cover_the_snapshot_modes(run_case):
    modes = set()
    for seed in range(CASES):
        modes.update(run_case(seed, device="cuda", chunks=(8, 16, 64))["modes"])
    assert {1, 2, 3} <= modes
