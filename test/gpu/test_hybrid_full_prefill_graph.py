"""Hybrid linear attention (GDN, tiny random Qwen3-Next) with a full prefill CUDA
graph, on a real sglang.Engine, against the same engine with the prefill graph
disabled. Upstream 0.5.23 crashes during capture (IndexError in
HybridLinearAttnBackend._replay_metadata)."""

import pytest
from engine_utils import compare, probe_count, run_engine, write_result
from models import prompts

# Greedy logprobs of the graph and eager engines (flashinfer paged vs ragged
# prefill plans differ in rounding) stay well inside this; a wrong linear state
# moves them far past it (see test_wrong_graph_state_changes_outputs).
TOL = 0.05
CHUNK = 128
LONG = prompts(0, [300, 200, 90, 45])
BATCHES = [
    # Chunked prefill (128-token chunks): later chunks continue the linear state.
    {"input_ids": LONG, "max_new_tokens": 8},
    # Prefix hits: the radix cache restores linear states tracked during batch 0.
    {"input_ids": [LONG[0][:256] + p for p in prompts(1, [30])] + [LONG[1][:192] + p for p in prompts(2, [20])], "max_new_tokens": 8},
    # Several short requests in one small bucket.
    {"input_ids": prompts(3, [5, 17, 33]), "max_new_tokens": 8},
]  # fmt: skip


def _engine_kwargs(model_path, prefill):
    return {
        "model_path": model_path,
        "attention_backend": "flashinfer",
        "chunked_prefill_size": CHUNK,
        "context_length": 1024,
        "mem_fraction_static": 0.3,
        "cuda_graph_max_bs_decode": 4,
        "cuda_graph_config": {"prefill": prefill},
    }


FULL = {"backend": "full", "bs": [16, 32, 64, 128], "full_prefill_max_req": 4}


@pytest.fixture(scope="module")
def eager(qwen3_next_path):
    # Same GDN kernels as the graph engine, where sglang-graphfix keeps Triton
    # in place of the FlashInfer GDN-prefill default (head dim 128 on Hopper).
    kwargs = _engine_kwargs(qwen3_next_path, {"backend": "disabled"})
    return run_engine({**kwargs, "linear_attn_prefill_backend": "triton"}, BATCHES)


def _replays_per_batch(results, before):
    counts = [r[0]["probe_counts"].get("gdn_graph_replay", 0) for r in results]
    return [b - a for a, b in zip([before] + counts, counts)]


@pytest.fixture(scope="module")
def graph(qwen3_next_path):
    before = probe_count("gdn_graph_replay")
    results = run_engine(_engine_kwargs(qwen3_next_path, FULL), BATCHES)
    return results, _replays_per_batch(results, before)


def test_full_prefill_graph_replays(graph):
    _, replays = graph
    assert sum(replays) > 0, f"the prefill graph never replayed: {replays} per batch"


def test_full_prefill_graph_matches_eager(graph, eager):
    results, replays = graph
    per_batch = [compare(e, g, tol=TOL) for e, g in zip(eager, results)]
    write_result(
        "hybrid_gdn_full_prefill_vs_eager",
        {"tolerance": TOL, "graph_replays": replays, "batches": per_batch},
    )
    for r in per_batch:
        assert r["compared_steps"] > 0 and not r["mismatches"], r


def test_wrong_graph_state_changes_outputs(qwen3_next_path, graph, eager):
    """Can-fail control: the graph engine again, with every replay pointed at the
    padding state slot (test probe fault); its outputs must leave the tolerance."""
    results = run_engine(
        _engine_kwargs(qwen3_next_path, FULL),
        BATCHES,
        env={"GRAPHFIX_PROBE_FAULT": "gdn_wrong_state"},
    )
    per_batch = [compare(e, f, tol=TOL) for e, f in zip(eager, results)]
    write_result(
        "hybrid_gdn_full_prefill_wrong_state", {"tolerance": TOL, "batches": per_batch}
    )
    replayed = [r for r, n in zip(per_batch, graph[1]) if n]
    assert replayed and all(r["mismatches"] for r in replayed), per_batch


def test_unsupported_linear_attention_is_rejected(nemotron_h_path):
    """Mamba2 hybrids have no capture-safe extend: a clear error at startup."""
    with pytest.raises(ValueError, match="cuda-graph-backend-prefill breakable"):
        run_engine(_engine_kwargs(nemotron_h_path, {"backend": "full"}), [])
