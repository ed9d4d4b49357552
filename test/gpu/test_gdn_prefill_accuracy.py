"""Accuracy of the full prefill CUDA graph on a GDN hybrid against an fp32
reference: transformers' own forward of the same checkpoint in float32 (a
Qwen3-Next layout at hidden 1024, 8 layers, transformers' init; see
models.qwen3_next_1024), on the first generated token of single prompts from 1
to 513 tokens.

Engines (real sglang.Engine, chunked prefill 512, prefill graph buckets of 1 to
512 tokens so that every prompt replays the graph or, at 513, runs a second
chunk):
  full             --cuda-graph-backend-prefill full as shipped: the graph
                   captures the Triton GDN kernels (FLASHINFER_GDN_CAPTURE_SM off);
  full_flashinfer  the same with FlashInfer's GDN prefill captured (sglang's
                   default on an H200; the switch set by the test probe);
  wrong_state      the full graph with every replay pointed at the padding
                   state slot (test probe fault): the control;
  default          prefill graph disabled, sglang's default kernels.

Per prompt the error is |engine logprob - fp32 logprob| of the engine's greedy
first token (NaN counts as worse). A full graph must be at least as accurate as
sglang's default on every prompt length, within SLACK (bf16 rounding of the
attention layers, whose prefill is planned differently in and out of the graph).
The control must fail that same check."""

import pytest
import torch
from engine_utils import probe_count, replays_per_batch, run_engine, write_result
from models import prompts, qwen3_next_1024

LENGTHS = [1, 4, 16, 63, 64, 65, 127, 200, 300, 512, 513]
SLACK = 0.01
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
FULL = {"backend": "full", "bs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]}
DISABLED = {"backend": "disabled"}


def _first_tokens(path, prefill, prompt_ids, env=None):
    """One batch per prompt (each its own prefill); per prompt the greedy first
    token and its top-k logprobs."""
    batches = [{"input_ids": [p], "max_new_tokens": 1} for p in prompt_ids]
    return run_engine(_kwargs(path, prefill), batches, env=env, top_logprobs_num=TOPK)


FULL_ENGINES = {
    "full": None,
    "full_flashinfer": {"GRAPHFIX_PROBE_FLASHINFER_GDN_CAPTURE_SM": "90"},
    "wrong_state": {"GRAPHFIX_PROBE_FAULT": "gdn_wrong_state"},
}


@pytest.fixture(scope="module")
def engines(model_path, prompt_ids):
    out = {"default": _first_tokens(model_path, DISABLED, prompt_ids)}
    for name, env in FULL_ENGINES.items():
        before = probe_count("gdn_graph_replay")
        out[name] = _first_tokens(model_path, FULL, prompt_ids, env=env)
        out[f"{name}_replays"] = replays_per_batch(
            out[name], before, "gdn_graph_replay"
        )
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


def _errors(results, reference):
    """Per prompt: error of the greedy token's logprob, and the largest error
    over the engine's top-k tokens."""
    rows = []
    for batch, ref in zip(results, reference):
        first = batch[0]
        token, logprob = first["output_ids"][0], first["output_logprobs"][0]
        topk = first["first_topk"]
        rows.append(
            {
                "token": token,
                "greedy_error": abs(logprob - float(ref[token])),
                "topk_max_error": max(abs(v - float(ref[t])) for t, v in topk.items()),
            }
        )
    return rows


def _judge(engines, reference, name) -> list:
    """Record the engine's errors beside the default's; return the prompt lengths
    where it is less accurate than the default by more than SLACK."""
    errors = {n: _errors(engines[n], reference) for n in (name, "default")}
    greedy = {n: [r["greedy_error"] for r in rows] for n, rows in errors.items()}
    worse = [
        length
        for length, e, d in zip(LENGTHS, greedy[name], greedy["default"])
        if not e <= d + SLACK  # NaN is worse
    ]
    write_result(
        f"gdn_prefill_accuracy_fp32_{name}",
        {
            "engine": name,
            "prompt_lengths": LENGTHS,
            "slack": SLACK,
            "errors": errors,
            "greedy_error": greedy,
            "lengths_worse_than_default": worse,
            "graph_replays": engines[f"{name}_replays"],
            "same_greedy_token_as_default": sum(
                a[0]["output_ids"][0] == b[0]["output_ids"][0]
                for a, b in zip(engines[name], engines["default"])
            ),
        },
    )
    # The graph really ran: every prompt within the largest bucket replayed it.
    replays = engines[f"{name}_replays"][: LENGTHS.index(512) + 1]
    assert all(n > 0 for n in replays), replays
    return worse


@pytest.mark.parametrize("name", ["full", "full_flashinfer"])
def test_full_graph_is_at_least_as_accurate_as_sglangs_default(
    engines, reference, name
):
    assert not _judge(engines, reference, name)


def test_wrong_state_control_fails_the_check(engines, reference):
    assert _judge(engines, reference, "wrong_state")
