"""A full prefill CUDA graph decided when sglang.Engine resolves its arguments:

* refused with a ValueError before any weights load (config-only model dirs)
  where it cannot capture: a Mamba2 hybrid (NemotronH "M*M-") with flashinfer
  outside the configurations checked on a GPU (the config names no dtype, so
  sglang serves it in float16), and GDN (Qwen3-Next) with the triton attention
  backend. Upstream 0.5.23 accepts both and fails during capture (IndexError in
  HybridLinearAttnBackend._replay_metadata / "Invalid forward mode"). (Falcon-H1
  and NemotronH of Mamba2 and attention layers only run breakable instead, before any judgement:
  test/unit/srt/arg_groups/test_cuda_graph_hook.py.)
* untouched where it can: a tiny random Llama with flashinfer captures the full
  prefill graph, replays it, and matches the same engine with the prefill graph
  disabled (greedy tokens and logprobs, and the prefill's top-20 logprobs). The
  same comparison fails against the eager outputs of other prompts (rotated by one).
"""

import json
import re
import time

import pytest
from engine_utils import (
    assert_graph_matches_eager,
    compare,
    diverged,
    first_token_topk,
    graph_vs_eager,
    run_engine,
    write_result,
)
from models import prompts, tiny_llama
from tiny_configs import write_config

# Refusals come from resolution in the calling process, before any subprocess,
# weight or tokenizer load; a few seconds also covers a loaded host.
REFUSAL_SECONDS = 15
CAPS = {
    # Capped pools: the GPU suite runs several engines on one GPU at once.
    "mem_fraction_static": 0.3,
    "max_total_tokens": 32768,
    "cuda_graph_max_bs_decode": 4,
    "context_length": 2048,
}
FULL = {"backend": "full", "bs": [16, 32, 64, 128, 256], "full_prefill_max_req": 4}


# Mamba2: refused outside the configuration the H200 runs checked (these configs
# name no dtype: sglang serves them in float16).
_MAMBA2_DTYPE = "checked on a GPU in bfloat16 only; this model serves in float16"
REFUSED = {
    # name: (config-only model dir builder, attention backend, what the error names)
    "nemotron_h": (lambda p: write_config("nemotron_h", p), "flashinfer", ["NemotronHForCausalLM", "Mamba2/short-conv", _MAMBA2_DTYPE]),
    "qwen3_next_triton": (lambda p: write_config("qwen3_next", p), "triton", ["Qwen3NextForCausalLM", "GDN", "full-attention backend triton"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def engine_cls():
    """sglang.Engine, imported and its plugins loaded before any clock starts."""
    from sglang import Engine
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return Engine


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_explicit_full_is_refused_before_weights_load(name, tmp_path, engine_cls):
    build, attention, named = REFUSED[name]
    model_path = build(tmp_path)
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        engine_cls(
            model_path=model_path,
            skip_tokenizer_init=True,
            attention_backend=attention,
            max_mamba_cache_size=64,
            cuda_graph_config={"prefill": FULL},
            **CAPS,
        )
    seconds = time.perf_counter() - start
    message = str(err.value)
    write_result(
        f"full_prefill_config_refused_{name}", {"seconds": seconds, "error": message}
    )
    assert seconds < REFUSAL_SECONDS, seconds
    for text in named + [
        f"full-attention backend {attention}",
        "--cuda-graph-backend-prefill breakable",
        "--cuda-graph-backend-prefill disabled",
    ]:
        assert text in message, message


# ---- Llama: the full prefill graph still captures and matches eager ----

TOL = 0.05
TOPK = 20
CHUNK = 256  # also the largest captured token bucket
BATCHES = [
    # Fewer requests than the prefill slot count (4), one of a single token.
    {"input_ids": prompts(11, [1, 7, 64]), "max_new_tokens": 8},
    {"input_ids": prompts(12, [200]), "max_new_tokens": 8},
    # Chunked prefill: the second chunk extends a 256-token prefix.
    {"input_ids": prompts(13, [300]), "max_new_tokens": 8},
    # A full set of slots, one of them a radix-cache hit on the prompt above.
    {"input_ids": prompts(14, [5, 17, 90]) + [prompts(13, [300])[0][:256] + [5, 6, 7]], "max_new_tokens": 8},
]  # fmt: skip


def _llama_kwargs(model_path, prefill):
    return {
        "model_path": model_path,
        "attention_backend": "flashinfer",
        "chunked_prefill_size": CHUNK,
        "cuda_graph_config": {"prefill": prefill},
        **CAPS,
    }


def _logging_env(tmp_path, name):
    """sglang's SGLANG_LOGGING_CONFIG_PATH: every engine process logs INFO to a file."""
    log = tmp_path / f"{name}.log"
    config = tmp_path / f"{name}_logging.json"
    config.write_text(
        json.dumps(
            {
                "version": 1,
                "disable_existing_loggers": False,
                "formatters": {"plain": {"format": "%(name)s %(message)s"}},
                "handlers": {
                    "file": {
                        "class": "logging.FileHandler",
                        "filename": str(log),
                        "formatter": "plain",
                    }
                },
                "root": {"level": "INFO", "handlers": ["file"]},
            }
        )
    )
    return {"SGLANG_LOGGING_CONFIG_PATH": str(config)}, log


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def llama_runs(llama_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama_logs")
    env, log = _logging_env(tmp, "graph")
    graph = run_engine(
        {**_llama_kwargs(llama_path, FULL), "log_level": "info"},
        BATCHES,
        env=env,
        top_logprobs_num=TOPK,
    )
    eager = run_engine(
        _llama_kwargs(llama_path, {"backend": "disabled"}),
        BATCHES,
        top_logprobs_num=TOPK,
    )
    return graph, eager, log.read_text()


def test_llama_full_prefill_graph_captures_and_replays(llama_runs):
    _, _, log = llama_runs
    assert re.search(r"prefill CUDA graph begin\. backend=full", log), log[-3000:]
    replayed = re.findall(r"Prefill batch.*cuda graph: True", log)
    assert replayed, [line for line in log.splitlines() if "Prefill batch" in line]


def test_llama_full_prefill_graph_matches_eager(llama_runs):
    graph, eager, log = llama_runs
    report = graph_vs_eager(eager, graph, tol=TOL)
    # Can-fail control: the same comparisons against the eager outputs of other
    # prompts (rotated by one) must fail.
    flat_eager = [r for batch in eager for r in batch]
    flat_graph = [r for batch in graph for r in batch]
    rotated_eager = flat_eager[1:] + flat_eager[:1]
    control = compare(rotated_eager, flat_graph, tol=TOL)
    control_first = first_token_topk(rotated_eager, flat_graph)
    write_result(
        "llama_full_prefill_vs_eager",
        {
            **report,
            "prompt_lengths": [[len(p) for p in b["input_ids"]] for b in BATCHES],
            "prefill_batches_on_graph": len(re.findall(r"Prefill batch.*cuda graph: True", log)),
            "prefill_batches_eager": len(re.findall(r"Prefill batch.*cuda graph: False", log)),
            "control_rotated_prompts": {"tokens": control, "first_token_topk": control_first},
        },
    )  # fmt: skip
    assert_graph_matches_eager(report)
    assert diverged(control), control
    assert max(control_first["shared_topk_per_prompt"]) < TOPK // 2, control_first
