"""Tile sweep of sgl-kernel's fused LoRA head-gate delta (add_lora_head_gate_delta_)
at DeepSeek-V3.2 indexer shapes: hidden 7168, 64 index heads, pool max rank 16 and
64, 512 / 2048 / 8192 tokens (one request per 2048 tokens, every request with the
adapter), sglang's triton and csgmv batch info. For each shape: the base gate GEMM
(torch.mm to fp32, what the gate costs without LoRA); the delta added to it under
the default heuristic and each (block_k, split_k) override, split-K reduced by a
second launch or in the same launch (one_launch); and the whole gate (base +
delta) in one launch that reads x once (lora_head_gate), per (block_m, block_k,
split_k). Each variant's max error against the fp32 reference relative to its
max. GPU-bound time: 50 calls
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
from sglang_graphfix_kernel.lora_head_gate import (  # noqa: E402
    add_lora_head_gate_delta_,
    lora_head_gate,
)

HIDDEN, HEADS, CALLS, ROUNDS = 7168, 64, 50, 7
CONFIGS = [None] + [
    {"block_k": bk, "split_k": sk} for bk in (128, 256, 512) for sk in (1, 2, 4, 8)
] + [
    {"block_k": bk, "split_k": sk, "one_launch": True}
    for bk in (128, 256) for sk in (2, 4, 8, 16)
]
FULL_CONFIGS = [None] + [
    {"block_m": bm, "block_k": bk, "split_k": sk}
    for bm in (16, 32, 64) for bk in (64, 128) for sk in (1, 2, 4, 8, 16)
]


def _name(config) -> str:
    if config is None:
        return "default"
    return "_".join(f"{k[:2] if k != 'one_launch' else '1l'}{int(v)}" for k, v in config.items())


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
                ref = base.clone()
                for start in range(0, tokens, 2048):
                    rows_ = slice(start, min(tokens, start + 2048))
                    xa = (x[rows_].float() @ a[1].float().t()).bfloat16().float()
                    ref[rows_] += 2.0 * xa @ b[1].float().t()
                scale = ref.abs().max()
                row = {
                    "backend": backend,
                    "rank": rank,
                    "tokens": tokens,
                    "base_gemm_ms": round(
                        _gpu_ms(lambda: torch.mm(x, weight.t(), out_dtype=torch.float32)), 5
                    ),
                    "delta_ms": {},
                    "full_gate_ms": {},
                }
                for config in CONFIGS:
                    kwargs = config or {}
                    try:
                        out = add_lora_head_gate_delta_(base.clone(), x, a, b, info, **kwargs)
                        err = float((out - ref).abs().max() / scale)
                        ms = _gpu_ms(
                            lambda: add_lora_head_gate_delta_(base, x, a, b, info, **kwargs)
                        )
                        row["delta_ms"][_name(config)] = {"ms": round(ms, 5), "rel_err": err}
                    except Exception as exc:  # e.g. shared memory over the limit
                        row["delta_ms"][_name(config)] = {"error": repr(exc)[:200]}
                for config in FULL_CONFIGS:
                    kwargs = config or {}
                    try:
                        out = lora_head_gate(x, weight, a, b, info, **kwargs)
                        err = float((out - ref).abs().max() / scale)
                        ms = _gpu_ms(lambda: lora_head_gate(x, weight, a, b, info, **kwargs))
                        row["full_gate_ms"][_name(config)] = {"ms": round(ms, 5), "rel_err": err}
                    except Exception as exc:
                        row["full_gate_ms"][_name(config)] = {"error": repr(exc)[:200]}
                for key in ("delta_ms", "full_gate_ms"):
                    ok = [(v["ms"], k) for k, v in row[key].items() if "ms" in v and v["rel_err"] < 2e-2]
                    row["best_" + key] = min(ok) if ok else None
                base_ms = row["base_gemm_ms"]
                if row["best_delta_ms"] and row["best_full_gate_ms"]:
                    row["overhead_pct"] = {
                        "base_plus_delta": round(100 * row["best_delta_ms"][0] / base_ms, 1),
                        "full_gate": round(100 * (row["best_full_gate_ms"][0] / base_ms - 1), 1),
                    }
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("_ms") or k == "base_gemm_ms"}), flush=True)
                rows.append(row)
    out = Path(os.environ.get("OUT") or ROOT / "benchmark" / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "dsa_head_gate_kernel_sweep.json").write_text(
        json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
