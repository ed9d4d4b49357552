"""Tile sweep of sgl-kernel's LoRA head-gate kernels at DeepSeek-V3.2 indexer
shapes: hidden 7168, 64 index heads, pool max rank 16 and 64, 512 / 2048 / 8192
tokens (one request per 2048 tokens, every request with the adapter), sglang's
Triton LoRA backend batch info. Per shape:
  base_gemm_ms   torch.mm to fp32, what the gate's GEMM costs without LoRA
  delta_ms       add_lora_head_gate_delta_ into that base (mixed batches): the
                 default heuristic and (block_k, split_k) overrides
  full_gate_ms   lora_head_gate, base + delta in one launch reading x once
                 (batches on several adapters), per
                 (block_m, block_k, split_k)
Each variant's max |error| against the fp32 reference x Wᵀ + s·(x Aᵀ) Bᵀ (x Aᵀ
rounded to bf16) over the reference's max. GPU time only: CALLS calls captured in
one CUDA graph, replayed between two CUDA events, median of ROUNDS replays (no
host launch cost in the figure).

    python3 benchmark/dsa_head_gate_kernel_sweep.py

Writes $OUT/dsa_head_gate_kernel_sweep.json, else benchmark/results/.
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch
from provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "sgl-kernel" / "python"), str(ROOT / "test")]

from lora_head_gate_cases import prepare  # noqa: E402

from sglang_graphfix_kernel.lora_head_gate import (  # noqa: E402
    add_lora_head_gate_delta_,
    lora_head_gate,
)

HIDDEN, HEADS, CALLS, ROUNDS = 7168, 64, 20, 9
DELTA_CONFIGS = [None] + [
    {"block_k": bk, "split_k": sk} for bk in (128, 256) for sk in (1, 4, 8)
]
FULL_CONFIGS = (
    [None]
    + [
        {"block_m": bm, "block_k": 128, "split_k": sk}
        for bm in (32, 64)
        for sk in (1, 2, 4, 8, 16)
    ]
    + [{"block_m": 16, "block_k": 128, "split_k": sk} for sk in (4, 8, 16)]
    + [{"block_m": 64, "block_k": 64, "split_k": sk} for sk in (1, 4)]
)


def _name(config) -> str:
    if config is None:
        return "default"
    short = {"block_m": "bm", "block_k": "bk", "split_k": "sk"}
    return "_".join(f"{short[k]}{int(v)}" for k, v in config.items())


def _gpu_ms(fn) -> float:
    fn()  # compile, allocate
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    times = []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return statistics.median(times)


def _timed(row, key, config, call, ref, scale):
    try:
        err = float((call() - ref).abs().max() / scale)
        row[key][_name(config)] = {"ms": round(_gpu_ms(call), 5), "rel_err": err}
    except Exception as exc:  # e.g. shared memory over the limit
        row[key][_name(config)] = {"error": repr(exc)[:200]}


def main() -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    weight = (torch.randn(HEADS, HIDDEN, device=dev, generator=gen) * 0.02).bfloat16()
    rows = []
    for rank in (16, 64):
        a = (
            torch.randn(2, rank, HIDDEN, device=dev, generator=gen).bfloat16()
            / HIDDEN**0.5
        )
        b = torch.randn(2, HEADS, rank, device=dev, generator=gen).bfloat16() * 0.1
        a[0], b[0] = 0, 0  # slot 0: no adapter
        for tokens in (512, 2048, 8192):
            requests = [(min(2048, tokens), 1)] * max(1, tokens // 2048)
            info = prepare("triton", False, requests, {1: (rank, 2.0)}, device=dev)
            info = info.get_batch_info()
            x = torch.randn(tokens, HIDDEN, device=dev, generator=gen).bfloat16()
            base = torch.mm(x, weight.t(), out_dtype=torch.float32)
            xa = (x.float() @ a[1].float().t()).bfloat16().float()
            ref = base + 2.0 * xa @ b[1].float().t()
            scale = ref.abs().max()
            row = {
                "rank": rank,
                "tokens": tokens,
                "base_gemm_ms": round(
                    _gpu_ms(lambda: torch.mm(x, weight.t(), out_dtype=torch.float32)), 5
                ),
                "delta_ms": {},
                "full_gate_ms": {},
            }
            for config in DELTA_CONFIGS:
                kw = config or {}
                scratch = base.clone()
                _timed(
                    row, "delta_ms", config,
                    lambda: add_lora_head_gate_delta_(scratch.copy_(base), x, a, b, info, **kw),
                    ref, scale,
                )  # fmt: skip
            for config in FULL_CONFIGS:
                kw = config or {}
                _timed(
                    row, "full_gate_ms", config,
                    lambda: lora_head_gate(x, weight, a, b, info, **kw), ref, scale,
                )  # fmt: skip
            # delta_ms includes a copy of the base (scratch.copy_), timed alone:
            copy_ms = _gpu_ms(lambda: scratch.copy_(base))
            row["base_copy_ms"] = round(copy_ms, 5)
            for key in ("delta_ms", "full_gate_ms"):
                ok = [
                    (v["ms"], k) for k, v in row[key].items()
                    if "ms" in v and v["rel_err"] < 2e-2
                ]  # fmt: skip
                row["best_" + key] = min(ok) if ok else None
            if row["best_delta_ms"] and row["best_full_gate_ms"]:
                base_ms = row["base_gemm_ms"]
                row["lora_gate_vs_base_pct"] = {
                    "base_plus_delta": round(
                        100 * (row["best_delta_ms"][0] - copy_ms) / base_ms, 1
                    ),
                    "full_gate": round(
                        100 * (row["best_full_gate_ms"][0] / base_ms - 1), 1
                    ),
                    "full_gate_default": round(
                        100 * (row["full_gate_ms"]["default"]["ms"] / base_ms - 1), 1
                    ),
                }
            print(
                json.dumps(
                    {
                        k: v
                        for k, v in row.items()
                        if k not in ("delta_ms", "full_gate_ms")
                    }
                ),
                flush=True,
            )
            rows.append(row)
    out = Path(os.environ.get("OUT") or ROOT / "benchmark" / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "dsa_head_gate_kernel_sweep.json").write_text(
        json.dumps(
            # The 'default' rows are the heuristic of provenance's commit.
            {"provenance": provenance(), "rows": rows},
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
