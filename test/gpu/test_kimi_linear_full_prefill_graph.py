"""Hybrid KDA attention (tiny random Kimi-Linear) with a full prefill CUDA graph,
on a real sglang.Engine, against the same engine with the prefill graph disabled.

The KDA extend runs on upstream's breakable-graph tables (KDAPrefillGraphMetadata),
one per captured token bucket, refilled before every replay (probe counter
kda_graph_replay). Kimi-Linear's full attention is MLA: the engines run fa3, whose
MLA path has a full prefill graph plan and cached-prefix variants (FlashInfer's
MLA backend plans no EXTEND for full graphs; see
test_hybrid_linear_attn_backend.py::test_full_attention_without_a_full_prefill_plan_fails_clearly).
"""

import pytest
from engine_utils import (
    assert_graph_matches_eager,
    compare,
    diverged,
    graph_vs_eager,
    probe_count,
    replays_per_batch,
    run_engine,
    write_result,
)
from models import prompts, tiny_kimi_linear

# Greedy logprobs of the graph and eager engines: the same Triton KDA kernels on
# both, but the MLA layer's prefill is planned differently (bf16 rounding moves
# logprobs by ~0.01). A wrong linear state moves them far past this (see
# test_wrong_graph_state_changes_outputs).
TOL = 0.05
CHUNK = 256  # also the largest captured token bucket
SLOTS = 4  # full_prefill_max_req
TOPK = 20
P300 = prompts(10, [300])[0]
BATCHES = [
    # 0-1: single short prompts (buckets 8 and 64).
    {"input_ids": prompts(11, [5]), "max_new_tokens": 8},
    {"input_ids": prompts(12, [37]), "max_new_tokens": 8},
    # 2: >= 300 tokens: a 256-token chunk, then 44 tokens that continue its KDA
    #    state from a 256-token prefix (a cached-prefix graph variant).
    {"input_ids": [P300], "max_new_tokens": 8},
    # 3: fewer requests than the prefill slot count.
    {"input_ids": prompts(13, [5, 37, 90]), "max_new_tokens": 8},
    # 4: a prompt sharing batch 2's prefix: the radix cache restores the KDA
    #    state tracked there.
    {"input_ids": [P300[:256] + prompts(14, [30])[0]], "max_new_tokens": 8},
    # 5: every slot.
    {"input_ids": prompts(15, [5, 17, 33, 90]), "max_new_tokens": 8},
]
EXPECT_REPLAY = (0, 1, 3, 5)  # plain prefills inside the bucket padding limit
FULL = {
    "backend": "full",
    "bs": [8, 16, 32, 64, 128, CHUNK],
    "full_prefill_max_req": SLOTS,
}


def _engine_kwargs(model_path, prefill):
    return {
        "model_path": model_path,
        "attention_backend": "fa3",
        # The checkpoint is bf16; sglang's KimiLinearConfig names no dtype, and an
        # fp16 model breaks upstream's eager KDA prefix-cache snapshot (its bf16
        # conv pool: "Index put requires the source and destination dtypes match").
        "dtype": "bfloat16",
        # The KDA kernels the full graph captures, on every engine.
        "linear_attn_prefill_backend": "triton",
        "chunked_prefill_size": CHUNK,
        "context_length": 2048,
        # Capped pools: the GPU suite runs several engines on one GPU at once.
        "mem_fraction_static": 0.3,
        "max_total_tokens": 32768,
        "max_mamba_cache_size": 64,
        "cuda_graph_max_bs_decode": SLOTS,
        "cuda_graph_config": {"prefill": prefill},
    }


@pytest.fixture(scope="module")
def kimi_linear_path(tmp_path_factory):
    return tiny_kimi_linear(tmp_path_factory.mktemp("kimi_linear"))


@pytest.fixture(scope="module")
def eager(kimi_linear_path):
    return run_engine(
        _engine_kwargs(kimi_linear_path, {"backend": "disabled"}),
        BATCHES,
        top_logprobs_num=TOPK,
    )


@pytest.fixture(scope="module")
def graph(kimi_linear_path):
    before = probe_count("kda_graph_replay")
    results = run_engine(
        _engine_kwargs(kimi_linear_path, FULL), BATCHES, top_logprobs_num=TOPK
    )
    return results, replays_per_batch(results, before, "kda_graph_replay")


def test_full_prefill_graph_replays(graph):
    _, replays = graph
    assert probe_count("kda_graph_capture") > 0, "no KDA tables were captured"
    assert all(replays[i] > 0 for i in EXPECT_REPLAY), (
        f"KDA graph replays per batch: {replays}"
    )


def test_full_prefill_graph_matches_eager(graph, eager):
    results, replays = graph
    report = graph_vs_eager(eager, results, tol=TOL)
    write_result(
        "kimi_linear_full_prefill_vs_eager",
        {
            **report,
            "prompt_lengths": [[len(p) for p in b["input_ids"]] for b in BATCHES],
            "graph_replays": replays,
        },
    )
    assert_graph_matches_eager(report)


def test_wrong_graph_state_changes_outputs(kimi_linear_path, graph, eager):
    """Can-fail control: the graph engine again, with every replay's state-index
    table pointed at the padding slot (test probe fault kda_wrong_state); its
    outputs must leave the tolerance in every batch that replayed."""
    results = run_engine(
        _engine_kwargs(kimi_linear_path, FULL),
        BATCHES,
        env={"GRAPHFIX_PROBE_FAULT": "kda_wrong_state"},
    )
    per_batch = [compare(e, f, tol=TOL) for e, f in zip(eager, results)]
    write_result(
        "kimi_linear_full_prefill_wrong_state",
        {"tolerance": TOL, "batches": per_batch},
    )
    replayed = [r for r, n in zip(per_batch, graph[1]) if n]
    assert replayed and all(diverged(r) for r in replayed), per_batch


LONG = prompts(16, [2000])[0]


def test_slot_floor_keeps_long_cached_prefixes_on_the_graph(kimi_linear_path):
    """At chunked_prefill_size 512 with no request slots set, sglang-graphfix
    gives the full graph 8 request slots and 4096 cached-prefix chunk tokens, 512
    a request as sglang's one slot would have
    (cuda_graph_hook.hybrid_full_prefill_request_slots): every 512-token chunk of
    a 2000-token prompt replays the graph, the last on a 1536-token cached prefix
    (with 64 tokens a request, prefixes over 1024 ran eager: 3 replays, not 4),
    and the greedy outputs match eager at the same chunking."""
    batches = [{"input_ids": [LONG], "max_new_tokens": 8}]

    def kwargs(prefill):
        return {
            **_engine_kwargs(kimi_linear_path, prefill),
            "chunked_prefill_size": 512,
            "context_length": 4096,
        }

    before = probe_count("kda_graph_replay")
    graph = run_engine(kwargs({"backend": "full"}), batches, top_logprobs_num=TOPK)
    (replays,) = replays_per_batch(graph, before, "kda_graph_replay")
    eager = run_engine(kwargs({"backend": "disabled"}), batches, top_logprobs_num=TOPK)
    report = graph_vs_eager(eager, graph, tol=TOL)
    write_result(
        "kimi_linear_slot_floor_long_prefix",
        {**report, "prompt_tokens": len(LONG), "graph_replays": replays},
    )
    assert replays == 4, f"KDA graph replays of the 2000-token prompt: {replays}"
    assert_graph_matches_eager(report)
