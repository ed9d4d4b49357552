"""How much of a weights_proj adapter's effect on the DSA head gate the merged
weight keeps (CPU, DeepSeek-V3.2 shapes: 64 heads x hidden 7168, rank 16).

For adapters that move the gate by 0.1-30% (the norm of x·ΔWᵀ over that of
x·Wᵀ, W ~ N(0, 0.02) in bf16, 512 random tokens), the error of the gate against
x·(W + ΔW)ᵀ in fp32, as a share of the adapter's move, for
  merged_weights_proj  sglang-graphfix's merged weight: two bf16 halves
  one_bf16             W + ΔW rounded once to bf16 (a merged bf16 checkpoint)
The gate's own fp32 accumulation is the same in all (CPU matmul in fp32).

    python3 benchmark/merged_gate_precision.py

writes benchmark/results/merged_gate_precision.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel" / "python")]

HIDDEN, N_HEADS, RANK, TOKENS = 7168, 64, 16, 512
MOVES = (0.3, 0.1, 0.03, 0.01, 0.003, 0.001)


class _LoRALayer:  # what merged_weights_proj reads of ReplicatedLinearWithLoRA
    def __init__(self, weight, lora_a, lora_b):
        self.weight, self.lora_a, self.lora_b = weight, lora_a, lora_b


def main():
    from sglang_graphfix.srt.layers.attention.dsa.dsa_indexer import (
        drop_merged_weights_proj,
        merged_weights_proj,
    )

    gen = torch.Generator().manual_seed(0)
    weight = (0.02 * torch.randn(N_HEADS, HIDDEN, generator=gen)).bfloat16()
    x = torch.randn(TOKENS, HIDDEN, generator=gen).bfloat16().float()
    bare = x @ weight.float().t()
    # Slot 1 of a two-slot pool, triton batch info of one request.
    batch_info = SimpleNamespace(
        req_seg_indptr=None, permutation=None, num_segments=1, bs=1, max_len=TOKENS,
        seg_indptr=torch.tensor([0, TOKENS]), weight_indices=torch.tensor([1]),
        lora_ranks=torch.tensor([0, RANK]), scalings=torch.tensor([0.0, 1.0]),
    )  # fmt: skip
    rows = []
    for move in MOVES:
        a = torch.randn(RANK, HIDDEN, generator=gen) / HIDDEN**0.5
        b = torch.randn(N_HEADS, RANK, generator=gen)
        b *= move * bare.norm() / (x @ (b @ a).t()).norm()
        lora_a = torch.zeros(2, RANK, HIDDEN, dtype=torch.bfloat16)
        lora_b = torch.zeros(2, N_HEADS, RANK, dtype=torch.bfloat16)
        lora_a[1], lora_b[1] = a.bfloat16(), b.bfloat16()
        delta = lora_b[1].float() @ lora_a[1].float()
        exact = x @ (weight.float() + delta).t()
        effect = (exact - bare).norm()
        drop_merged_weights_proj()
        halves = merged_weights_proj(
            _LoRALayer(weight, lora_a, lora_b), "a", batch_info
        )
        high, low = halves.float().chunk(2)
        ours = x @ high.t() + x @ low.t()
        one_bf16 = x @ (weight.float() + delta).bfloat16().float().t()
        rows.append(
            {
                "adapter_moves_gate_by": round(float(effect / bare.norm()), 4),
                "merged_weights_proj_error_share": float(
                    (ours - exact).norm() / effect
                ),
                "one_bf16_error_share": float((one_bf16 - exact).norm() / effect),
            }
        )
        print(json.dumps(rows[-1]))
    out = ROOT / "benchmark" / "results" / "merged_gate_precision.json"
    report = {
        "provenance": provenance(),
        "shapes": [N_HEADS, HIDDEN, RANK, TOKENS],
        "rows": rows,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
