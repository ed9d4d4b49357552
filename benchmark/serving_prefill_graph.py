"""Prefill CUDA-graph modes as a user serves them: `python -m sglang.launch_server`
(sglang-graphfix installed, nothing else changed) and sglang's own
`python -m sglang.benchmark.serving`, one server per mode, one after another
(never two engines at once), at real layer dimensions and full depth.

Modes: disabled (eager prefill), breakable (sglang's default on CUDA), full
(upstream 0.5.23 crashes at capture on hybrid linear attention; sglang-graphfix
captures it). Every server gets the same flags but --cuda-graph-backend-prefill.

Model: `qwen3-next-80b-a3b-fp8`: Qwen3-Next-80B-A3B's published dimensions (48
layers: 36 GDN + 12 attention, hidden 2048, 512 experts top-10, vocab 151936)
with the FP8 checkpoint's block quantization ([128, 128], e4m3), --load-format
dummy (speed only: every output is noise); `qwen3.5-35b-a3b-fp8`: Qwen3.5-35B-A3B's
text model (40 layers: 30 GDN + 10 attention, 256 experts top-8, vocab 248320),
FP8 the same way, about 36 GB: fits an H100. `falcon-h1-7b`: Falcon-H1-7B's
(Mamba2 beside attention in 44 layers, bfloat16); `nemotron-h-8b`:
Nemotron-H-8B-Base's (Mamba2, attention and MLP layers, 8 groups);
`granite-4.0-h-micro`: Granite-4.0-H-Micro's layout (dense, Mamba2 and attention
9:1); `lfm2-2.6b`: LFM2-2.6B's (short conv and attention). The Mamba2 and
short-conv models' servers run --attention-backend flashinfer in every mode (the
Mamba2 full graph's checked backend). `tiny`: test/tiny_configs.py's 4-layer
Qwen3-Next, for a dry run of this script. A synthetic word-level tokenizer of the
model's vocabulary is written in a folder of its own (no hub access); prompts are
random token ids (dataset random-ids, --tokenize-prompt).

Workloads (WORKLOADS): short chat-like prompts (input 16-512, output 1-32) at
several request rates up to saturation; bursts of 1, 4 and 8 prompts of fixed
length (the first-token path a user hits); long prompts, one at a time (8k-16k
input, 2k-4k and 4k-8k); and, asked for by name, one prompt of 512-3072 tokens or
four of 512 or 1024 ("sizes": where a full graph stops beating eager). Runs whose
prompts and output exceed the servers' context are left out, and recorded as
skipped with the reason.
Per mode and workload: TTFT p50/p99, ITL p50/p99, request and output throughput,
straight from sglang.benchmark.serving's JSONL, and how many prefill batches ran
a CUDA graph or eager (sglang's per-batch log line); per mode: time to ready, the
prefill-graph capture time and memory and the weight / KV sizes, from the
server's log. Every run draws its own prompts (its own --seed) on an empty radix
cache (sglang.benchmark.serving's --flush-cache, after its own warm-up
requests); each server first runs one warm-up per workload (WARMUP, other
prompts, not reported), so kernels built on first use are not timed.

    python3 benchmark/serving_prefill_graph.py [--model qwen3-next-80b-a3b-fp8]
        [--modes disabled,breakable,full] [--workloads chat,burst,long,sizes] [--quick]
        [--profile 1_x_2048_tokens]  # that run once more under sglang's profiler
    python3 benchmark/serving_prefill_graph.py --plot   # PNG from the committed JSON
    python3 benchmark/serving_prefill_graph.py --recover DIR  # a run cut short
    python3 benchmark/serving_prefill_graph.py --crossover FILE  # sizes: the bound
        [--routed FILE2]  # against FILE2's full server's routed (eager) runs

Falcon-H1's full mode serves what a user asking for full gets: the breakable graph
(sglang-graphfix's route_mamba2_full_prefill_to_breakable). To serve the captured
full graph instead (with its request buckets, on as shipped), keep it with the test
probe (recorded under "environment"; the probe also counts every replay):
    mkdir -p /tmp/probe && GRAPHFIX_PROBE_DIR=/tmp/probe \
    GRAPHFIX_PROBE_MAMBA2_FULL_BEATS_BREAKABLE=1 \
    PYTHONPATH=test/gpu/probe:$PYTHONPATH python3 benchmark/serving_prefill_graph.py \
        --model falcon-h1-7b --modes full

Writes $OUT/serving_prefill_graph.json (else benchmark/results/...), with the
commands it ran and its provenance, and the server logs under $OUT/logs/ when
$OUT is set. Needs a GPU; takes ~5 min per mode at full depth on an H200 (cold
JIT caches add minutes to the first server).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmark"), str(ROOT / "test")]

RESULT = "serving_prefill_graph.json"
MODES = ("disabled", "breakable", "full")
INF = float("inf")

# name -> list of runs: (label, input_len, output_len, range_ratio, rate,
# max_concurrency or None, prompts). range_ratio r draws lengths from
# [r * len, len] (sglang's compute_random_lens).
WORKLOADS = {
    "chat": [
        (f"chat rate {rate}", 512, 32, 1 / 32, rate, None, prompts)
        for rate, prompts in ((2, 60), (8, 160), (32, 400), (INF, 400))
    ],
    "burst": [
        ("1 x 16 tokens", 16, 1, 1.0, INF, 1, 40),
        ("1 x 256 tokens", 256, 1, 1.0, INF, 1, 40),
        ("4 x 256 tokens", 256, 1, 1.0, INF, 4, 80),
        ("8 x 64 tokens", 64, 1, 1.0, INF, 8, 160),
    ],
    "long": [
        ("long 8k-16k", 16384, 8, 0.5, INF, 1, 8),
        ("1 x 2k-4k tokens", 4096, 8, 0.5, INF, 1, 16),
        ("1 x 4k-8k tokens", 8000, 8, 0.5, INF, 1, 16),
    ],
    # Where a full graph stops beating eager: fixed prompt lengths between the
    # bursts' and the long runs' (not in the default set: --workloads sizes).
    "sizes": [
        (f"{n} x {tokens} tokens", tokens, 1, 1.0, INF, n, 12 * n)
        for n, tokens in (
            (1, 512),
            (1, 768),
            (1, 1024),
            (1, 1536),
            (1, 2048),
            (1, 3072),
            (4, 512),
            (4, 1024),
        )
    ],
}


def fp8_blocks(layers: int, gdn_ba: tuple) -> dict:
    """The quantization_config of Qwen's FP8 checkpoints of GDN hybrids:
    [128, 128] blocks of e4m3, dynamic activations, but for the modules smaller
    than a block, which those checkpoints keep in bfloat16: the shared-expert
    gate (1 output) and the GDN b/a projections (``gdn_ba``, under the
    checkpoint's names: Qwen3-Next's fused in_proj_ba of 2 x 32 outputs,
    Qwen3.5's in_proj_b and in_proj_a of 32 each; sglang matches the shards of
    its fused module against them)."""
    return {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": [
            f"model.layers.{i}.{name}"
            for i in range(layers)
            for name in (*gdn_ba, "mlp.shared_expert_gate")
        ],
    }


def qwen3_next_80b_a3b_fp8(path: Path, layers: int = 48) -> None:
    """Qwen3-Next-80B-A3B's config.json (published dimensions) with the FP8
    checkpoint's quantization_config, so sglang allocates fp8 weights (~80 GB)."""
    from tiny_configs import add_qwen3_next_layout, qwen3_next_80b_a3b_config

    config = qwen3_next_80b_a3b_config(layers, max_position_embeddings=32768)
    config.quantization_config = fp8_blocks(layers, ("linear_attn.in_proj_ba",))
    config.save_pretrained(path)
    add_qwen3_next_layout(path)


def qwen3_5_35b_a3b_fp8(path: Path, layers: int = 40) -> None:
    """Qwen3.5-35B-A3B's text model (published dimensions, sglang's
    Qwen3_5MoeForCausalLM) with the FP8 checkpoint's quantization_config: about
    36 GB of weights (sglang's model built from it on the meta device, a CPU
    test), so it serves on an H100 (Qwen3-Next-80B's 75 GB need an H200)."""
    from tiny_configs import add_qwen3_next_layout, qwen3_5_35b_a3b_config

    config = qwen3_5_35b_a3b_config(layers, max_position_embeddings=32768)
    gdn_ba = ("linear_attn.in_proj_b", "linear_attn.in_proj_a")
    config.quantization_config = fp8_blocks(layers, gdn_ba)
    config.save_pretrained(path)
    add_qwen3_next_layout(path)


def tiny_qwen3_next(path: Path) -> None:
    from tiny_configs import add_qwen3_next_layout, qwen3_next_config

    qwen3_next_config().save_pretrained(path)
    add_qwen3_next_layout(path)


def save_bfloat16(config, architecture: str, path: Path) -> None:
    """Write ``config`` as a bfloat16 checkpoint's config.json of ``architecture``
    (without a config dtype sglang's "auto" would serve float16)."""
    config.architectures = [architecture]
    config.dtype = "bfloat16"
    config.save_pretrained(path)


def falcon_h1_7b(path: Path, layers: int = 44) -> None:
    """Falcon-H1-7B's published dimensions (each of 44 layers: attention, 12 / 2
    heads of 128, beside Mamba2, 24 heads of 128, state 256, one group, chunk
    128; hidden 3072, MLP 12288, vocab 130048), bfloat16 as published: the
    Mamba2 full prefill graph's checked configuration (MAMBA2_CHECKED) but for
    the attention backend, which SERVER_ARGS sets for every mode."""
    from sglang.srt.configs import FalconH1Config

    config = FalconH1Config(
        vocab_size=130048,
        hidden_size=3072,
        intermediate_size=12288,
        num_hidden_layers=layers,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        mamba_d_ssm=3072,
        mamba_n_heads=24,
        mamba_d_head=128,
        mamba_n_groups=1,
        mamba_d_state=256,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=128,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    )
    save_bfloat16(config, "FalconH1ForCausalLM", path)


def nemotron_h_8b(path: Path) -> None:
    """Nemotron-H-8B-Base's published dimensions: 52 layers
    "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" (24 Mamba2, 4 attention
    of 32 / 8 heads of 128, 24 MLP of 21504, relu2), hidden 4096, Mamba2 with
    128 heads of 64 in 8 groups, state 128, chunk 128; vocab 131072, bfloat16
    (sglang's NemotronHConfig defaults, with the checkpoint's groups, chunk and
    context). 8 groups: checked on the H200 by the GPU case
    test_mamba2_full_prefill_graph.py -k nemotron_h_groups8 (MAMBA2_CHECKED)."""
    from sglang.srt.configs.nemotron_h import NemotronHConfig

    config = NemotronHConfig(
        n_groups=8, mamba_n_groups=8, mamba_chunk_size=128, max_position_embeddings=8192
    )
    save_bfloat16(config, "NemotronHForCausalLM", path)


def granite_4_h_micro(path: Path) -> None:
    """Granite-4.0-H-Micro's layout (IBM's 3B dense hybrid), with the dimensions of
    a public GraniteMoeHybrid config.json of that shape (anuj6316/granite on the
    Hugging Face hub; IBM's own file was not reachable from here): 40 layers, Mamba2
    but for attention at layers 5, 15, 25 and 35 (32 / 8 heads of 64, no position
    embedding), a dense MLP of 8192 in every layer and no experts, hidden 2048,
    Mamba2 with 64 heads of 64 in one group, state 128, chunk 256; vocab 100352,
    bfloat16; its scalars (embedding 12, logits 8, residual 0.22, attention
    1/64, norm eps 1e-5) as that file and sglang's own config class have them
    (transformers' class writes the layer types, which sglang's rejects under
    transformers 5, and defaults those scalars to 1). sglang 0.5.23 captures no
    prefill graph for it (its Mamba2 layers hold no attention module), so
    breakable runs eager here."""
    from transformers import GraniteMoeHybridConfig

    config = GraniteMoeHybridConfig(
        vocab_size=100352,
        hidden_size=2048,
        intermediate_size=8192,
        shared_intermediate_size=8192,
        num_hidden_layers=40,
        layer_types=[
            "full_attention" if i % 10 == 5 else "linear_attention" for i in range(40)
        ],
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=0,
        num_experts_per_tok=0,
        position_embedding_type="nope",
        embedding_multiplier=12.0,
        logits_scaling=8.0,
        residual_multiplier=0.22,
        attention_multiplier=0.015625,
        rms_norm_eps=1e-5,
        mamba_n_heads=64,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=128,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=256,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=100257,
        eos_token_id=100257,
        pad_token_id=100256,
    )
    save_bfloat16(config, "GraniteMoeHybridForCausalLM", path)


def lfm2_2_6b(path: Path) -> None:
    """LFM2-2.6B's layout, with the dimensions of Liquid AI's own config.json of
    that architecture (LiquidAI/LFM2-2.6B-Transcript-ONNX on the Hugging Face
    hub): 30 layers, short conv (kernel 3) but for attention at layers 2, 5, 9,
    13, 17, 21, 24 and 27 (32 / 8 heads of 64), hidden 2048, MLP 10752 in every
    layer, vocab 65536, bfloat16. sglang 0.5.23 captures no prefill graph for it
    (its conv layers hold no attention module), so breakable runs eager here."""
    from sglang.srt.configs import Lfm2Config

    attention = {2, 5, 9, 13, 17, 21, 24, 27}
    config = Lfm2Config(
        vocab_size=65536,
        hidden_size=2048,
        intermediate_size=10752,
        block_auto_adjust_ff_dim=False,
        num_hidden_layers=30,
        num_attention_heads=32,
        num_key_value_heads=8,
        layer_types=["full_attention" if i in attention else "conv" for i in range(30)],
        conv_L_cache=3,
        conv_bias=False,
        max_position_embeddings=128000,
        tie_word_embeddings=True,
    )
    save_bfloat16(config, "Lfm2ForCausalLM", path)


MODELS = {
    "qwen3-next-80b-a3b-fp8": qwen3_next_80b_a3b_fp8,
    "qwen3.5-35b-a3b-fp8": qwen3_5_35b_a3b_fp8,
    "falcon-h1-7b": falcon_h1_7b,
    "nemotron-h-8b": nemotron_h_8b,
    "granite-4.0-h-micro": granite_4_h_micro,
    "lfm2-2.6b": lfm2_2_6b,
    "tiny": tiny_qwen3_next,
}
# Flags a model's servers get in every mode (before the command line's own).
SERVER_ARGS = {
    model: ["--attention-backend", "flashinfer"]
    for model in ("falcon-h1-7b", "nemotron-h-8b", "granite-4.0-h-micro", "lfm2-2.6b")
}


# Servers' --context-length unless given: room for the long workload's prompts.
CONTEXT_LENGTH = 20480


def default_context_length(path: Path) -> int:
    """CONTEXT_LENGTH, or the config's max_position_embeddings where fewer
    (Nemotron-H-8B's 8192: sglang refuses a longer context than the model's)."""
    config = json.loads((path / "config.json").read_text())
    return min(CONTEXT_LENGTH, config.get("max_position_embeddings") or CONTEXT_LENGTH)


def tokenizer_dir(model_dir: Path) -> Path:
    """Where word_level_tokenizer writes: a folder of its own, without the
    model's config.json. transformers picks its own class for some model
    types whatever tokenizer_config.json names (Qwen3.5's: Qwen3_5Tokenizer,
    which rebuilds a byte-level BPE from the vocabulary and encodes these words
    to no ids at all; sglang's warm-up request then died in every mode,
    2026-12-07c); from a folder without a config it loads the class named."""
    return model_dir / "tokenizer"


def word_level_tokenizer(model_dir: Path) -> None:
    """A tokenizer of the config's vocabulary size, one word per id (no hub),
    in tokenizer_dir: sglang's server (--tokenizer-path) and benchmark client
    (--tokenizer) load it like any checkpoint's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    vocab = {f"w{i}": i for i in range(vocab_size - 1)}
    vocab["<unk>"] = vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<unk>"
    ).save_pretrained(tokenizer_dir(model_dir))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_dir: Path, mode: str, port: int, args) -> list:
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_dir),
        "--tokenizer-path", str(tokenizer_dir(model_dir)),
        "--load-format", "dummy",
        "--port", str(port),
        "--host", "127.0.0.1",
        "--cuda-graph-backend-prefill", mode,
        "--context-length", str(args.context_length),
        "--mem-fraction-static", str(args.mem_fraction_static),
        *SERVER_ARGS.get(args.model, []),
        *args.server_args,
    ]  # fmt: skip


def wait_ready(proc, port: int, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before ready")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/health_generate", timeout=5
            ) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(f"server not ready after {timeout} s")


# Lines of sglang 0.5.23's startup log this script reads (model_runner.py,
# cuda_graph_setup.py, kv_pool_runtime.py).
LOG_FACTS = {
    "weights_gb": r"Load weight end\..*?mem usage=([\d.]+) GB",
    "kv_cache_gb": r"KV size: ([\d.]+) GB",
    "prefill_graph_capture_s": r"Capture target prefill CUDA graph end\. elapsed=([\d.]+) s",
    "prefill_graph_gb": r"Capture target prefill CUDA graph end\..*?mem usage=([\d.]+) GB",
    "decode_graph_capture_s": r"Capture target decode .*? end\..*?elapsed=([\d.]+) s",
    "decode_graph_gb": r"Capture target decode .*? end\..*?mem usage=([\d.]+) GB",
    "avail_after_kv_gb": r"KV size: [\d.]+ GB, avail mem=([\d.]+) GB",
}


# sglang_graphfix.register()'s start-up line in every server process.
GRAPHFIX_LINE = re.compile(r"sglang-graphfix [\w.]+: applied \d+ patches")
# sglang's scheduler logs every prefill batch, and whether it ran a CUDA graph.
PREFILL_BATCH = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: (\d+),.*cuda graph: (True|False)"
)


def prefill_batches(log: str) -> dict:
    """Prefill batches in a stretch of sglang's server log: how many replayed a
    CUDA graph (full or breakable) and how many ran eager, with their requests."""
    counts = {"graph": 0, "eager": 0, "eager_requests_max": 0}
    for requests, graph in PREFILL_BATCH.findall(log):
        counts["graph" if graph == "True" else "eager"] += 1
        if graph == "False":
            counts["eager_requests_max"] = max(
                counts["eager_requests_max"], int(requests)
            )
    return counts


def prefill_batches_since(log_path: Path, offset: int) -> dict:
    """prefill_batches() of what the server logged from byte ``offset`` on."""
    with open(log_path, errors="replace") as log:
        log.seek(offset)
        return prefill_batches(log.read())


def traceback_exceptions(log: str, keep: int = 3) -> list:
    """The exception lines that end the log's Python tracebacks (the first
    unindented line after each "Traceback (most recent call last):", which a
    logger's timestamped prefix may precede), the last ``keep`` distinct ones in
    order: a chained failure keeps its cause beside sglang's wrapper errors."""
    lines, found = log.splitlines(), []
    for i, line in enumerate(lines):
        if not line.rstrip().endswith("Traceback (most recent call last):"):
            continue
        for later in lines[i + 1 :]:
            if later.strip() and not later[0].isspace():
                if "Traceback (most recent call last):" not in later:
                    found = [f for f in found if f != later.strip()] + [later.strip()]
                break
    return found[-keep:]


def log_facts(log: str) -> dict:
    facts = {}
    for key, pattern in LOG_FACTS.items():
        found = re.findall(pattern, log)
        facts[key] = float(found[-1]) if found else None
    # The prefill graph the server captured (sglang-graphfix may run a full
    # graph asked for as breakable: route_mamba2_full_prefill_to_breakable).
    captured = re.findall(
        r"Capture target prefill CUDA graph begin\. backend=(\w+)", log
    )
    facts["prefill_graph_captured"] = captured[-1] if captured else None
    facts["graphfix_line"] = next(
        (line.strip() for line in log.splitlines() if GRAPHFIX_LINE.search(line)),
        None,
    )
    # sglang-graphfix's routing rule and its per-path prefill batch counts
    # (prefill_cuda_graph_runner: the first eager batch of each reason).
    facts["prefill_path_lines"] = [
        line.strip()
        for line in log.splitlines()
        if "Full prefill CUDA graph" in line or "Prefill paths:" in line
    ]
    # Why a server that died said it did (a block's servers all died of
    # `ImportError: Can not import FA3 in sgl_kernel` on 2026-12-05 and the
    # report said only "exited with -9 before ready").
    facts["exceptions"] = traceback_exceptions(log)
    # The test probe's split of that memory (GRAPHFIX_PROBE_GRAPH_MEMORY=1).
    split = re.findall(r"graphfix probe: prefill graph memory (\{.*\})", log)
    if split:
        facts["prefill_graph_memory_split"] = json.loads(split[-1])
    return facts


KEEP = (
    "completed", "duration", "request_throughput", "output_throughput", "total_throughput",
    "median_ttft_ms", "p99_ttft_ms", "mean_ttft_ms", "median_itl_ms", "p99_itl_ms",
    "median_e2e_latency_ms", "total_input_tokens", "total_output_tokens", "concurrency",
)  # fmt: skip


def run_seed(label: str, warmup: bool = False) -> int:
    """Each run its own prompts (random-ids draws them from --seed): no run hits
    the radix cache with another run's prompts; the warm-up draws others."""
    labels = [run[0] for runs in WORKLOADS.values() for run in runs]
    return labels.index(label) + (1000 if warmup else 1)


# One client process per server runs every sglang.benchmark.serving command
# through its own entry point (cli_main on that argv): a fresh
# `python -m sglang.benchmark.serving` per run spent ~40 s before its first
# request on the H200 machine (imports, tokenizer), 8 minutes of a mode's 12 runs.
# A run the client cannot finish is run again as its own process.
CLIENT = """
import importlib, json, sys
serving = importlib.import_module(sys.argv[1])
for line in sys.stdin:
    sys.argv = ["sglang.benchmark.serving", *json.loads(line)]
    try:
        serving.cli_main()
        status = "ok"
    except BaseException as exc:  # argparse's SystemExit too
        status = f"{type(exc).__name__}: {exc}"
    print("\\n" + DONE + json.dumps(status), flush=True)
"""
DONE = "@@graphfix-bench-done@@"


BENCH_MODULE = "sglang.benchmark.serving"


def client_import_error(module: str = BENCH_MODULE) -> str | None:
    """Why ``module`` does not import in a fresh python, None if it does. On the
    2026-12-03 H200 bundle sglang.benchmark.serving did not (its datasets
    package, an sglang requirement, was missing): every run then failed only
    after its server had started."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def exit_on_sigterm() -> None:
    """SIGTERM (a `timeout` around this script) exits through Python, so that
    run_mode's cleanup stops the server it started in its own session; killed
    by the default handler, the script left the server holding the GPU, and the
    next engine of the block found no memory."""

    def handler(signum, frame):
        # `timeout` signals the script and then its process group: a second
        # SIGTERM must not interrupt the cleanup the first one started.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


class BenchClient:
    """A python process running sglang.benchmark.serving's cli_main once per
    command line sent to it (``module``: the benchmark module, for tests)."""

    def __init__(self, module: str = BENCH_MODULE):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"DONE = {DONE!r}\n" + CLIENT, module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines = queue.Queue()  # its output, line by line; None at its end
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, argv: list, timeout: float = 900) -> tuple:
        """(status, output): "ok", or why the run failed (the client's own
        failure included), and the end of what the run printed."""
        if self.proc.poll() is not None:
            return f"client exited with {self.proc.returncode}", ""
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        lines, deadline = [], time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                self.close()
                return f"no result after {timeout} s", "".join(lines[-50:])
            if line is None:
                return f"client exited with {self.proc.wait()}", "".join(lines[-50:])
            if line.startswith(DONE):
                return json.loads(line[len(DONE) :]), "".join(lines[-50:])
            lines.append(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def bench(
    model_dir: Path,
    port: int,
    run,
    scale: float,
    out_dir: Path,
    warmup=False,
    client: BenchClient | None = None,
    profile_dir: Path | None = None,
) -> tuple:
    label, inp, outp, ratio, rate, conc, prompts = run
    prompts = max(4, int(prompts * scale))
    kind = "warmup" if warmup else "profile" if profile_dir else "run"
    jsonl = out_dir / f"bench_{port}_{kind}_{run_seed(label, warmup)}.jsonl"
    cmd = [
        sys.executable, "-m", "sglang.benchmark.serving",
        "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
        "--model", str(model_dir), "--tokenizer", str(tokenizer_dir(model_dir)),
        "--dataset-name", "random-ids", "--tokenize-prompt",
        "--random-input-len", str(inp), "--random-output-len", str(outp),
        "--random-range-ratio", str(ratio), "--num-prompts", str(prompts),
        "--request-rate", "inf" if math.isinf(rate) else str(rate),
        "--seed", str(run_seed(label, warmup)), "--warmup-requests", "4", "--flush-cache",
        "--disable-tqdm", "--output-details",
        "--output-file", str(jsonl),
    ] + (["--max-concurrency", str(conc)] if conc else [])  # fmt: skip
    if profile_dir:  # the server writes the trace where the client says
        cmd += ["--profile", "--profile-output-dir", str(profile_dir)]
    status, _ = client.run(cmd[3:]) if client else ("no client", "")
    if profile_dir and (status != "ok" or not jsonl.exists()):
        # No second try: it would leave a second trace beside the first.
        return cmd, {"error": f"the profiled run failed ({status})"}
    if status != "ok" or not jsonl.exists():
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not jsonl.exists():
            return cmd, {"error": (done.stdout + done.stderr)[-2000:]}
        if client:  # measured by the fallback process: say so
            cmd = [*cmd, f"# own process: the client's run failed ({status})"]
    return cmd, kept(json.loads(jsonl.read_text().splitlines()[-1]))


def kept(row: dict) -> dict:
    """What the report keeps of a sglang.benchmark.serving JSONL row: KEEP, and
    each request's time to first token in ms (--output-details), in send order,
    None for a request that failed (sglang records 0 for it)."""
    result = {key: row.get(key) for key in KEEP}
    if row.get("ttfts"):
        errors = row.get("errors") or [""] * len(row["ttfts"])
        result["ttfts_ms"] = [
            None if error else round(ttft * 1000.0, 2)
            for ttft, error in zip(row["ttfts"], errors)
        ]
    return result


# Per workload, the run that warms a fresh server up before the measured runs
# (prompts of another seed, results not reported): a new batch shape's first
# run JIT-compiles kernels, a start-up cost that reached seconds on a fresh H200
# (13.6 s median TTFT of breakable's first chat run; 7.6 s for full's first
# batch over its request cap), not serving speed.
DEFAULT_WORKLOADS = "chat,burst,long"  # "sizes" only when asked for
WARMUP = {
    "chat": "chat rate inf",
    "burst": "8 x 64 tokens",
    "long": "long 8k-16k",
    "sizes": "4 x 1024 tokens",
}


def plan_runs(workloads: list, context_length: int) -> tuple:
    """The runs a server gets, in order: per workload a warm-up (WARMUP, or its
    longest run that fits where that one does not), then every run; and the runs
    left out, {label: why}: those whose longest prompt and output do not fit the
    server's context as sglang's scheduler counts it (it rejects a prompt of
    context - 6 tokens or more, max_req_input_len, and clips the output to
    context - prompt - 2)."""
    plan, measured, skipped = [], [], {}
    for workload in workloads:
        fits = []
        for run in WORKLOADS[workload]:
            label, inp, outp = run[:3]
            if inp > context_length - 7 or inp + outp > context_length - 2:
                skipped[label] = (
                    f"prompts of up to {inp} tokens and {outp} output tokens exceed "
                    f"the servers' --context-length {context_length}"
                )
            else:
                fits.append(run)
        if fits:
            warmup = next((r for r in fits if r[0] == WARMUP[workload]), None)
            plan.append((warmup or max(fits, key=lambda r: r[1]), True))
        measured += [(run, False) for run in fits]
    return plan + measured, skipped


def run_slug(label: str) -> str:
    """A run's label as a folder name: "1 x 2048 tokens" -> "1_x_2048_tokens"."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", label)


def profiled_runs(plan: list, labels: list) -> list:
    """The measured runs of ``plan`` named in ``labels`` (--profile; a label or
    its run_slug, which has no spaces), each run once more after every measured
    run, under sglang's torch profiler (its timings, slowed by the profiler,
    kept apart: the report's "profiled")."""
    return [
        (run, False)
        for run, warmup in plan
        if not warmup and {run[0], run_slug(run[0])} & set(labels)
    ]


def run_mode(model_dir: Path, mode: str, args, log_dir: Path, entry, save) -> None:
    """Serve ``mode``, fill ``entry`` (the report's entry for it) run by run and
    call ``save()`` after each: a mode cut short keeps what it measured."""
    port = free_port()
    cmd = server_command(model_dir, mode, port, args)
    log_path = log_dir / f"server_{mode}.log"
    env, profile_dir = dict(os.environ), log_dir / f"profile_{mode}"
    if getattr(args, "profile", None):  # sglang's profiler's directory
        env["SGLANG_TORCH_PROFILER_DIR"] = str(profile_dir)
        # Device ops and runtime calls only: no Python tracer (the idle
        # scheduler's loop would fill the trace) and no input shapes.
        env["SGLANG_PROFILE_WITH_STACK"] = env["SGLANG_PROFILE_RECORD_SHAPES"] = "0"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    entry.update({"server_command": " ".join(cmd), "runs": {}, "warmup": {}})
    plan, skipped = plan_runs(args.workloads, args.context_length)
    if skipped:
        entry["skipped"] = skipped
    client, stopped = None, None
    try:
        client = BenchClient()
        entry["ready_s"] = round(wait_ready(proc, port, args.ready_timeout), 1)
        for run, warmup in plan:
            if proc.poll() is not None:  # its log says why
                raise RuntimeError(f"server exited with {proc.returncode}")
            offset = log_path.stat().st_size
            bench_cmd, result = bench(
                model_dir, port, run, args.scale, log_dir, warmup, client
            )
            result["prefill_batches"] = prefill_batches_since(log_path, offset)
            entry["warmup" if warmup else "runs"][run[0]] = result
            entry.setdefault("bench_commands", []).append(" ".join(bench_cmd))
            print(
                mode, "warm-up" * warmup, run[0], json.dumps(result)[:300], flush=True
            )
            save()
        for run, _ in profiled_runs(plan, getattr(args, "profile", [])):
            offset, traces = log_path.stat().st_size, profile_dir / run_slug(run[0])
            bench_cmd, result = bench(
                model_dir, port, run, args.scale, log_dir, client=client,
                profile_dir=traces,
            )  # fmt: skip
            result["prefill_batches"] = prefill_batches_since(log_path, offset)
            # Under the report's logs folder (where $OUT is), and where it was.
            result["trace_dir"] = str(traces.relative_to(log_dir))
            result["trace_path"] = str(traces)
            entry.setdefault("profiled", {})[run[0]] = result
            entry["bench_commands"].append(" ".join(bench_cmd))
            save()
    except SystemExit as exc:  # SIGTERM (exit_on_sigterm): recorded, then re-raised
        entry["error"] = f"stopped by a signal (exit status {exc.code})"
        stopped = exc
    except Exception as exc:  # the mode's failure is a result, not a crash
        entry["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        stop_server(proc)
        if client is not None:
            client.close()
    text = log_path.read_text(errors="replace")
    entry["server_log"] = {**log_facts(text), "ready_s": _ready_seconds(text)}
    save()
    if "error" in entry:
        print(mode, "failed:", entry["error"], "|", *entry["server_log"]["exceptions"])
    if stopped is not None:
        raise stopped
    time.sleep(5)  # the GPU is free before the next server starts


def stop_server(proc) -> None:
    """SIGTERM to the server's process group (its own session), SIGKILL after 60 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:  # the whole group has exited already
        proc.wait()


def workload_of(row: dict):
    """The WORKLOADS run a sglang.benchmark.serving JSONL row measured."""
    for runs in WORKLOADS.values():
        for label, inp, outp, ratio, rate, conc, _ in runs:
            if (row["random_input_len"], row["random_output_len"]) == (inp, outp) and (
                math.isclose(row["random_range_ratio"], ratio)
                and float(row["request_rate"]) == rate
                and row["max_concurrency"] == conc
            ):
                return label
    return None


def recover(folder: Path) -> dict:
    """A run cut short before it wrote a mode (an older version of this script
    wrote the report once per mode): rebuild every mode's measured runs from
    the JSONL rows sglang.benchmark.serving wrote under ``folder``/logs (mode:
    the server's cuda_graph_backend_prefill in each row's server_info; run: the
    row's workload parameters) and its facts from the server logs. Rows of
    warm-up runs are left out. Committed folders keep those files gzipped
    (benchmark/compact_results.sh); either form is read."""
    report = json.loads((folder / RESULT).read_text())
    logs = folder / "logs"
    found = {}
    for path in sorted([*logs.glob("bench_*.jsonl"), *logs.glob("bench_*.jsonl.gz")]):
        if "_warmup_" in path.name or "_profile_" in path.name:
            continue
        row = json.loads(_read_text(path).splitlines()[-1])
        label = workload_of(row)
        if label is None:  # a workload this version of the script does not run
            continue
        mode = row["server_info"]["cuda_graph_backend_prefill"]
        found.setdefault(mode, {})[label] = kept(row)
    for mode in MODES:
        if mode not in found:
            continue
        entry = report["modes"].setdefault(mode, {"runs": {}})
        missing = {k: v for k, v in found[mode].items() if k not in entry["runs"]}
        if missing:
            entry["runs"].update(missing)
            entry["recovered_from_jsonl"] = sorted(missing)
        for server_log in (logs / f"server_{mode}.log", logs / f"server_{mode}.log.gz"):
            if not server_log.exists():
                continue
            text = _read_text(server_log)
            entry["server_log"] = log_facts(text)
            entry["server_log"]["ready_s"] = _ready_seconds(text)
    order = [run[0] for runs in WORKLOADS.values() for run in runs]
    for entry in report["modes"].values():
        entry["runs"] = dict(
            sorted(entry["runs"].items(), key=lambda kv: order.index(kv[0]))
        )
    return report


def _read_text(path: Path) -> str:
    """A log or JSONL file, or its gzipped form (``.gz``)."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", errors="replace") as f:
            return f.read()
    return path.read_text(errors="replace")


def _ready_seconds(log: str):
    """Seconds from the server log's first line to "ready to roll" (the
    script's own ready_s also waits for /health_generate)."""
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", log, re.M)
    ready = re.search(r"^\[([^\]]+)\] The server is fired up", log, re.M)
    if not (stamps and ready):
        return None
    from datetime import datetime

    def parse(stamp):
        return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")

    return (parse(ready.group(1)) - parse(stamps[0])).total_seconds()


def plot() -> None:
    """TTFT p50 and p99 per workload and mode, from the committed JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads((ROOT / "benchmark" / "results" / RESULT).read_text())
    modes = [m for m in MODES if m in report["modes"]]
    runs = list(report["modes"][modes[0]]["runs"])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(modes)
    for ax, key in zip(axes, ("median_ttft_ms", "p99_ttft_ms")):
        for j, mode in enumerate(modes):
            rows = report["modes"][mode]["runs"]
            ax.bar(
                [k + j * width for k in range(len(runs))],
                [rows.get(r, {}).get(key) or 0 for r in runs],
                width,
                label=mode,
            )
        ax.set_xticks(
            [k + width * (len(modes) - 1) / 2 for k in range(len(runs))],
            runs,
            rotation=40,
            ha="right",
        )
        ax.set_yscale("log")
        ax.set_ylabel(f"TTFT {key.split('_')[0]}, ms")
        ax.legend()
    device = report["provenance"]["device"]
    fig.suptitle(f"{report['model']} via launch_server + benchmark.serving ({device})")
    fig.tight_layout()
    fig.savefig(ROOT / "benchmark" / "results" / "serving_prefill_graph.png", dpi=100)


SIZES_LABEL = re.compile(r"^(\d+) x (\d+) tokens$")


def crossover(
    report: dict,
    graph: str = "full",
    base: str = "breakable",
    routed: dict | None = None,
) -> dict:
    """From a report's "sizes" runs of both modes: per run, the prompt tokens per
    request and both median times to first token, in order of tokens per
    request; ``first_loss``, the fewest tokens per request of a run ``graph``
    lost; and ``bound``, the most tokens per request of a run below that one
    (what MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST is set from,
    full_prefill_graph_capability). ``bound`` 0: ``graph`` lost the shortest run
    (512 tokens), so nothing measured here supports a bound; None: it lost no
    sizes run (the long runs, of ranges of lengths, are not read).

    With ``routed``, another report whose ``graph`` server sent runs eager (its
    bound set below them), the base of a run is that server's eager prefill
    instead of ``base``'s: what routing the run would give, on the same kind of
    server. Only its runs whose prefill batches were mostly eager count (the
    rest replayed the graph there too; a ValueError if none did: the files
    swapped, or that server's bound above every run). ``bound`` 0 then says the
    graph lost the shortest run that counts, not that it lost at 512."""
    runs = []
    for label, _, _, _, _, _, _ in WORKLOADS["sizes"]:
        requests, tokens = map(int, SIZES_LABEL.match(label).groups())
        try:
            ttft = {graph: report["modes"][graph]["runs"][label]["median_ttft_ms"]}
            if routed is None:
                ttft[base] = report["modes"][base]["runs"][label]["median_ttft_ms"]
            else:
                run = routed["modes"][graph]["runs"][label]
                batches = run["prefill_batches"]
                if batches["graph"] >= batches["eager"]:
                    continue
                ttft[base] = run["median_ttft_ms"]
        except KeyError:
            continue
        runs.append({"label": label, "tokens_per_request": tokens, **ttft})
    if routed is not None and not runs:
        raise ValueError(f"no sizes run of the routed report's {graph} ran eager")
    runs.sort(key=lambda r: r["tokens_per_request"])
    tokens = [r["tokens_per_request"] for r in runs]
    first_loss = min(
        (n for n, r in zip(tokens, runs) if r[graph] > r[base]), default=None
    )
    bound = (
        None
        if first_loss is None
        else max((n for n in tokens if n < first_loss), default=0)
    )
    return {
        "graph": graph,
        "base": base,
        "runs": runs,
        "first_loss": first_loss,
        "bound": bound,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="qwen3-next-80b-a3b-fp8", choices=sorted(MODELS)
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    parser.add_argument("--quick", action="store_true", help="a quarter of the prompts")
    parser.add_argument(
        "--context-length",
        type=int,
        default=None,
        help=f"default: {CONTEXT_LENGTH}, or the model's positions where fewer",
    )
    parser.add_argument("--mem-fraction-static", type=float, default=0.85)
    parser.add_argument("--ready-timeout", type=float, default=900)
    parser.add_argument(
        "--output", default=None, help="JSON path (default: $OUT or results/)"
    )
    parser.add_argument(
        "--plot", action="store_true", help="only draw the committed JSON (CPU)"
    )
    parser.add_argument(
        "--recover",
        metavar="DIR",
        help="rebuild DIR's report from the JSONL rows and server logs under "
        "DIR/logs (a run cut short), then exit",
    )
    parser.add_argument(
        "--crossover",
        metavar="FILE",
        help="print, from FILE's sizes runs of full and breakable, the most prompt "
        "tokens per request up to which full was never slower (JSON), then exit",
    )
    parser.add_argument(
        "--routed",
        metavar="FILE",
        help="with --crossover: hold full against FILE's full server where it sent "
        "the run eager (its bound below the run) instead of against breakable",
    )
    parser.add_argument(
        "--profile",
        default="",
        help="comma-separated run labels (e.g. '1 x 2048 tokens', or 1_x_2048_tokens) "
        "each server runs "
        "once more under sglang's torch profiler (traces under the logs folder; "
        "benchmark/trace_summary.py reads them)",
    )
    parser.add_argument("server_args", nargs="*", help="extra sglang flags, after --")
    args = parser.parse_args()
    if args.plot:
        plot()
        return
    if args.routed and not args.crossover:
        parser.error("--routed goes with --crossover")
    if args.crossover:
        report = json.loads(Path(args.crossover).read_text())
        if args.routed:
            routed = json.loads(Path(args.routed).read_text())
            result = crossover(report, base="routed eager", routed=routed)
        else:
            result = crossover(report)
        print(json.dumps(result))
        return
    if args.recover:
        folder = Path(args.recover)
        path = Path(args.output) if args.output else folder / RESULT
        path.write_text(json.dumps(recover(folder), indent=1, default=str))
        print("wrote", path)
        return
    args.modes = args.modes.split(",")
    args.workloads = args.workloads.split(",")
    args.profile = [label for label in args.profile.split(",") if label]
    planned = {
        name
        for run, _ in plan_runs(args.workloads, INF)[0]
        for name in (run[0], run_slug(run[0]))
    }
    unknown = [label for label in args.profile if label not in planned]
    if unknown:
        sys.exit(
            f"serving_prefill_graph: --profile {unknown}: not a run of {args.workloads}"
        )
    args.scale = 0.25 if args.quick else 1.0
    error = client_import_error(BENCH_MODULE)
    if error:
        sys.exit(
            f"serving_prefill_graph: {BENCH_MODULE} does not import ({error}); "
            "no server started. Install what it names (sglang's own requirements; "
            "an offline bundle built by ../shared/gpu/bundle.sh needs "
            "datasets==5.2.0 among its extra requirements: test/gpu/resplit_bundle.sh)."
        )
    exit_on_sigterm()

    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    log_dir = out / "logs" if out else Path(tempfile.mkdtemp(prefix="serving_logs"))
    log_dir.mkdir(parents=True, exist_ok=True)
    model_dir = Path(tempfile.mkdtemp(prefix=f"{args.model}_"))
    MODELS[args.model](model_dir)
    word_level_tokenizer(model_dir)
    if args.context_length is None:
        args.context_length = default_context_length(model_dir)

    from provenance import provenance

    report = {
        "provenance": provenance(),
        "model": args.model,
        "config": json.loads((model_dir / "config.json").read_text()),
        "environment": {
            k: v for k, v in os.environ.items() if k.startswith(("SGLANG", "GRAPHFIX"))
        },
        "workloads": {w: WORKLOADS[w] for w in args.workloads},
        "modes": {},
    }
    path = (
        Path(args.output)
        if args.output
        else (out or ROOT / "benchmark" / "results") / RESULT
    )

    def save():
        path.write_text(json.dumps(report, indent=1, default=str))

    for mode in args.modes:
        run_mode(
            model_dir, mode, args, log_dir, report["modes"].setdefault(mode, {}), save
        )
    print("wrote", path)


if __name__ == "__main__":
    main()
