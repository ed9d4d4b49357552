"""The full prefill CUDA graph on a GDN hybrid at a realistic weight scale (a
Qwen3-Next layout at hidden 1024, 8 layers, transformers' init; see
models.qwen3_next_1024): equal to eager on the same kernels, finite, and as far
from an fp32 reference (transformers' own float32 forward of the same checkpoint)
as sglang's eager kernels, on the first generated token of single prompts from 1
to 513 tokens.

Engines (real sglang.Engine, chunked prefill 512; full graphs: buckets of 1 to
512 tokens, so every prompt replays the graph or, at 513, runs a second chunk,
and 4 request slots, so every replay carries zero-length padding requests):
  full             the graph as shipped: on an H200 it captures sglang's default
                   GDN prefill, FlashInfer's (FLASHINFER_GDN_CAPTURE_SM); its
                   eager twin is "default";
  full_triton      the graph with --linear-attn-prefill-backend triton (the
                   Triton chunk kernels captured); its eager twin is "triton";
  wrong_state      "full" with every replay pointed at the padding state slot
                   (test probe fault): the control;
  default          prefill graph disabled, sglang's default kernels (FlashInfer's
                   GDN prefill on an H200);
  triton           prefill graph disabled, --linear-attn-prefill-backend triton.

Per prompt the fp32 error is |engine logprob - fp32 logprob| of the engine's
greedy first token (NaN counts as worse). Issue 13's goal, a full graph no
further from fp32 than sglang's default on every prompt length, is recorded
(meets_default_accuracy); asserted is that a graph is no further than the worse
of the two eager kernels (SLACK: bf16 rounding of the attention layers)."""

import math

import pytest
import torch
from engine_utils import (
    assert_graph_matches_eager,
    diverged,
    graph_vs_eager,
    probe_count,
    replays_per_batch,
    run_engine,
    write_result,
)
from models import prompts, qwen3_next_1024

LENGTHS = [1, 4, 16, 63, 64, 65, 127, 200, 300, 512, 513]
SLACK = 0.01
TOL = 0.05  # graph vs eager on the same kernels (this model's, hidden 1024)
TOPK = 20


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return qwen3_next_1024(tmp_path_factory.mktemp("qwen3_next_1024"))


@pytest.fixture(scope="module")
def prompt_ids():
    return prompts(21, LENGTHS)


def _kwargs(path, prefill, **extra):
    return {
        "model_path": path,
        "chunked_prefill_size": 512,
        "context_length": 4096,
        "mem_fraction_static": 0.25,
        "max_total_tokens": 32768,
        "max_mamba_cache_size": 64,
        "cuda_graph_max_bs_decode": 4,
        "cuda_graph_config": {"prefill": prefill},
        **extra,
    }


# Buckets down to 1 token: sglang replays a batch only into a bucket at most
# twice its tokens (_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR).
FULL = {
    "backend": "full",
    "bs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    "full_prefill_max_req": 4,
}
DISABLED = {"backend": "disabled"}
TRITON = {"linear_attn_prefill_backend": "triton"}
# name: (prefill graph, engine flags, environment, eager twin)
ENGINES = {
    "default": (DISABLED, {}, None, None),
    "triton": (DISABLED, TRITON, None, None),
    "full": (FULL, {}, None, "default"),
    "full_triton": (FULL, TRITON, None, "triton"),
    "wrong_state": (FULL, {}, {"GRAPHFIX_PROBE_FAULT": "gdn_wrong_state"}, "default"),
}


@pytest.fixture(scope="module")
def engines(model_path, prompt_ids):
    """Per engine: one batch per prompt (each its own prefill) and, for the full
    graphs, the graph replays per batch."""
    batches = [{"input_ids": [p], "max_new_tokens": 1} for p in prompt_ids]
    out = {}
    for name, (prefill, flags, env, _) in ENGINES.items():
        before = probe_count("gdn_graph_replay")
        results = run_engine(
            _kwargs(model_path, prefill, **flags),
            batches,
            env=env,
            top_logprobs_num=TOPK,
        )
        out[name] = results
        out[f"{name}_replays"] = replays_per_batch(results, before, "gdn_graph_replay")
    return out


@pytest.fixture(scope="module")
def reference(model_path, prompt_ids):
    """fp32 transformers forward: the last position's log-softmax per prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model = model.to("cuda").eval()
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            logits = model(torch.tensor([ids], device="cuda")).logits[0, -1]
            out.append(torch.log_softmax(logits.double(), -1).cpu())
    del model
    torch.cuda.empty_cache()
    return out


def _fp32_errors(results, reference) -> list:
    """Per prompt: |logprob - fp32 logprob| of the engine's greedy first token."""
    return [
        abs(batch[0]["output_logprobs"][0] - float(ref[batch[0]["output_ids"][0]]))
        for batch, ref in zip(results, reference)
    ]


def _replayed_every_prompt(engines, name):
    replays = engines[f"{name}_replays"][: LENGTHS.index(512) + 1]
    assert all(n > 0 for n in replays), (name, replays)


@pytest.mark.parametrize("name", ["full", "full_triton"])
def test_full_graph_matches_eager_on_the_same_kernels(engines, name):
    twin = ENGINES[name][3]
    report = graph_vs_eager(engines[twin], engines[name], tol=TOL)
    logprobs = [b[0]["output_logprobs"][0] for b in engines[name]]
    write_result(
        f"gdn_prefill_1024_{name}_vs_{twin}",
        {
            **report,
            "prompt_lengths": LENGTHS,
            "graph_replays": engines[f"{name}_replays"],
            "non_finite_lengths": [
                n for n, lp in zip(LENGTHS, logprobs) if not math.isfinite(lp)
            ],
        },
    )
    _replayed_every_prompt(engines, name)
    assert all(math.isfinite(lp) for lp in logprobs), logprobs
    assert_graph_matches_eager(report)


def test_wrong_state_control_diverges(engines):
    """The control: the same comparison fails with a wrong state table."""
    _replayed_every_prompt(engines, "wrong_state")
    per_batch = [
        graph_vs_eager([e], [w], tol=TOL)["batches"][0]
        for e, w in zip(engines["default"], engines["wrong_state"])
    ]
    write_result(
        "gdn_prefill_1024_wrong_state",
        {"tolerance": TOL, "prompt_lengths": LENGTHS, "batches": per_batch},
    )
    assert sum(map(diverged, per_batch)) >= len(LENGTHS) // 2, per_batch


@pytest.mark.parametrize("name", ["full", "full_triton"])
def test_full_graph_is_as_close_to_fp32_as_eager(engines, reference, name):
    errors = {
        n: _fp32_errors(engines[n], reference) for n in (name, "default", "triton")
    }
    bound = [max(d, t) + SLACK for d, t in zip(errors["default"], errors["triton"])]
    worse_than_eager = [
        n for n, e, b in zip(LENGTHS, errors[name], bound) if not e <= b
    ]
    worse_than_default = [
        n
        for n, e, d in zip(LENGTHS, errors[name], errors["default"])
        if not e <= d + SLACK
    ]
    write_result(
        f"gdn_prefill_1024_{name}_fp32",
        {
            "prompt_lengths": LENGTHS,
            "slack": SLACK,
            "fp32_error": errors,
            "lengths_worse_than_both_eager_kernels": worse_than_eager,
            "lengths_worse_than_default": worse_than_default,
            "meets_default_accuracy": not worse_than_default,
        },
    )
    assert not worse_than_eager, worse_than_eager
