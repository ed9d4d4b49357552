"""sglang's Triton causal conv launched on a Mamba2 full-graph bucket's block
table (MAMBA2_CONV_BLOCK_TABLE; launch_conv_on_bucket_block_table), through
sglang's own conv entry point as MambaMixer2 calls it on CUDA
(sglang.srt.layers.attention.mamba.causal_conv1d.causal_conv1d_fn, which routes a
strided input with host lengths to the Triton kernel), with the kernel launch
recorded instead of run (no GPU here). The conv's output on the table equals the
eager conv in Triton's interpreter: test_mamba2_prefill_graph.py."""

from types import SimpleNamespace

import pytest
import torch
import triton
from mamba2_prefill_graph_cases import filled_tables

import sglang.kernels.ops.mamba.causal_conv1d_triton as triton_conv
from sglang.srt.layers.attention.mamba import causal_conv1d as sglang_conv
from sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph import (
    Mamba2FullGraphMetadata,
    max_conv_blocks,
)

DIM, WIDTH = 640, 4  # 3 channel blocks of 256


class _Launch:
    """Stands in for the Triton kernel: records each launch's grid and flags."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.launches.append(
                SimpleNamespace(grid=grid(meta), table=args[8], **meta)
            )

        return launch


@pytest.fixture
def kernel(monkeypatch):
    launch = _Launch()
    monkeypatch.setattr(triton_conv, "_causal_conv1d_fwd_kernel", launch)
    return launch


def _bucket(conv_blocks):
    case = SimpleNamespace(
        chunk=16, bucket=96, slots=4, lens=[20, 9, 33], prefix=[0, 4, 0],
        rows=[1, 2, 3], tracked=None,
    )  # fmt: skip
    tables = filled_tables(case)
    if not conv_blocks:
        tables = type(tables)(**{**vars(tables), "conv_block_table": None})
    return case, Mamba2FullGraphMetadata.on_tables(tables, None)


def _conv_as_mamba_mixer2_calls_it(meta, T, lengths=None):
    hidden = torch.randn(T, DIM)
    return sglang_conv.causal_conv1d_fn(
        hidden.transpose(0, 1),  # strided, as MambaMixer2 passes it
        torch.randn(DIM, WIDTH),
        torch.randn(DIM),
        activation="silu",
        conv_states=torch.zeros(16, DIM, WIDTH - 1),
        has_initial_state=meta.mixed_metadata.has_initial_states,
        cache_indices=meta.mamba_cache_indices,
        query_start_loc=meta.query_start_loc,
        seq_lens_cpu=lengths or meta.mixed_metadata.extend_seq_lens_cpu,
    )


def test_a_bucket_with_a_block_table_launches_over_it(kernel):
    case, meta = _bucket(conv_blocks=True)
    _conv_as_mamba_mixer2_calls_it(meta, case.bucket)
    (launch,) = kernel.launches
    rows = max_conv_blocks(case.bucket, case.slots)  # cdiv(96, 8) + 4
    assert launch.USE_BLOCK_TABLE and launch.table is meta.tables.conv_block_table
    assert launch.grid == (rows, 1, triton.cdiv(DIM, 256))
    # Upstream's launch bound is kept for everything else that reads it.
    assert list(meta.mixed_metadata.extend_seq_lens_cpu) == [96] * 5


def test_other_calls_keep_upstreams_grid(kernel):
    # A bucket without the table (MAMBA2_CONV_BLOCK_TABLE off, as shipped):
    # R + 1 sequences x the bucket's blocks, as upstream launches it.
    case, meta = _bucket(conv_blocks=False)
    assert type(meta.mixed_metadata.extend_seq_lens_cpu) is list
    _conv_as_mamba_mixer2_calls_it(meta, case.bucket)
    # An eager batch's lengths.
    _conv_as_mamba_mixer2_calls_it(meta, 62, lengths=[20, 9, 33])
    grids = [(launch.grid, launch.USE_BLOCK_TABLE) for launch in kernel.launches]
    assert grids == [
        ((5, triton.cdiv(96, 8), 3), False),
        ((3, triton.cdiv(33, 8), 3), False),
    ]


def test_the_switch_decides_whether_a_captured_bucket_gets_a_table(monkeypatch):
    from sglang_graphfix.srt import full_prefill_graph_capability as capability
    from sglang_graphfix.srt.layers.attention.mamba import mamba2_prefill_graph

    assert capability.MAMBA2_CONV_BLOCK_TABLE is False  # as shipped
    backend = SimpleNamespace(
        mamba_chunk_size=16, device="cpu", conv_states_shape=(16, DIM, 3)
    )
    batch = SimpleNamespace(
        batch_size=4, input_ids=torch.zeros(96), mamba_track_mask=None
    )
    monkeypatch.setattr(mamba2_prefill_graph, "mamba_cache_chunk_size", lambda: 64)
    for on in (False, True):
        monkeypatch.setattr(capability, "MAMBA2_CONV_BLOCK_TABLE", on)
        meta = mamba2_prefill_graph._allocate_metadata(backend, batch, torch.int32)
        assert (meta.tables.conv_block_table is not None) is on
        assert hasattr(meta.mixed_metadata.extend_seq_lens_cpu, "block_table") is on
