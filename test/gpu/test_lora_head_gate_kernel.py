"""sgl-kernel's LoRA head-gate kernels (the delta on cuBLAS, the whole gate) on the H200, bf16, at DeepSeek-V3.2's
indexer shapes (hidden 7168, 64 index heads; pool max rank 16 and 64), on the
batch info sglang's csgmv and triton LoRA backends prepare (eager and
prefill-graph buffers): against the fp32 reference and against sglang's own
shrink + expand kernels on the same batch info. The CPU version of these cases
runs in Triton's interpreter (test/unit/sgl_kernel). Split K is checked to be
deterministic (the same bits over 50 launches)."""

import pytest
import torch
from engine_utils import write_result
from lora_head_gate_cases import VARIANTS, case, prepare, run

from sglang.kernels.ops.lora.dense import chunked_sgmv_shrink
from sglang_graphfix_kernel.lora_head_gate import (
    add_lora_head_gate_delta_,
    lora_head_gate,
)

# 4501 tokens, two requests without an adapter.
REQUESTS = [(1500, 1), (300, 0), (2000, 2), (1, 1), (700, 0)]
CASES = dict(
    case(backend, graph, max_rank, requests=REQUESTS, rows=4608)
    for backend in ("triton", "csgmv")
    for graph in (False, True)
    for max_rank in (16, 64)
)
RESULTS = {}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", list(CASES))
def test_fused_delta_matches_reference_and_sglang(name, variant):
    # sglang caches the csgmv shrink by (K, slices, chunk), not by max rank: a
    # second pool rank in one process would reuse the first's kernel.
    chunked_sgmv_shrink._chunked_lora_shrink_kernel._clear_cache()
    r = run(
        **CASES[name], k=7168, n=64, device="cuda", dtype=torch.bfloat16,
        unfused=True, **VARIANTS[variant],
    )  # fmt: skip
    RESULTS[f"{name}-{variant}"] = r
    write_result("lora_head_gate_kernel", RESULTS)
    assert r["adapter_rows"] == 3501
    # Both round x·Aᵀ to bf16 after fp32 sums in different orders: a flipped
    # rounding moves the delta by ~2^-8 of one rank term.
    assert r["adapter_rows_max_rel_error"] < 1e-2, r
    assert r["vs_sglang_unfused_adapter_rows_max_rel_error"] < 1e-2, r
    if variant.startswith("full"):
        # x Wᵀ from this kernel for rows without an adapter and graph padding:
        # fp32 sums of bf16 products in another order than the fp32 reference.
        assert r["other_rows_max_rel_error"] < 1e-4, r
    else:
        assert r["other_rows_bit_identical"], r
    assert r["swapped_adapters_max_rel_error"] > 0.1, r


@pytest.mark.parametrize("kernel", ["delta", "whole_gate"])
def test_split_k_is_deterministic(kernel):
    """Split K sums its partials in split order whichever program finishes a row
    tile last: 50 launches give the same bits. Control (whole gate, whose fp32
    base sums reach the output): another split count, another summation order,
    changes bits, so the comparison can fail. The delta rounds x Aᵀ to bf16,
    which hides most order changes: there the test catches races (a stale
    partial), not reordering."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(512, 7168, device="cuda", generator=g).bfloat16()
    w = (torch.randn(64, 7168, device="cuda", generator=g) * 0.02).bfloat16()
    a = (torch.randn(3, 16, 7168, device="cuda", generator=g) / 7168**0.5).bfloat16()
    b = (torch.randn(3, 64, 16, device="cuda", generator=g) * 0.1).bfloat16()
    info = prepare("triton", False, [(512, 1)], {1: (16, 2.0)}, device="cuda")
    info = info.get_batch_info()
    base = torch.mm(x, w.t(), out_dtype=torch.float32)

    def gate(split_k):
        if kernel == "delta":
            return add_lora_head_gate_delta_(
                base.clone(), x, a, b, info, split_k=split_k
            )
        return lora_head_gate(x, w, a, b, info, split_k=split_k)

    first = gate(8)
    differing = sum(not torch.equal(gate(8), first) for _ in range(50))
    other_order = not torch.equal(gate(4), first)
    write_result(
        f"lora_head_gate_split_k_determinism_{kernel}",
        {
            "launches": 50,
            "differing": differing,
            "split4_differs_from_split8": other_order,
        },
    )
    assert differing == 0
    if kernel == "whole_gate":
        assert other_order
