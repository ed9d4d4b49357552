"""Prefill latency of a GDN hybrid (tiny random Qwen3-Next) under each prefill
CUDA-graph backend: disabled (eager), breakable (sglang's default) and full
(upstream 0.5.23 crashes at capture; works with sglang-graphfix installed).

Workload: a batch of 4 prompts of 16 tokens, max_new_tokens=1 (one prefill
forward plus sampling), run WARMUP times and then REPEATS times; reports the
median and p90 wall time of engine.generate per batch, in ms.

    python3 benchmark/prefill_graph_latency.py   # on a GPU host, sglang 0.5.23 + sglang-graphfix

Writes $OUT/prefill_graph_latency.json, else benchmark/results/prefill_graph_latency.json.
"""

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "test" / "gpu"), str(ROOT / "test")]

from engine_utils import run_engine  # noqa: E402
from models import prompts, tiny_qwen3_next  # noqa: E402

WARMUP, REPEATS = 5, 30
BACKENDS = {
    "full": {"backend": "full", "bs": [16, 32, 64, 128], "full_prefill_max_req": 4},
    "disabled": {"backend": "disabled"},
    "breakable": {"backend": "breakable", "bs": [16, 32, 64, 128]},
}


def measure(model_path: str, prefill: dict) -> dict:
    batch = {"input_ids": prompts(7, [16] * 4), "max_new_tokens": 1}
    results = run_engine(
        {
            "model_path": model_path,
            "attention_backend": "flashinfer",
            "linear_attn_prefill_backend": "triton",
            "chunked_prefill_size": 128,
            "context_length": 1024,
            "mem_fraction_static": 0.3,
            "cuda_graph_max_bs_decode": 4,
            # A batch of identical-length prompts: keep the radix cache out of it.
            "disable_radix_cache": True,
            "cuda_graph_config": {"prefill": prefill},
        },
        [batch] * (WARMUP + REPEATS),
    )
    ms = sorted(r[0]["seconds"] * 1e3 for r in results[WARMUP:])
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
    }


def main() -> None:
    import torch

    model_path = tiny_qwen3_next(Path(tempfile.mkdtemp(prefix="qwen3_next")))
    report = {
        "workload": f"4 prompts x 16 tokens, max_new_tokens=1; median of {REPEATS} after {WARMUP} warmups",
        "model": "tiny random Qwen3-Next (test/tiny_configs.py): 3 GDN + 1 attention layer",
        "device": torch.cuda.get_device_name(),
        "prefill_backend": {},
    }
    out = Path(os.environ.get("OUT") or ROOT / "benchmark" / "results")
    out.mkdir(parents=True, exist_ok=True)
    for name, cfg in BACKENDS.items():  # written after each backend
        report["prefill_backend"][name] = measure(model_path, cfg)
        (out / "prefill_graph_latency.json").write_text(
            json.dumps(report, indent=2) + "\n"
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
