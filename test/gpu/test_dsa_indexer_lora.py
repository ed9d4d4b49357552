"""DSA indexer weights_proj LoRA (tiny random DeepSeek-V3.2) under sglang's default
breakable prefill CUDA graph, on real sglang.Engines, against the same engine with
the prefill graph disabled. Upstream 0.5.23 refuses at capture
(GRAPH_WEIGHTS_PROJ_LORA_ERROR), so the server cannot start with such an adapter.

Two adapters of different ranks, both on indexer.weights_proj: "wp" (rank 8, that
module only) and "full" (rank 16, also the attention projections q_b_proj and
o_proj, whose LoRA kernels are captured in the graph's segments). sglang's Triton
LoRA backend (GRAPHFIX_DSA_LORA_BACKEND overrides it, e.g. csgmv, the server
default), indexer fusion off (the LoRA manager rejects indexer targets with it on).
Three engine starts:
  graph:    prefill graph left at sglang's default (breakable), sglang-graphfix
            loaded; a warm-up, the prompts with each adapter and without one, one
            mixed batch (a request per adapter and one without), one batch of a
            request per adapter, and each request of the mixed batch alone. The
            head gate takes each of its three paths: one adapter for every
            request (merged weight), several (whole-gate kernel), a request
            without one (GEMM + delta kernel).
  eager:    prefill graph disabled; the warm-up and the prompts with each adapter.
  baseline: the graph engine's arguments in a child process whose only plugin
            is the test probe in its upstream mode (it applies nothing and
            records, per engine process, that sglang-graphfix is absent): it
            must fail at startup with upstream's error.
  memory:   the graph engine's arguments in a child process at sglang's
            default log level (info), with torch's dynamo log on: the merged
            gate's reservation is logged before the KV cache is sized, its
            scaling kernel compiles at startup and not on the first request on
            one adapter, and unloading that adapter drops its merged weights.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from dsa_model import (
    CONTEXT,
    HIDDEN,
    INDEX_N_HEADS,
    INDEX_TOPK,
    NUM_LAYERS,
    build_lora_adapter,
    build_tiny_dsa_model,
    dsa_prompts,
)
from engine_utils import (
    PROBE_DIR,
    PROBE_PATH,
    compare,
    probe_count,
    run_engine,
    write_result,
)

# Greedy logprobs of the graph and eager engines: both run the same bf16 kernels
# on the same data (the graph pads the token count to its bucket), so they should
# agree to rounding. Estimated with transformers' fp32 CPU forward of this
# checkpoint: the "wp" adapter changes the first greedy token of one prompt in
# four and moves the chosen logprob of the others by 0.03 / 0.17 / 0.23 (over the
# last 64 positions of a 4000-token prompt: half the argmaxes flip, median 0.14),
# while re-running the model in bf16 instead of fp32 moves them by a median
# 0.035. test_adapter_changes_outputs checks that 0.05 tells the adapter apart
# on the GPU run itself. The split op's head gate keeps the base GEMM in fp32
# (as without LoRA) where the eager LoRA path rounds base + delta to bf16: a
# 0.4% gate difference, far below the adapter's. The logits are bf16, so the
# smallest logprob step between two runs is one ulp of the chosen logit: 0.03125
# in [4, 8), 0.0625 in [8, 16). The H200 runs' differences are such steps (graph
# vs eager and batch vs alone: 0.029-0.033; csgmv, the two-adapter batch vs
# alone at decode step 5: 0.061, which failed the first tolerance, 0.05); the
# adapter moves them by 0.06-0.37 and flips tokens (test_adapter_changes_outputs
# checks this tolerance still tells it apart).
TOL = 0.07
LORA_BACKEND = os.environ.get("GRAPHFIX_DSA_LORA_BACKEND", "triton")
ADAPTERS = {
    "wp": {"rank": 8, "seed": 1234},
    "full": {"rank": 16, "seed": 4321, "attention_scale": 0.03},
}
TARGETS = ["weights_proj", "q_b_proj", "o_proj"]
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
WARMUP = {"input_ids": dsa_prompts(1, [64]), "max_new_tokens": 1, "lora_path": "wp"}


def _batch(prompts, lora_path):
    return {
        "input_ids": prompts,
        "max_new_tokens": MAX_NEW_TOKENS,
        "lora_path": lora_path,
    }


WITH = {name: _batch(PROMPTS, name) for name in ADAPTERS}
WITHOUT = _batch(PROMPTS, None)
# One prefill forward (10700 tokens, bucket 16384) serving a request per adapter
# and one without; each request alone replays the 4096 bucket.
MIXED_LORAS = ["wp", None, "full"]
MIXED = _batch(PROMPTS[:3], MIXED_LORAS)
ALONE = [_batch([p], lora) for p, lora in zip(PROMPTS, MIXED_LORAS)]
# Every request on an adapter, two adapters (7100 tokens, bucket 8192): prompts 0
# and 2 of the mixed batch, with their adapters.
TWO_ADAPTERS = _batch([PROMPTS[0], PROMPTS[2]], ["wp", "full"])
ENV = {"SGLANG_DISABLE_DSA_INDEXER_FUSION": "1"}
# The baseline's plugins: not "graphfix", only the test probe, whose upstream
# mode skips its usual sglang_graphfix.register() and records instead whether
# each engine process runs without sglang-graphfix's hooks.
BASELINE_ENV = {
    "SGLANG_PLUGINS": "graphfix_test_probe",
    "GRAPHFIX_PROBE_UPSTREAM": "1",
}

assert min(PROMPT_LENS) > INDEX_TOPK and max(PROMPT_LENS) + MAX_NEW_TOKENS < CONTEXT


def _engine_kwargs(model_path, adapter_paths, prefill):
    return {
        "model_path": model_path,
        # DSA defaults to an fp8 KV cache; bf16 selects the flashmla_sparse
        # prefill and fa3 decode (attention backend "dsa" is picked for DSA).
        "kv_cache_dtype": "bfloat16",
        "enable_lora": True,
        "lora_paths": adapter_paths,
        "lora_backend": LORA_BACKEND,
        "max_lora_rank": max(a["rank"] for a in ADAPTERS.values()),
        "lora_target_modules": TARGETS,
        # Both adapters and the base model in one batch.
        "max_loras_per_batch": 3,
        "context_length": CONTEXT,
        "chunked_prefill_size": 16384,
        # Every batch prefills its whole prompts (no prefix reuse across the
        # adapter and base-model runs).
        "disable_radix_cache": True,
        "mem_fraction_static": 0.3,
        "max_total_tokens": 32768,
        "cuda_graph_config": {"decode": {"max_bs": 4}, "prefill": prefill},
    }


def _graph_prefill():
    """Default (breakable) prefill graph: only the capture buckets are set."""
    return {"max_bs": max(PREFILL_BUCKETS), "bs": PREFILL_BUCKETS}


class EngineStartupError(RuntimeError):
    """The engine did not start; the message is the child process's output."""


_CHILD = """
import json, sys
import sglang
engine = sglang.Engine(**json.loads(sys.argv[1]))
print("ENGINE_STARTED", flush=True)
engine.shutdown()
"""


def _run_child(script: str, argv: list, env: dict, timeout: int = 900):
    """Run ``script`` in a child Python with ``env`` (and the test probe on its
    PYTHONPATH); (exit code, its output: stdout and stderr, the engine
    processes' logs included). A child, because a scheduler that fails at
    startup SIGQUITs its parent, whose handler kills that process tree."""
    env = {**env}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROBE_PATH), os.environ.get("PYTHONPATH")) if p
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise EngineStartupError(f"timed out after {timeout} s:\n{output}") from None
    finally:
        try:  # its scheduler/detokenizer, if any outlived it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, output


def _start_engine_without_graphfix(engine_kwargs: dict, timeout: int = 900) -> None:
    """Start (and shut down) an engine in a child Python with BASELINE_ENV; raise
    EngineStartupError with its output if it does not start."""
    env = {**os.environ, **ENV, **BASELINE_ENV}
    env.pop("GRAPHFIX_PROBE_FAULT", None)
    kwargs = {"skip_tokenizer_init": True, "log_level": "warning", **engine_kwargs}
    returncode, output = _run_child(_CHILD, [json.dumps(kwargs)], env, timeout)
    if returncode != 0 or "ENGINE_STARTED" not in output:
        raise EngineStartupError(f"exit code {returncode}:\n{output}")


def _counts(batch_result, counter=COUNTER):
    return batch_result[0]["probe_counts"].get(counter, 0)


def _kernels(after, before):
    """The LoRA head gate's paths between two batch results of one engine:
    merged-weight GEMMs, sgl-kernel's whole-gate and delta kernels."""
    return {
        key: _counts(after, counter) - _counts(before, counter)
        for key, counter in (
            ("merged", "dsa_lora_merged"),
            ("full", "dsa_lora_full_gate"),
            ("delta", "dsa_lora_delta"),
        )
    }


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


@pytest.fixture(scope="module")
def dsa_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("dsa")
    model = build_tiny_dsa_model(root / "model")
    adapters = {
        name: build_lora_adapter(model, root / name, **spec)
        for name, spec in ADAPTERS.items()
    }
    return model, adapters


@pytest.fixture(scope="module")
def graph_run(dsa_paths):
    before = probe_count(COUNTER)
    names = [
        "warmup", *(f"with_{n}" for n in ADAPTERS), "without", "mixed", "two_adapters"
    ]  # fmt: skip
    batches = [WARMUP, *WITH.values(), WITHOUT, MIXED, TWO_ADAPTERS, *ALONE]
    results = run_engine(_engine_kwargs(*dsa_paths, _graph_prefill()), batches, env=ENV)
    run = dict(zip(names, results))
    run["alone_results"] = results[len(names) :]
    run["alone"] = [r[0] for r in run["alone_results"]]
    run["before"] = before
    return run


@pytest.fixture(scope="module")
def eager_run(dsa_paths):
    before = probe_count(COUNTER)
    kwargs = _engine_kwargs(*dsa_paths, {"backend": "disabled"})
    results = run_engine(kwargs, [WARMUP, *WITH.values()], env=ENV)
    return {
        "before": before,
        "warmup": results[0],
        **{f"with_{name}": r for name, r in zip(ADAPTERS, results[1:])},
    }


def test_upstream_fails_at_startup_without_graphfix(dsa_paths):
    """The documented baseline: the graph engine's arguments, with sglang-graphfix
    not loaded in any engine process, stop at the breakable graph's capture with
    upstream's error."""
    from sglang.srt.layers.attention.dsa.dsa_prefill_cuda_graph import (
        GRAPH_WEIGHTS_PROJ_LORA_ERROR,
    )

    absent, present = probe_count("graphfix_absent"), probe_count("graphfix_present")
    start = time.perf_counter()
    with pytest.raises(EngineStartupError) as raised:
        _start_engine_without_graphfix(_engine_kwargs(*dsa_paths, _graph_prefill()))
    output = str(raised.value)
    absent = probe_count("graphfix_absent") - absent
    present = probe_count("graphfix_present") - present
    write_result(
        "dsa_lora_upstream_baseline",
        {
            **BASELINE_ENV,
            "startup_failed": True,
            "upstream_error": GRAPH_WEIGHTS_PROJ_LORA_ERROR in output,
            "processes_without_graphfix": absent,
            "processes_with_graphfix": present,
            "seconds": time.perf_counter() - start,
            "output_tail": output[-3000:],
        },
    )
    assert absent > 0 and present == 0, (
        f"sglang-graphfix was not excluded: {absent} processes without it, "
        f"{present} with it"
    )
    assert GRAPH_WEIGHTS_PROJ_LORA_ERROR in output, output[-3000:]


def test_breakable_engine_starts_and_captures_the_lora_split_op(graph_run):
    """Capturing a bucket longer than index_topk runs the indexer split op with the
    LoRA-owned weights_proj: where upstream raised."""
    captured = _counts(graph_run["warmup"]) - graph_run["before"]
    write_result(
        "dsa_lora_startup",
        {"capture_head_gate_calls": captured, "lora_backend": LORA_BACKEND},
    )
    assert captured >= NUM_LAYERS, (
        "capture never reached the indexer split op's head gate"
    )


def test_breakable_prefill_graph_matches_eager_with_adapters(graph_run, eager_run):
    per_adapter = {
        name: compare(eager_run[f"with_{name}"], graph_run[f"with_{name}"], tol=TOL)
        for name in ADAPTERS
    }
    total = len(PROMPTS) * MAX_NEW_TOKENS
    mismatches = [
        {"adapter": name, **m}
        for name, r in per_adapter.items()
        for m in r["mismatches"]
    ]
    write_result(
        "dsa_lora_graph_vs_eager",
        {
            "tol": TOL,
            "lora_backend": LORA_BACKEND,
            "adapters": ADAPTERS,
            "prompt_lens": PROMPT_LENS,
            "max_new_tokens": MAX_NEW_TOKENS,
            "compared_steps": sum(r["compared_steps"] for r in per_adapter.values()),
            "max_logprob_diff": max(
                r["max_logprob_diff"] for r in per_adapter.values()
            ),
            "near_tie_splits": sum(r["near_tie_splits"] for r in per_adapter.values()),
            "mismatches": mismatches,
            "per_adapter": per_adapter,
            "first_step": {
                name: _first_step_diffs(
                    eager_run[f"with_{name}"], graph_run[f"with_{name}"]
                )
                for name in ADAPTERS
            },
            # Every request with the one adapter: the merged weight, per layer.
            "graph_kernels": {
                name: _kernels(graph_run[f"with_{name}"], previous)
                for name, previous in zip(
                    ADAPTERS,
                    [graph_run["warmup"]]
                    + [graph_run[f"with_{n}"] for n in list(ADAPTERS)[:-1]],
                )
            },
            "graph_seconds": {
                n: graph_run[f"with_{n}"][0]["seconds"] for n in ADAPTERS
            },
            "eager_seconds": {
                n: eager_run[f"with_{n}"][0]["seconds"] for n in ADAPTERS
            },
        },
    )
    assert not mismatches, per_adapter
    first = _kernels(graph_run[f"with_{next(iter(ADAPTERS))}"], graph_run["warmup"])
    assert first["merged"] >= NUM_LAYERS and first["full"] == first["delta"] == 0, first
    for name, report in per_adapter.items():
        # Splits only at near ties, and rarely: most steps are really compared.
        assert report["compared_steps"] >= total // 2, (name, report)


def test_adapter_changes_outputs(graph_run, eager_run):
    """Can-fail control: the comparisons tell the adapters apart. The same graph
    engine without an adapter disagrees with itself with the weights_proj-only
    adapter, and with the eager engine, which is what a graph path that dropped
    the weights_proj delta would show."""
    self_report = compare(graph_run["without"], graph_run["with_wp"], tol=TOL)
    eager_report = compare(eager_run["with_wp"], graph_run["without"], tol=TOL)
    full_report = compare(graph_run["without"], graph_run["with_full"], tol=TOL)
    write_result(
        "dsa_lora_adapter_effect",
        {
            "tol": TOL,
            "graph_without_vs_with": self_report,
            "eager_with_vs_graph_without": eager_report,
            "graph_without_vs_with_full": full_report,
            "first_step_graph_without_vs_with": _first_step_diffs(
                graph_run["without"], graph_run["with_wp"]
            ),
        },
    )
    assert self_report["mismatches"], (
        f"the adapter changed nothing beyond tol={TOL}: {self_report}"
    )
    assert eager_report["mismatches"], (
        f"dropping the adapter in the graph would pass: {eager_report}"
    )
    assert full_report["mismatches"], full_report


def test_mixed_batch_gives_each_request_its_own_output(graph_run):
    """One prefill forward through the graph serving a request per adapter and
    one without gives each the output it gets alone; swapping each request's
    adapter for another choice would not pass (control)."""
    mixed = graph_run["mixed"]
    report = compare(graph_run["alone"], mixed, tol=TOL)
    swapped = [
        graph_run["without"][0],  # prompt 0 served without its "wp" adapter
        graph_run["with_wp"][1],  # prompt 1 served with an adapter it did not ask for
        graph_run["without"][2],  # prompt 2 served without its "full" adapter
    ]
    control = compare(swapped, mixed, tol=TOL)
    gate_calls = _counts(mixed) - _counts(graph_run["without"])
    # A request without an adapter: upstream's GEMM + the delta kernel. Alone,
    # each adapter request is a batch on one adapter: the merged weight.
    mixed_kernels = _kernels(mixed, graph_run["without"])
    alone_kernels = _kernels(graph_run["alone_results"][-1], graph_run["two_adapters"])
    write_result(
        "dsa_lora_mixed_batch",
        {
            "tol": TOL,
            "loras": MIXED_LORAS,
            "prompt_lens": PROMPT_LENS[:3],
            "mixed_vs_alone": report,
            "first_step": _first_step_diffs(graph_run["alone"], mixed),
            "control_swapped_adapters": control,
            "mixed_batch_head_gate_calls": gate_calls,
            "mixed_batch_kernels": mixed_kernels,
            "alone_kernels": alone_kernels,
        },
    )
    # The three requests were prefilled together, through the graph's split op.
    assert gate_calls == NUM_LAYERS, gate_calls
    assert mixed_kernels == {"merged": 0, "full": 0, "delta": NUM_LAYERS}, mixed_kernels
    adapter_requests = sum(lora is not None for lora in MIXED_LORAS)
    assert alone_kernels["merged"] >= adapter_requests * NUM_LAYERS, alone_kernels
    assert alone_kernels["full"] == alone_kernels["delta"] == 0, alone_kernels
    assert not report["mismatches"], report
    assert report["compared_steps"] >= len(MIXED_LORAS) * MAX_NEW_TOKENS // 2, report
    assert control["mismatches"], f"swapped adapters would pass: {control}"


def test_two_adapter_batch_gives_each_request_its_own_output(graph_run):
    """Every request on an adapter, two adapters: sgl-kernel's whole gate (one
    launch per layer) gives each request the output it gets alone (where its
    gate is the merged-weight GEMM); swapping the two adapters would not pass."""
    two = graph_run["two_adapters"]
    alone = [graph_run["alone"][0], graph_run["alone"][2]]
    report = compare(alone, two, tol=TOL)
    swapped = [graph_run["with_full"][0], graph_run["with_wp"][2]]
    control = compare(swapped, two, tol=TOL)
    kernels = _kernels(two, graph_run["mixed"])
    write_result(
        "dsa_lora_two_adapter_batch",
        {
            "tol": TOL,
            "loras": TWO_ADAPTERS["lora_path"],
            "vs_alone": report,
            "first_step": _first_step_diffs(alone, two),
            "control_swapped_adapters": control,
            "kernels": kernels,
        },
    )
    assert kernels == {"merged": 0, "full": NUM_LAYERS, "delta": 0}, kernels
    assert not report["mismatches"], report
    assert report["compared_steps"] >= len(alone) * MAX_NEW_TOKENS // 2, report
    assert control["mismatches"], f"swapped adapters would pass: {control}"


def test_graph_split_op_applies_the_lora_head_gate(graph_run, eager_run):
    """The adapter prompts prefilled through the graph's indexer split op: its head
    gate ran with the LoRA-owned weights_proj (the eager engine never calls it
    so, as the eager path applies LoRA itself)."""
    graph_calls = _counts(graph_run["with_wp"]) - _counts(graph_run["warmup"])
    eager_calls = _counts(eager_run["with_full"]) - eager_run["before"]
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


# The memory run's child: the engine at sglang's default log level, one
# request on "wp" twice (every request on one adapter: the merged weight),
# "wp" unloaded, one request on "full". Markers between the steps, with the
# probe's counters, order the engine processes' log lines around them.
_MEMORY_CHILD = """
import json, os, sys, time
import sglang

def mark(name, **extra):
    counts = {p: os.path.getsize(os.path.join(os.environ["GRAPHFIX_PROBE_DIR"], p))
              for p in os.listdir(os.environ["GRAPHFIX_PROBE_DIR"])}
    print("GRAPHFIX_MARK", name, json.dumps({"counts": counts, **extra}), flush=True)

engine = sglang.Engine(**json.loads(sys.argv[1]))
prompt = json.loads(sys.argv[2])
mark("started")
for step, lora in (("first_wp", "wp"), ("second_wp", "wp")):
    start = time.perf_counter()
    engine.generate(input_ids=[prompt], lora_path=[lora],
                    sampling_params={"temperature": 0.0, "max_new_tokens": 1})
    mark(step, seconds=time.perf_counter() - start)
result = engine.unload_lora_adapter("wp")
mark("unloaded", success=bool(getattr(result, "success", True)))
engine.generate(input_ids=[prompt], lora_path=["full"],
                sampling_params={"temperature": 0.0, "max_new_tokens": 1})
mark("full")
engine.shutdown()
"""
RESERVED_LINE = re.compile(
    r"sglang-graphfix: reserved ([0-9.]+) MB with the LoRA memory pool for the "
    r"DSA indexer's merged weights_proj \((\d+) layers x (\d+) slots x ([0-9.]+) MB"
)
DROPPED_LINE = re.compile(
    r"sglang-graphfix: dropped the merged DSA indexer weights_proj of unloaded "
    r"LoRA adapter (\S+) \((\d+) layers\)"
)
COMPILE_LINE = "torchdynamo start tracing scale_merged_head_gates"
# sglang's own lines once the KV cache is sized (pre-capture, or post-capture
# sizing): the reservation must come before the first.
KV_SIZED = ("Memory pool end", "KV Cache is allocated", "Post-capture KV sizing")


def _first(lines, predicate):
    return next((i for i, line in enumerate(lines) if predicate(line)), None)


def test_merged_gate_memory_is_reserved_at_startup_and_dropped_on_unload(dsa_paths):
    """The merged gate's memory in sglang's startup memory log: the reservation
    line (its size: NUM_LAYERS layers x --max-loras-per-batch slots x two
    bf16 (N, K) halves) before sglang sizes the KV cache. Its scaling kernel
    compiles during startup (dynamo traces it before the engine is up, never
    after). Unloading the adapter the requests ran on drops its merged
    weights in every layer; the other adapter is still served on one merged
    weight per layer."""
    model, adapters = dsa_paths
    kwargs = {
        "skip_tokenizer_init": True,
        **_engine_kwargs(model, adapters, _graph_prefill()),
        "log_level": "info",
    }
    env = {**os.environ, **ENV, "TORCH_LOGS": "dynamo"}
    env.pop("GRAPHFIX_PROBE_FAULT", None)
    env.pop("GRAPHFIX_PROBE_UPSTREAM", None)
    env.pop("SGLANG_PLUGINS", None)  # every plugin: sglang-graphfix and the probe
    env["GRAPHFIX_PROBE_DIR"] = str(PROBE_DIR)
    returncode, output = _run_child(
        _MEMORY_CHILD, [json.dumps(kwargs), json.dumps(PROMPTS[0])], env
    )
    lines = output.splitlines()
    marks = {}
    for i, line in enumerate(lines):
        if line.startswith("GRAPHFIX_MARK "):
            _, name, payload = line.split(" ", 2)
            marks[name] = {"line": i, **json.loads(payload)}
    reserved_at = _first(lines, RESERVED_LINE.search)
    kv_sized_at = _first(lines, lambda line: any(k in line for k in KV_SIZED))
    compiles = [i for i, line in enumerate(lines) if COMPILE_LINE in line]
    dropped = [
        (i, m.groups()) for i, m in enumerate(map(DROPPED_LINE.search, lines)) if m
    ]
    slot_mb = 2 * INDEX_N_HEADS * HIDDEN * 2 / (1 << 20)  # two bf16 (N, K) halves
    reserved = (
        RESERVED_LINE.search(lines[reserved_at]) if reserved_at is not None else None
    )

    def merged(after, before):
        key = "dsa_lora_merged"
        return marks[after]["counts"].get(key, 0) - marks[before]["counts"].get(key, 0)

    steps = ("started", "first_wp", "second_wp", "unloaded", "full")
    write_result(
        "dsa_lora_merged_gate_memory",
        {
            "returncode": returncode,
            "marks": marks,
            "reserved_line": lines[reserved_at] if reserved_at is not None else None,
            "reserved_before_kv_sizing": (
                reserved_at is not None
                and kv_sized_at is not None
                and reserved_at < kv_sized_at
            ),
            "kv_sized_line": lines[kv_sized_at] if kv_sized_at is not None else None,
            "expected_slot_mb": slot_mb,
            "scale_compiles_at_lines": compiles,
            "dropped_lines": [lines[i] for i, _ in dropped],
            "seconds": {
                s: marks[s].get("seconds")
                for s in ("first_wp", "second_wp")
                if s in marks
            },
            "output_tail": output[-3000:],
        },
    )
    # Every step ran (the exit code, after shutdown, is only recorded).
    assert all(s in marks for s in steps), output[-3000:]
    assert marks["unloaded"]["success"], marks["unloaded"]
    # Startup memory log: the reservation, its size, before the KV cache.
    assert reserved is not None, "no reservation line at log level info"
    assert kv_sized_at is not None and reserved_at < kv_sized_at, (
        lines[reserved_at],
        kv_sized_at and lines[kv_sized_at],
    )
    total_mb, layers, slots, per_slot_mb = reserved.groups()
    assert (int(layers), int(slots)) == (NUM_LAYERS, 3), reserved.group(0)
    assert abs(float(per_slot_mb) - slot_mb) < 0.01, (per_slot_mb, slot_mb)
    assert abs(float(total_mb) - NUM_LAYERS * 3 * slot_mb) < 0.01, total_mb
    # The scaling kernel: traced during startup, not on a request.
    started = marks["started"]["line"]
    assert compiles and all(i < started for i in compiles), (compiles, started)
    # Both "wp" requests took the merged weight (built once, then cached).
    assert merged("first_wp", "started") >= NUM_LAYERS, marks
    assert merged("second_wp", "first_wp") >= NUM_LAYERS, marks
    # The unload dropped "wp"'s merged weights in every layer, and only then.
    assert len(dropped) == 1, dropped
    ((at, (_, dropped_layers)),) = dropped
    assert marks["second_wp"]["line"] < at < marks["unloaded"]["line"], at
    assert int(dropped_layers) == NUM_LAYERS, dropped
    # The other adapter still merges into the reservation after the unload.
    assert merged("full", "unloaded") >= NUM_LAYERS, marks
