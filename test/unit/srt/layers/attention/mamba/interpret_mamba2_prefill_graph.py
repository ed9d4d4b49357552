"""Runs test/mamba2_prefill_graph_cases.py's random batches through sglang's own
Mamba2 extend kernels in Triton's CPU interpreter, twice: as the eager extend
runs them (the real batch's tokens, sglang's metadata, host-sized grids) and as a
captured launch would (the whole bucket, the static tables, grids from the
bucket), and prints one JSON line per case: the largest differences on the real
batch's outputs and states. A script, not a test: TRITON_INTERPRET must be set
before triton is first imported (test_mamba2_prefill_graph.py runs it in a
subprocess)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import contextlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

# The SSD wrappers enter the tensors' device context; torch.cpu has none.
torch.cpu.device = lambda index=None: contextlib.nullcontext()

from mamba2_prefill_graph_cases import (  # noqa: E402
    SLOT_OF_ROW,
    eager_metadata,
    filled_tables,
    filled_track,
    make_case,
)
from triton.runtime.autotuner import Autotuner  # noqa: E402

from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_fn  # noqa: E402
from sglang.kernels.ops.mamba.triton_ops import (  # noqa: E402
    ssd_bmm,
    ssd_chunk_scan,
    ssd_chunk_state,
    ssd_state_passing,
)
from sglang.kernels.ops.mamba.triton_ops.ssd_combined import (  # noqa: E402
    mamba_chunk_scan_combined,
)
from sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph import (  # noqa: E402
    TRACK_FINAL_STATE,
    TRACK_GRID_STATE,
    TRACK_NONE,
    TRACK_RECOMPUTE_STATE,
)

# Autotuning benchmarks on a GPU: the interpreter runs each kernel's first config.
for module in (ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_state_passing):
    for kernel in vars(module).values():
        if isinstance(kernel, Autotuner):
            kernel.configs = kernel.configs[:1]

# Deliberately wrong tables, each on a seed where it matters: the comparison
# must see them (inert chunk rows that the chunk-scan kernel does not mask out,
# the bucket's tail folded into the last request, a snapshot one token late).
MUTATIONS = {
    "inert-rows-at-offset-0": 0,
    "tail-in-last-request": 1,
    "recompute-end-off-by-one": 14,
}
HEADS, HEAD_DIM, GROUPS, STATE, CONV_DIM, WIDTH = 2, 8, 1, 8, 16, 4


def _layer(case, gen):
    """Random weights, pools and bucket-long inputs (the tail tokens too)."""
    T, slots = case.bucket, max(SLOT_OF_ROW) + 1

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    return dict(
        conv_x=rand(T, CONV_DIM),  # token-major: the conv sees a channel-last view
        conv_w=rand(CONV_DIM, WIDTH) / WIDTH,
        conv_b=rand(CONV_DIM),
        conv_pool=rand(slots, CONV_DIM, WIDTH - 1),
        x=rand(1, T, HEADS, HEAD_DIM),
        dt=rand(1, T, HEADS),
        A=-torch.rand(HEADS, generator=gen),
        B=rand(1, T, GROUPS, STATE),
        C=rand(1, T, GROUPS, STATE),
        D=rand(HEADS),
        dt_bias=rand(HEADS),
        ssm_pool=rand(slots, HEADS, HEAD_DIM, STATE),
    )


def _ssd(
    w, n, *, chunk, seq_idx, chunk_indices, chunk_offsets, cu, initial, track_seq_idx,
    track_end_locs,
):  # fmt: skip
    out = torch.zeros(1, n, HEADS, HEAD_DIM)
    states, varlen, track = mamba_chunk_scan_combined(
        w["x"][:, :n], w["dt"][:, :n], w["A"], w["B"][:, :n], w["C"][:, :n],
        chunk_size=chunk, D=w["D"], dt_bias=w["dt_bias"], seq_idx=seq_idx,
        chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, cu_seqlens=cu,
        initial_states=initial, return_varlen_states=True, return_track_states=True,
        dt_softplus=True, dt_limit=(0.0, float("inf")), out=out,
        state_dtype=torch.float32, track_seq_idx=track_seq_idx,
        track_end_locs=track_end_locs,
    )  # fmt: skip
    return out, states, varlen, track


def run_case(seed, mutate=""):
    case = make_case(seed, chunks=(4, 8, 16))
    gen = torch.Generator().manual_seed(seed)
    w = _layer(case, gen)
    total, bs, C = sum(case.lens), len(case.lens), case.chunk

    # Eager: MambaMixer2.forward's extend on sglang's metadata for the batch.
    meta = eager_metadata(case)
    mixed = meta.mixed_metadata
    eager_conv_pool = w["conv_pool"].clone()
    eager_conv = causal_conv1d_fn(
        w["conv_x"][:total].transpose(0, 1), w["conv_w"], w["conv_b"],
        conv_states=eager_conv_pool, query_start_loc=meta.query_start_loc,
        seq_lens_cpu=mixed.extend_seq_lens_cpu,
        cache_indices=meta.mamba_cache_indices,
        has_initial_state=mixed.has_initial_states, activation="silu",
    )  # fmt: skip
    slots = meta.mamba_cache_indices.long()
    initial = None
    if mixed.prep_initial_states:
        initial = torch.where(
            mixed.has_initial_states[:, None, None, None], w["ssm_pool"][slots], 0
        )
    eager_out, eager_states, eager_varlen, eager_track = _ssd(
        w, total, chunk=C, seq_idx=mixed.seq_idx, chunk_indices=mixed.chunk_indices,
        chunk_offsets=mixed.chunk_offsets, cu=meta.query_start_loc, initial=initial,
        track_seq_idx=meta.track_ssm_seq_idx, track_end_locs=meta.track_ssm_end_locs,
    )  # fmt: skip
    # Mamba2AttnBackend._track_mamba_state_extend's snapshots, by track slot.
    eager_snapshots = {}
    if meta.has_mamba_track_mask:
        for dst, h in zip(meta.track_ssm_h_dst.tolist(), meta.track_ssm_h_src):
            eager_snapshots[dst] = eager_states[0, h]
        for i, dst in enumerate(meta.track_ssm_recompute_dst.tolist()):
            eager_snapshots[dst] = eager_track[0, i]
        for src, dst in zip(meta.track_ssm_final_src, meta.track_ssm_final_dst):
            row = meta.mamba_cache_indices.tolist().index(int(src))
            eager_snapshots[int(dst)] = eager_varlen[row]

    # Captured: the whole bucket on the static tables, always with initial states.
    t = filled_tables(case)
    if mutate == "inert-rows-at-offset-0":
        t.chunk_offsets[t.chunk_offsets == C] = 0
    elif mutate == "tail-in-last-request":
        t.seq_idx[t.seq_idx == case.slots] = bs - 1
        t.query_start_loc[bs:] = case.bucket
    # The conv as MambaMixer2 launches it on the bucket's metadata (R + 1
    # sequences of up to T tokens, lengths read on the device), and on the
    # bucket's block table (MAMBA2_CONV_BLOCK_TABLE): the same output and states.
    graph_conv_pool = w["conv_pool"].clone()
    graph_conv = causal_conv1d_fn(
        w["conv_x"].transpose(0, 1), w["conv_w"], w["conv_b"],
        conv_states=graph_conv_pool, query_start_loc=t.query_start_loc,
        seq_lens_cpu=[case.bucket] * (case.slots + 1), cache_indices=t.cache_indices,
        has_initial_state=t.has_initial_states, activation="silu",
    )  # fmt: skip
    table_conv_pool = w["conv_pool"].clone()
    table_conv = causal_conv1d_fn(
        w["conv_x"].transpose(0, 1), w["conv_w"], w["conv_b"],
        conv_states=table_conv_pool, query_start_loc=t.query_start_loc,
        seq_lens_cpu=None, cache_indices=t.cache_indices,
        has_initial_state=t.has_initial_states, activation="silu",
        block_table=t.conv_block_table,
    )  # fmt: skip
    initial = torch.where(
        t.has_initial_states[:, None, None, None],
        w["ssm_pool"][t.cache_indices.long()],
        0,
    )
    track = filled_track(case, t)
    if mutate == "recompute-end-off-by-one" and track is not None:
        track.end_loc[track.mode == TRACK_RECOMPUTE_STATE] += 1
    graph_out, graph_states, graph_varlen, graph_track = _ssd(
        w, case.bucket, chunk=C, seq_idx=t.seq_idx, chunk_indices=t.chunk_indices,
        chunk_offsets=t.chunk_offsets, cu=t.query_start_loc, initial=initial,
        track_seq_idx=track.src if track is not None else None,
        track_end_locs=track.end_loc if track is not None else None,
    )  # fmt: skip
    # The captured snapshot: one fixed-shape select per track row.
    graph_snapshots = {}
    if track is not None:
        snapshot = torch.where(
            (track.mode == TRACK_FINAL_STATE)[:, None, None, None],
            graph_varlen[track.src],
            torch.where(
                (track.mode == TRACK_GRID_STATE)[:, None, None, None],
                graph_states[0, track.h_src],
                graph_track[0],
            ),
        )
        for r in range(track.num_rows):
            if track.mode[r] != TRACK_NONE:
                graph_snapshots[int(track.dst[r])] = snapshot[r]

    def diff(a, b):
        return float((a - b).abs().max()) if a.numel() else 0.0

    real_chunks = -(-total // C)
    return {
        "seed": seed,
        "mutate": mutate,
        "chunk": C,
        "bucket": case.bucket,
        "requests": bs,
        "slots": case.slots,
        "tokens": total,
        "prefix": any(case.prefix),
        "conv_out": diff(graph_conv[:, :total], eager_conv),
        "conv_state": diff(graph_conv_pool[slots], eager_conv_pool[slots]),
        "conv_out_table": diff(table_conv[:, :total], eager_conv),
        "conv_state_table": diff(table_conv_pool[slots], eager_conv_pool[slots]),
        "ssd_out": diff(graph_out[:, :total], eager_out),
        "chunk_states": diff(
            graph_states[:, :real_chunks], eager_states[:, :real_chunks]
        ),
        "varlen_state": diff(graph_varlen[:bs], eager_varlen),
        "modes": sorted(set(track.mode.tolist())) if track is not None else [],
        "track_state": max(
            [diff(graph_snapshots[d], s) for d, s in eager_snapshots.items()]
            + [0.0 if set(graph_snapshots) == set(eager_snapshots) else 1e9]
        ),
        "finite": bool(graph_conv.isfinite().all() and graph_out.isfinite().all()),
    }


if __name__ == "__main__":
    seeds = [int(a) for a in sys.argv[1:]] or range(int(os.environ.get("CASES", 24)))
    runs = [(seed, "") for seed in seeds]
    if os.environ.get("MUTATE", "1") == "1":
        runs += [(seed, m) for m, seed in MUTATIONS.items()]
    for seed, mutate in runs:
        print(json.dumps(run_case(seed, mutate)), flush=True)
