"""Tile sweep of sgl-kernel's fused LoRA head-gate delta (add_lora_head_gate_delta_)
at DeepSeek-V3.2 indexer shapes: hidden 7168, 64 index heads, pool max rank 16 and
64, 512 / 2048 / 8192 tokens (one request per 2048 tokens, every request with the
adapter), sglang's triton and csgmv batch info. For each shape: the base gate GEMM
(torch.mm to fp32, what the gate costs without LoRA) and the delta under the
default heuristic and each (block_k, split_k) override. GPU-bound time: 50 calls
queued back to back between one pair of CUDA events, median of 7 rounds.

    python3 benchmark/dsa_head_gate_kernel_sweep.py

Writes $OUT/dsa_head_gate_kernel_sweep.json, else benchmark/results/.
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "sgl-kernel" / "python"), str(ROOT / "test")]

from lora_head_gate_cases import prepare  # noqa: E402
from sglang_graphfix_kernel.lora_head_gate import add_lora_head_gate_delta_  # noqa: E402

HIDDEN, HEADS, CALLS, ROUNDS = 7168, 64, 50, 7
CONFIGS = [None] + [
    {"block_k": bk, "split_k": sk} for bk in (128, 256, 512) for sk in (1, 2, 4, 8)
]


def _gpu_ms(fn) -> float:
    times = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000)  # keep the queue ahead of the GPU
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return statistics.median(times)


def main() -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    weight = torch.randn(HEADS, HIDDEN, device=dev, generator=gen).bfloat16() * 0.02
    rows = []
    for backend in ("triton", "csgmv"):
        for rank in (16, 64):
            a = torch.randn(2, rank, HIDDEN, device=dev, generator=gen).bfloat16()
            b = torch.randn(2, HEADS, rank, device=dev, generator=gen).bfloat16()
            a[0], b[0] = 0, 0  # slot 0: no adapter
            for tokens in (512, 2048, 8192):
                requests = [(min(2048, tokens), 1)] * max(1, tokens // 2048)
                info = prepare(backend, False, requests, {1: (rank, 2.0)}, device=dev)
                info = info.get_batch_info()
                x = torch.randn(tokens, HIDDEN, device=dev, generator=gen).bfloat16()
                base = torch.mm(x, weight.t(), out_dtype=torch.float32)
                row = {
                    "backend": backend,
                    "rank": rank,
                    "tokens": tokens,
                    "base_gemm_ms": round(
                        _gpu_ms(lambda: torch.mm(x, weight.t(), out_dtype=torch.float32)), 5
                    ),
                    "delta_ms": {},
                }
                reference = add_lora_head_gate_delta_(base.clone(), x, a, b, info)
                for config in CONFIGS:
                    kwargs = config or {}
                    name = "default" if config is None else f"bk{kwargs['block_k']}_sk{kwargs['split_k']}"
                    try:
                        out = add_lora_head_gate_delta_(base.clone(), x, a, b, info, **kwargs)
                        err = float((out - reference).abs().max() / reference.abs().max())
                        ms = _gpu_ms(
                            lambda: add_lora_head_gate_delta_(base, x, a, b, info, **kwargs)
                        )
                        row["delta_ms"][name] = {"ms": round(ms, 5), "rel_diff_vs_default": err}
                    except Exception as exc:  # e.g. shared memory over the limit
                        row["delta_ms"][name] = {"error": repr(exc)[:200]}
                best = min(
                    (v["ms"], k) for k, v in row["delta_ms"].items() if "ms" in v
                )
                row["best"] = best[1]
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = Path(os.environ.get("OUT") or ROOT / "benchmark" / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "dsa_head_gate_kernel_sweep.json").write_text(
        json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
