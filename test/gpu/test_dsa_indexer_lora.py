"""DSA indexer weights_proj LoRA (tiny random DeepSeek-V3.2) under sglang's default
breakable prefill CUDA graph, on a real sglang.Engine, against the same engine
with the prefill graph disabled. Upstream 0.5.23 refuses at capture
(GRAPH_WEIGHTS_PROJ_LORA_ERROR), so the server cannot start with such an adapter.

Two engines, both with the adapter loaded and indexer fusion off (the LoRA
manager rejects indexer targets with it on):
  graph: prefill graph left at sglang's default (breakable); runs a short warm-up,
         the prompts with the adapter, then the same prompts without it.
  eager: prefill graph disabled; runs the same warm-up and adapter prompts.
"""

import pytest
from dsa_model import (
    CONTEXT,
    INDEX_TOPK,
    NUM_LAYERS,
    build_tiny_dsa_model,
    build_weights_proj_adapter,
    dsa_prompts,
)
from engine_utils import compare, probe_count, run_engine, write_result

# Greedy logprobs of the graph and eager engines: both run the same bf16 kernels
# on the same data (the graph pads the token count to its bucket), so they should
# agree to rounding. Estimated with transformers' fp32 CPU forward of this
# checkpoint: the adapter changes the first greedy token of one prompt in four
# and moves the chosen logprob of the others by 0.03 / 0.17 / 0.23 (over the last
# 64 positions of a 4000-token prompt: half the argmaxes flip, median 0.14),
# while re-running the model in bf16 instead of fp32 moves them by a median
# 0.035. test_adapter_changes_outputs checks that 0.05 tells the adapter apart
# on the GPU run itself.
TOL = 0.05
ADAPTER = "wp"
RANK = 8
COUNTER = "dsa_lora_head_gate"
# Longer than index_topk, so the indexer drops up to half of each context and
# the split op computes the head gate (it skips the logits when every sequence
# fits in index_topk).
PROMPT_LENS = [3300, 3600, 3800, 4000]
MAX_NEW_TOKENS = 8
# Token buckets of the prefill graph: any 1-4 of the prompts sum to a count
# within BCG's 2x padding limit of one of them (3300..4000 -> 4096,
# 6900..7800 -> 8192, 10700..14700 -> 16384).
PREFILL_BUCKETS = [4096, 8192, 16384]
PROMPTS = dsa_prompts(0, PROMPT_LENS)
# Shorter than index_topk: the indexer stores K only (no head gate), and no
# bucket fits it, so it prefills eagerly. Its counter snapshot is the baseline
# after startup (capture included).
WARMUP = {"input_ids": dsa_prompts(1, [64]), "max_new_tokens": 1, "lora_path": ADAPTER}
WITH_ADAPTER = {
    "input_ids": PROMPTS,
    "max_new_tokens": MAX_NEW_TOKENS,
    "lora_path": ADAPTER,
}
WITHOUT_ADAPTER = {
    "input_ids": PROMPTS,
    "max_new_tokens": MAX_NEW_TOKENS,
    "lora_path": None,
}
ENV = {"SGLANG_DISABLE_DSA_INDEXER_FUSION": "1"}

assert min(PROMPT_LENS) > INDEX_TOPK and max(PROMPT_LENS) + MAX_NEW_TOKENS < CONTEXT


def _engine_kwargs(model_path, adapter_path, prefill):
    return {
        "model_path": model_path,
        # DSA defaults to an fp8 KV cache; bf16 selects the flashmla_sparse
        # prefill and fa3 decode (attention backend "dsa" is picked for DSA).
        "kv_cache_dtype": "bfloat16",
        "enable_lora": True,
        "lora_paths": {ADAPTER: adapter_path},
        "max_lora_rank": RANK,
        "lora_target_modules": ["weights_proj"],
        "max_loras_per_batch": 2,
        "context_length": CONTEXT,
        "chunked_prefill_size": 16384,
        # Every batch prefills its whole prompts (no prefix reuse across the
        # adapter and base-model runs).
        "disable_radix_cache": True,
        "mem_fraction_static": 0.3,
        "cuda_graph_config": {"decode": {"max_bs": 4}, "prefill": prefill},
    }


def _counts(batch_result):
    return batch_result[0]["probe_counts"].get(COUNTER, 0)


@pytest.fixture(scope="module")
def dsa_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("dsa")
    model = build_tiny_dsa_model(root / "model")
    return model, build_weights_proj_adapter(model, root / "adapter", rank=RANK)


@pytest.fixture(scope="module")
def graph_run(dsa_paths):
    """Default (breakable) prefill graph: only the capture buckets are set."""
    before = probe_count(COUNTER)
    kwargs = _engine_kwargs(
        *dsa_paths, {"max_bs": max(PREFILL_BUCKETS), "bs": PREFILL_BUCKETS}
    )
    warmup, with_adapter, without_adapter = run_engine(
        kwargs, [WARMUP, WITH_ADAPTER, WITHOUT_ADAPTER], env=ENV
    )
    return {
        "before": before,
        "warmup": warmup,
        "with": with_adapter,
        "without": without_adapter,
    }


@pytest.fixture(scope="module")
def eager_run(dsa_paths):
    before = probe_count(COUNTER)
    kwargs = _engine_kwargs(*dsa_paths, {"backend": "disabled"})
    warmup, with_adapter = run_engine(kwargs, [WARMUP, WITH_ADAPTER], env=ENV)
    return {"before": before, "warmup": warmup, "with": with_adapter}


def _first_step_diffs(a, b):
    """Per prompt: (same first token, |logprob difference|) of the first generated
    token, which only the prefill decides."""
    return [
        (
            ra["output_ids"][0] == rb["output_ids"][0],
            abs(ra["output_logprobs"][0] - rb["output_logprobs"][0]),
        )
        for ra, rb in zip(a, b)
    ]


def test_breakable_engine_starts_and_captures_the_lora_split_op(graph_run):
    """Capturing a bucket longer than index_topk runs the indexer split op with the
    LoRA-owned weights_proj: where upstream raised."""
    captured = _counts(graph_run["warmup"]) - graph_run["before"]
    write_result("dsa_lora_startup", {"capture_head_gate_calls": captured})
    assert captured >= NUM_LAYERS, (
        "capture never reached the indexer split op's head gate"
    )


def test_breakable_prefill_graph_matches_eager_with_adapter(graph_run, eager_run):
    report = compare(eager_run["with"], graph_run["with"], tol=TOL)
    total = len(PROMPTS) * MAX_NEW_TOKENS
    write_result(
        "dsa_lora_graph_vs_eager",
        {
            "tol": TOL,
            "prompt_lens": PROMPT_LENS,
            "max_new_tokens": MAX_NEW_TOKENS,
            **report,
            "first_step": _first_step_diffs(eager_run["with"], graph_run["with"]),
            "graph_seconds": graph_run["with"][0]["seconds"],
            "eager_seconds": eager_run["with"][0]["seconds"],
        },
    )
    assert not report["mismatches"], report
    # Splits only at near ties, and rarely: most steps are really compared.
    assert report["compared_steps"] >= total // 2, report


def test_adapter_changes_outputs(graph_run, eager_run):
    """Can-fail control: the comparison above tells the adapter apart. The same
    graph engine without the adapter disagrees with itself with the adapter, and
    with the eager engine, which is what a graph path that dropped the LoRA delta
    would show."""
    self_report = compare(graph_run["without"], graph_run["with"], tol=TOL)
    eager_report = compare(eager_run["with"], graph_run["without"], tol=TOL)
    write_result(
        "dsa_lora_adapter_effect",
        {
            "tol": TOL,
            "graph_without_vs_with": self_report,
            "eager_with_vs_graph_without": eager_report,
            "first_step_graph_without_vs_with": _first_step_diffs(
                graph_run["without"], graph_run["with"]
            ),
        },
    )
    assert self_report["mismatches"], (
        f"the adapter changed nothing beyond tol={TOL}: {self_report}"
    )
    assert eager_report["mismatches"], (
        f"dropping the adapter in the graph would pass: {eager_report}"
    )


def test_graph_split_op_applies_the_lora_head_gate(graph_run, eager_run):
    """The adapter prompts prefilled through the graph's indexer split op: its head
    gate ran with the LoRA-owned weights_proj (the eager engine never calls it
    so, as the eager path applies LoRA itself)."""
    graph_calls = _counts(graph_run["with"]) - _counts(graph_run["warmup"])
    eager_calls = _counts(eager_run["with"]) - eager_run["before"]
    write_result(
        "dsa_lora_graph_path",
        {
            "graph_adapter_batch_head_gate_calls": graph_calls,
            "eager_engine_head_gate_calls": eager_calls,
        },
    )
    # One call per layer for each prefill forward replayed from the graph.
    assert graph_calls >= NUM_LAYERS and graph_calls % NUM_LAYERS == 0, graph_calls
    assert eager_calls == 0, eager_calls
