"""Tiny random Kimi-Linear (KDA hybrid, test/gpu/models.py) under each prefill
CUDA-graph backend: disabled (eager prefill, decode graphs only), breakable and
full (the KDA extend on upstream's per-bucket tables; upstream 0.5.23 crashes at
capture, sglang-graphfix captures it).

Per backend, one engine (fa3 attention: Kimi-Linear's MLA layer needs it for a
full prefill graph; Triton KDA prefill on every backend; radix cache off):
  memory      GPU memory in use on the device after startup (all graphs captured),
              from torch.cuda.mem_get_info in this process, minus the idle baseline;
              and sglang's own per-phase graph memory (get_server_info)
  capture_s   sglang's per-phase CUDA-graph capture time (get_server_info)
  ttft        1 prompt of L tokens (L in 16/64/256), max_new_tokens=1: median
              engine.generate wall time (e2e_ms) and, with the benchmark/timer
              plugin, the prefill forward inside the scheduler (forward_ms)
The memory goal: prefill+decode graphs (full) at most 1% above decode-only
(disabled).

    python3 benchmark/kimi_linear_prefill_graph.py [--quick]

Writes $OUT/kimi_linear_prefill_graph.json, else
benchmark/results/kimi_linear_prefill_graph.json.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
RESULT = "kimi_linear_prefill_graph.json"
sys.path[:0] = [
    str(ROOT / "benchmark" / "timer"),  # the timer plugin, for the engine processes
    str(ROOT / "test" / "gpu"),
    str(ROOT / "test"),
]

LENGTHS = (16, 64, 256)
BUCKETS = [16, 32, 64, 128, 256]
PREFILL = {
    "disabled": {"backend": "disabled"},
    "breakable": {"backend": "breakable", "bs": BUCKETS},
    "full": {"backend": "full", "bs": BUCKETS, "full_prefill_max_req": 4},
}
GIB = 1 << 30


def _device_used_gib() -> float:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def _settled_used_gib(timeout: float = 60.0) -> float:
    """Device memory in use once a shut-down engine has released its memory."""
    used, start = _device_used_gib(), time.time()
    while time.time() - start < timeout:
        time.sleep(2)
        now = _device_used_gib()
        if abs(now - used) < 0.01:
            return now
        used = now
    return used


def _graph_stats(info: dict) -> tuple:
    states = info.get("internal_states") or [{}]
    state = states[0] if isinstance(states, list) else states
    memory = (state.get("memory_usage") or {}).get("graph") or {}
    startup = state.get("startup_time") or info.get("startup_time") or {}
    return memory, startup.get("cuda_graph") or {}


def measure(model_path: str, prefill: dict, warmup: int, repeats: int) -> dict:
    from graphfix_bench_timer import read_forwards
    from models import prompts

    import sglang

    timer = Path(tempfile.mkdtemp(prefix="graphfix-timer")) / "forwards.txt"
    idle = _settled_used_gib()
    os.environ["GRAPHFIX_BENCH_TIMER"] = str(timer)  # read by the engine processes
    try:
        engine = sglang.Engine(
            model_path=model_path,
            skip_tokenizer_init=True,
            log_level="warning",
            attention_backend="fa3",
            dtype="bfloat16",  # the checkpoint's (its sglang config names none)
            linear_attn_prefill_backend="triton",
            chunked_prefill_size=BUCKETS[-1],
            context_length=2048,
            mem_fraction_static=0.3,
            max_total_tokens=32768,
            max_mamba_cache_size=64,
            cuda_graph_max_bs_decode=4,
            disable_radix_cache=True,  # repeated prompts must prefill every time
            cuda_graph_config={"prefill": prefill},
        )
    finally:
        os.environ.pop("GRAPHFIX_BENCH_TIMER", None)
    try:
        used = _device_used_gib() - idle
        graph_memory, capture_s = _graph_stats(engine.get_server_info())
        ttft = {}
        for length in LENGTHS:
            batch = prompts(length, [length])
            e2e = []
            for i in range(warmup + repeats):
                start = time.perf_counter()
                engine.generate(
                    input_ids=batch,
                    sampling_params={
                        "temperature": 0.0,
                        "max_new_tokens": 1,
                        "ignore_eos": True,
                    },
                )
                if i >= warmup:
                    e2e.append((time.perf_counter() - start) * 1e3)
            ttft[length] = {"e2e_ms": round(statistics.median(e2e), 3)}
    finally:
        engine.shutdown()
    forwards = read_forwards(timer) if timer.exists() else {}
    for length in LENGTHS:  # one prompt each; the last `repeats` forwards
        runs = forwards.get((1, length), [])[-repeats:]
        ttft[length]["forward_ms"] = (
            round(statistics.median(ms for _, ms in runs), 3) if runs else None
        )
        ttft[length]["graph_forwards"] = sum(g for g, _ in runs)
    return {
        "device_memory_gib": round(used, 3),
        "graph_memory_gib": graph_memory,
        "capture_s": capture_s,
        "ttft": ttft,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    from models import tiny_kimi_linear

    warmup, repeats = (2, 5) if args.quick else (5, 30)
    model_path = tiny_kimi_linear(Path(tempfile.mkdtemp(prefix="kimi_linear")))
    out = Path(os.environ.get("OUT") or ROOT / "benchmark" / "results")
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "provenance": provenance(),
        "model": "tiny random Kimi-Linear (test/gpu/models.py): 3 KDA + 1 MLA layer",
        "workload": f"1 prompt x L tokens, max_new_tokens=1, radix cache off; median of {repeats} after {warmup} warmups",
        "prefill_backend": {},
    }
    for name, cfg in PREFILL.items():  # written after each backend
        try:
            result = measure(model_path, cfg, warmup, repeats)
        except Exception as exc:  # e.g. a configuration the server args reject
            result = {"error": f"{type(exc).__name__}: {exc}"}
        report["prefill_backend"][name] = result
        memory = {
            k: v["device_memory_gib"]
            for k, v in report["prefill_backend"].items()
            if "device_memory_gib" in v
        }
        if "disabled" in memory and "full" in memory:
            base = memory["disabled"]
            extra = memory["full"] - base
            report["full_vs_decode_only_memory"] = {
                "extra_gib": round(extra, 3),
                "extra_percent": round(100 * extra / base, 2) if base else None,
                "goal_percent": 1.0,
            }
        (out / RESULT).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
