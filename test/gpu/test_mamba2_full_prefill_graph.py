"""Mamba2 hybrids (issue 16) with a full prefill CUDA graph, on a real
sglang.Engine, against the same engine with the prefill graph disabled: tiny
random NemotronH ("M*M": Mamba2, attention, Mamba2) and Falcon-H1 (attention
and Mamba2 in parallel in every layer) with the mamba radix cache's extra buffer
(sglang's default here: overlap scheduling on, Triton linear-attention kernels),
NemotronH also without it (no_buffer, which sglang pairs with the overlap
schedule off); NemotronH "M-M*-" (MLP layers), "M-M*E" (MLP and MoE layers)
and GraniteMoeHybrid (Mamba2 layers without attention), for which sglang 0.5.23
captures no prefill graph, with MAMBA2_LAYER_GAPS_CAPTURED (and, for the MoE
layers, NEMOTRON_H_MOE_LAYERS_CAPTURED) on; NemotronH "M-M*-" with 8 groups
(MAMBA2_CHECKED's group counts widened to 1 and 8); LFM2 (short-conv layers,
LFM2_FULL_PREFILL_GRAPH on, no_buffer: sglang has no mamba extra buffer for it)
(CASES). docs/mamba2_full_prefill_graph.md,
"What the GPU session must do", step 2, and what the first H200 run showed.

The captured Mamba2 extend ships switched on (MAMBA2_FULL_PREFILL_GRAPH in
sglang_graphfix.srt.full_prefill_graph_capability, after this module's second
H200 run). The module still turns it on in both processes that judge it, so
that it tests the captured extend whatever the shipped value (as it turns on
MAMBA2_FULL_BEATS_BREAKABLE, off as shipped, which would run the full graph of
Falcon-H1 and "M*M" as breakable):
* the engines' scheduler processes (spawned; they load the plugins afresh): the
  test probe sets the switch there from GRAPHFIX_PROBE_MAMBA2_FULL_PREFILL_GRAPH,
  passed to every engine of this module through run_engine(env=...);
* this test process: sglang.Engine resolves its ServerArgs here, and
  sglang-graphfix's resolution hook (cuda_graph_hook.judge_prefill_graph_on_final_settings)
  raises ValueError on an explicit full prefill graph the switch refuses. The
  plugins load once per process, possibly for an earlier test module's engine,
  so the autouse fixture below sets the module attribute itself, and restores
  it afterwards. The variable is not set at import: collection imports every
  module first, and the other modules' engines would inherit it.

Greedy tokens and logprobs must match within TOL; a can-fail control points
every replay at the padding state slot (test probe fault mamba2_wrong_state)
and must leave the tolerance on every replayed batch. That fault keeps a
request's chunks consistent (each chunk reads and writes slot 0) and leaves
fresh prompts' prefill exact (no initial state); the request's own slot, which
its decode reads, keeps the state it was cleared to, so the control shows in
the decode steps: the Mamba2 branch must carry real weight there
(tiny_falcon_h1's gated RMSNorm; on CPU, zeroing the Mamba2 states after the
prefill splits greedy decoding of every prompt length of BATCHES for both
checkpoints, logprobs moving 0.06-0.24 before the split, bf16 vs fp32 <= 0.007;
for nemotron_h_mlp, nemotron_h_moe, nemotron_h_groups8, granite_moe_hybrid and lfm2, `python3
test/gpu/check_control_checkpoints.py`: zeroed states split greedy decoding at
the first decode step for prompts of 7, 64 and 255 tokens; lfm2 at the first or
second, with its weights at 1/sqrt(hidden): tiny_lfm2).

Three engines (eager, graph, faulted graph) per case: under a
per-command time limit, run one model at a time (`-k "nemotron_h and not mlp
and not moe"`, `-k nemotron_h_mlp`, `-k nemotron_h_moe`, `-k falcon_h1`,
`-k granite`, `-k lfm2`).

Checked on CPU (nemotron_h_moe: only its weight names, against sglang's
NemotronH expert mapping): the checkpoints load into sglang's own model classes with
every parameter set (Falcon-H1's q_norm / k_norm excepted: sglang's FalconH1
defines them and never applies them), sglang's ModelConfig serves each in
bfloat16, and the graph engines' arguments resolve with the switch on, as on an
H200 (`sglang-graphfix explain`)."""

import pytest
from engine_utils import (
    assert_graph_matches_eager,
    chunk_256_engine_kwargs,
    compare,
    diverged,
    graph_vs_eager,
    probe_count,
    replays_per_batch,
    run_engine,
    write_result,
)
from models import (
    chunk_256_batches,
    one_token_batches,
    prompts,
    tiny_falcon_h1,
    tiny_granite_moe_hybrid,
    tiny_lfm2,
    tiny_nemotron_h,
)

# As the GDN test: both engines run the same Mamba2 kernels; flashinfer plans the
# attention layers' prefill differently (paged vs ragged) and bf16 rounding moves
# logprobs by up to ~0.01 (Falcon-H1 on the H200: 0.0037). A wrong Mamba2 state
# in the decode splits greedy tokens, on checkpoints whose Mamba2 branch carries
# weight (module docstring; test_wrong_graph_state_changes_outputs).
TOL = 0.05
TOPK = 20
BATCHES = chunk_256_batches()  # around the 256-token chunk and largest bucket

MODELS = {
    "nemotron_h": tiny_nemotron_h,
    # MLP layers, in which sglang's prefill graph setup finds no attention
    # (MAMBA2_LAYER_GAPS_CAPTURED; published NemotronH checkpoints have them).
    "nemotron_h_mlp": lambda path: tiny_nemotron_h(path, "M-M*-"),
    # MLP and MoE layers (NEMOTRON_H_MOE_LAYERS_CAPTURED for the MoE ones).
    "nemotron_h_moe": lambda path: tiny_nemotron_h(path, "M-M*E"),
    # 8 groups, as NemotronH's published checkpoints (MAMBA2_CHECKED's groups).
    "nemotron_h_groups8": lambda path: tiny_nemotron_h(path, "M-M*-", groups=8),
    "falcon_h1": tiny_falcon_h1,
    "granite_moe_hybrid": tiny_granite_moe_hybrid,
    # Short-conv layers (LFM2_FULL_PREFILL_GRAPH), no mamba extra buffer in
    # sglang for LFM2: no_buffer.
    "lfm2": tiny_lfm2,
}
# The test probe's counter and fault family of each model's captured extend.
FAMILY = {"lfm2": "short_conv"}

# mamba_radix_cache_strategy -> the flags that select it (no_buffer: as sglang's
# own "auto" resolution pairs it, with the overlap schedule off).
STRATEGIES = {
    "extra_buffer": {"mamba_radix_cache_strategy": "extra_buffer"},
    "no_buffer": {
        "mamba_radix_cache_strategy": "no_buffer",
        "disable_overlap_schedule": True,
    },
}

SWITCH = {
    "GRAPHFIX_PROBE_MAMBA2_FULL_PREFILL_GRAPH": "1",
    "GRAPHFIX_PROBE_MAMBA2_LAYER_GAPS_CAPTURED": "1",
    "GRAPHFIX_PROBE_NEMOTRON_H_MOE_LAYERS_CAPTURED": "1",
    "GRAPHFIX_PROBE_MAMBA2_GROUPS": "1,8",
    "GRAPHFIX_PROBE_LFM2_FULL_PREFILL_GRAPH": "1",
    "GRAPHFIX_PROBE_MAMBA2_FULL_BEATS_BREAKABLE": "1",
    "GRAPHFIX_PROBE_MAMBA2_REQUEST_BUCKETS_CAPTURED": "1",
}
FULL = {"backend": "full", "bs": [16, 32, 64, 128, 256], "full_prefill_max_req": 4}
# Request slots per model where not FULL's 4: with 16 (sglang's at its default
# chunking; the engines' mamba cache caps them at 12 with the extra buffer)
# BATCHES' batches of one, two or three and four requests replay the graphs of
# request buckets 1, 2 and 4; with 4, those of 1 and 2.
SLOTS = {"nemotron_h_groups8": 16}


def _full(model):
    return {**FULL, "full_prefill_max_req": SLOTS.get(model, 4)}


def _replayed_request_buckets(model):
    return (1, 2, 4) if SLOTS.get(model, 4) > 4 else (1, 2)


@pytest.fixture(scope="module", autouse=True)
def mamba2_switch_in_this_process():
    """The switch on for this process's ServerArgs resolution (see the module
    docstring), restored after the module."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    names = (
        "MAMBA2_FULL_PREFILL_GRAPH",
        "MAMBA2_LAYER_GAPS_CAPTURED",
        "NEMOTRON_H_MOE_LAYERS_CAPTURED",
        "LFM2_FULL_PREFILL_GRAPH",
        "MAMBA2_FULL_BEATS_BREAKABLE",
    )
    saved = {name: getattr(capability, name) for name in names}
    groups = capability.MAMBA2_CHECKED["groups"]
    for name in names:
        setattr(capability, name, True)
    capability.MAMBA2_CHECKED["groups"] = (1, 8)
    yield
    for name, value in saved.items():
        setattr(capability, name, value)
    capability.MAMBA2_CHECKED["groups"] = groups


# (model, strategy): extra_buffer (sglang's default here) for every model,
# no_buffer on NemotronH only, to keep the engine count down. nemotron_h_mlp and
# granite_moe_hybrid have layers in which sglang 0.5.23's prefill graph setup
# finds no attention module (it then captures no prefill graph at all): they
# run with MAMBA2_LAYER_GAPS_CAPTURED on (SWITCH, and the fixture above), the
# check that switch waits for.
CASES = [
    pytest.param(("nemotron_h", "extra_buffer"), id="nemotron_h-extra_buffer"),
    pytest.param(("nemotron_h", "no_buffer"), id="nemotron_h-no_buffer"),
    pytest.param(("falcon_h1", "extra_buffer"), id="falcon_h1-extra_buffer"),
    pytest.param(("nemotron_h_mlp", "extra_buffer"), id="nemotron_h_mlp-extra_buffer"),
    pytest.param(("nemotron_h_moe", "extra_buffer"), id="nemotron_h_moe-extra_buffer"),
    pytest.param(
        ("nemotron_h_groups8", "extra_buffer"), id="nemotron_h_groups8-extra_buffer"
    ),
    pytest.param(
        ("granite_moe_hybrid", "extra_buffer"), id="granite_moe_hybrid-extra_buffer"
    ),
    pytest.param(("lfm2", "no_buffer"), id="lfm2-no_buffer"),
]


@pytest.fixture(scope="module", params=CASES)
def case(request):
    return request.param


@pytest.fixture(scope="module")
def model(case):
    return case[0]


@pytest.fixture(scope="module")
def strategy(case):
    return case[1]


@pytest.fixture(scope="module")
def model_path(model, tmp_path_factory):
    return MODELS[model](tmp_path_factory.mktemp(model))


def _engine_kwargs(model_path, strategy, prefill):
    # flashinfer attention: it plans a full prefill extend
    # (FULL_PREFILL_ATTENTION_BACKENDS), as for GDN: the hybrid backend's
    # attention side is the same for Mamba2.
    return {**chunk_256_engine_kwargs(model_path, prefill), **STRATEGIES[strategy]}


def _name(model, strategy):
    return f"{model}_{strategy}"


@pytest.fixture(scope="module")
def eager(model_path, strategy):
    return run_engine(
        _engine_kwargs(model_path, strategy, {"backend": "disabled"}),
        BATCHES,
        env=SWITCH,
        top_logprobs_num=TOPK,
    )


@pytest.fixture(scope="module")
def family(model):
    return FAMILY.get(model, "mamba2")


# Per model and strategy: replays on each request bucket's tables (test probe).
REQUEST_BUCKET_REPLAYS = {}


@pytest.fixture(scope="module")
def graph(model_path, strategy, family, model):
    before = probe_count(f"{family}_graph_replay")
    captures = probe_count(f"{family}_graph_capture")
    counters = [
        f"{kind}{r}"
        for kind in (f"{family}_graph_replay_slots", "graph_replay_request_slots")
        for r in _replayed_request_buckets(model)
    ]
    counts = {name: probe_count(name) for name in counters}
    results = run_engine(
        _engine_kwargs(model_path, strategy, _full(model)),
        BATCHES,
        env=SWITCH,
        top_logprobs_num=TOPK,
    )
    assert probe_count(f"{family}_graph_capture") > captures, (
        f"the {family} full prefill graph tables were never filled for a capture"
    )
    REQUEST_BUCKET_REPLAYS[model, strategy] = {
        name: probe_count(name) - n for name, n in counts.items()
    }
    return results, replays_per_batch(results, before, f"{family}_graph_replay")


def test_fewer_requests_replay_request_bucket_graphs(graph, model, strategy, family):
    """FULL's 4 request slots: batches of one and two requests replay the graphs
    of request buckets 1 and 2 (MAMBA2_REQUEST_BUCKETS; the comparison with
    eager below covers them), each after a refill of that graph's tables, on
    Mamba2 models only; with 16 slots (SLOTS) also request bucket 4."""
    n = REQUEST_BUCKET_REPLAYS[model, strategy]
    for r in _replayed_request_buckets(model):
        replays = n[f"graph_replay_request_slots{r}"]
        assert replays == n[f"{family}_graph_replay_slots{r}"], n
        assert (replays > 0) == (family == "mamba2"), n


def test_full_prefill_graph_replays(graph):
    _, replays = graph
    assert sum(replays) > 0, f"the prefill graph never replayed: {replays} per batch"


def test_one_token_prefill_replays_the_smallest_bucket(graph):
    """As in test_hybrid_full_prefill_graph.py, on Mamba2 (whose eager kernels a
    fresh server would build on the first such prompt)."""
    (one,) = one_token_batches(BATCHES)
    assert graph[1][one] > 0, f"the one-token prompt ran eager: {graph[1]} per batch"


def test_full_prefill_graph_matches_eager(graph, eager, model, strategy):
    results, replays = graph
    report = graph_vs_eager(eager, results, tol=TOL)
    write_result(
        f"mamba2_full_prefill_vs_eager_{_name(model, strategy)}",
        {
            **report,
            "prompt_lengths": [[len(p) for p in b["input_ids"]] for b in BATCHES],
            "graph_replays": replays,
        },
    )
    assert_graph_matches_eager(report)


def test_wrong_graph_state_changes_outputs(
    model_path, graph, eager, model, strategy, family
):
    """Can-fail control: the graph engine again, with every replay's Mamba2 state
    indices pointed at the padding slot (test probe fault); its outputs must
    leave the tolerance on every batch that replayed."""
    results = run_engine(
        _engine_kwargs(model_path, strategy, _full(model)),
        BATCHES,
        env={**SWITCH, "GRAPHFIX_PROBE_FAULT": f"{family}_wrong_state"},
    )
    per_batch = [compare(e, f, tol=TOL) for e, f in zip(eager, results)]
    write_result(
        f"mamba2_full_prefill_wrong_state_{_name(model, strategy)}",
        {"tolerance": TOL, "batches": per_batch},
    )
    replayed = [r for r, n in zip(per_batch, graph[1]) if n]
    assert replayed and all(diverged(r) for r in replayed), per_batch


# --- One request slot for long prompts (MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS) ---
# On as shipped up to 1536 tokens since this check passed on an H100
# (benchmark/results/gpu/mamba2_2026-12-07/; served:
# benchmark/results/gpu/serving_2026-12-07/). The check: a tiny NemotronH with
# Nemotron-H-8B's layout (MLP layers, 8 groups) and chunked prefill at 2048
# tokens, whose single prompts above REQUEST_BUCKET_MAX_TOKENS (512) replay the
# one-slot graphs of the buckets 1024 and 2048 (fresh, on a prefix hit, as a
# chunked prompt's second chunk), against eager, with the radix cache's extra
# buffer (the one-slot graph's single track row). The length bound is lifted so
# that the 2048-token bucket replays too.
ONE_SLOT_ENV = {
    **SWITCH,
    "GRAPHFIX_PROBE_MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS": "2048",
    "GRAPHFIX_PROBE_MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST": "100000",
}
ONE_SLOT_FULL = {
    "backend": "full",
    "bs": [16, 64, 256, 512, 1024, 2048],
    "full_prefill_max_req": 4,
}


def one_slot_batches() -> list:
    """Single prompts of 513-3000 tokens (one-slot graphs), one of them a prefix
    hit and one chunked in two; two prompts at once (the 4-slot graph); one of
    300 tokens (request bucket 1, under 512). 8 new tokens each."""
    p600, p1500, p3000, p513, p300 = prompts(20, [600, 1500, 3000, 513, 300])
    hit = p1500 + prompts(21, [700])[0]
    inputs = [[p600], [p1500], [hit], prompts(22, [700, 800]), [p3000], [p513], [p300]]
    return [{"input_ids": ids, "max_new_tokens": 8} for ids in inputs]


ONE_SLOT_BATCHES = one_slot_batches()
# Per batch, the prefill forwards on tables of one request slot (the one-slot
# graphs of the buckets 1024 and 2048; the last batch, 300 tokens, request
# bucket 1 of the 512-token bucket), and on all 4 slots: the prefix hit leaves
# one forward of 513-2048 new tokens, the 3000-token prompt two chunks (2048 and
# 952 tokens), the two prompts at once one forward on the 4-slot graph.
ONE_SLOT_REPLAYS = {
    "mamba2_graph_replay_slots1": [1, 1, 1, 0, 2, 1, 1],
    "mamba2_graph_replay_slots4": [0, 0, 0, 1, 0, 0, 0],
    "mamba2_graph_replay": [1, 1, 1, 1, 2, 1, 1],
}
PREFIX_HIT = 2


@pytest.fixture(scope="module")
def one_slot_settings():
    """The probe's two settings in this process too (ServerArgs resolution),
    restored after the module."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    saved = (
        capability.MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS,
        capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST,
    )
    capability.MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS = 2048
    capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST = 100000
    yield
    (
        capability.MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS,
        capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST,
    ) = saved


def _one_slot_kwargs(path, prefill):
    return {
        **chunk_256_engine_kwargs(path, prefill),
        **STRATEGIES["extra_buffer"],
        "chunked_prefill_size": 2048,
        "context_length": 4096,
    }


@pytest.fixture(scope="module")
def one_slot_path(tmp_path_factory):
    return MODELS["nemotron_h_groups8"](tmp_path_factory.mktemp("one_slot"))


@pytest.fixture(scope="module")
def one_slot_eager(one_slot_path, one_slot_settings):
    return run_engine(
        _one_slot_kwargs(one_slot_path, {"backend": "disabled"}),
        ONE_SLOT_BATCHES,
        env=ONE_SLOT_ENV,
        top_logprobs_num=TOPK,
    )


@pytest.fixture(scope="module")
def one_slot_graph(one_slot_path, one_slot_settings):
    before = {name: probe_count(name) for name in ONE_SLOT_REPLAYS}
    results = run_engine(
        _one_slot_kwargs(one_slot_path, ONE_SLOT_FULL),
        ONE_SLOT_BATCHES,
        env=ONE_SLOT_ENV,
        top_logprobs_num=TOPK,
    )
    return results, {
        name: replays_per_batch(results, n, name) for name, n in before.items()
    }


def test_one_slot_graphs_replay_single_long_prompts(one_slot_graph):
    """Every prefill forward replays a graph: those of a single prompt on tables
    of one request slot, the two prompts at once on all four (the probe's
    counts per batch), the prefix hit after a hit of the radix cache."""
    results, replays = one_slot_graph
    assert replays == ONE_SLOT_REPLAYS, replays
    hit = results[PREFIX_HIT][0]["cached_tokens"]
    new = len(ONE_SLOT_BATCHES[PREFIX_HIT]["input_ids"][0]) - (hit or 0)
    assert hit and 512 < new <= 2048, hit


def test_one_slot_graphs_match_eager(one_slot_graph, one_slot_eager):
    results, replays = one_slot_graph
    report = graph_vs_eager(one_slot_eager, results, tol=TOL)
    write_result(
        "mamba2_one_slot_graph_vs_eager_nemotron_h_groups8_extra_buffer",
        {
            **report,
            "prompt_lengths": [
                [len(p) for p in b["input_ids"]] for b in ONE_SLOT_BATCHES
            ],
            "graph_replays": replays,
        },
    )
    assert_graph_matches_eager(report)


def test_one_slot_wrong_graph_state_changes_outputs(
    one_slot_path, one_slot_graph, one_slot_eager
):
    """Can-fail control, as test_wrong_graph_state_changes_outputs: the graph
    engine with every replay's Mamba2 state pointed at the padding slot."""
    before = probe_count("mamba2_graph_replay")
    results = run_engine(
        _one_slot_kwargs(one_slot_path, ONE_SLOT_FULL),
        ONE_SLOT_BATCHES,
        env={**ONE_SLOT_ENV, "GRAPHFIX_PROBE_FAULT": "mamba2_wrong_state"},
    )
    per_batch = [compare(e, f, tol=TOL) for e, f in zip(one_slot_eager, results)]
    write_result(
        "mamba2_one_slot_graph_wrong_state_nemotron_h_groups8_extra_buffer",
        {"tolerance": TOL, "batches": per_batch},
    )
    replayed = [
        r
        for r, n in zip(
            per_batch, replays_per_batch(results, before, "mamba2_graph_replay")
        )
        if n
    ]
    assert replayed and all(diverged(r) for r in replayed), per_batch
