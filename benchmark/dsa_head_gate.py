"""Cost of DSA indexer weights_proj LoRA in the breakable prefill graph's indexer
split op (sglang-graphfix's lora_aware_head_gate), at DeepSeek-V3.2 shapes:
hidden 7168, 64 index heads of 128, q_lora_rank 1536; adapter rank 16 and 64;
512-8192 prefill tokens (one request per 2048).

Runs sglang's own objects with sglang-graphfix applied: the Indexer's
_get_logits_head_gate (its weights_proj a ReplicatedLinear, or sglang's
ReplicatedLinearWithLoRA on the Triton or csgmv LoRA backend, batch info from the
backend's prepare_lora_batch for the static prefill-graph buffers, as in a
breakable-graph replay). Three head gates per shape:
  no_lora          upstream's gate (fp32 base GEMM, compiled scaling)
  lora_adapter     every request with the adapter: base GEMM + shrink + expand
  lora_no_adapter  the LoRA layer, no request with an adapter (a LoRA server's
                   base-model traffic): the kernels launch and exit
and the split op's main kernels around the gate ("split_op_core": wq_b and wk
projections (bf16 GEMMs), act_quant of q and k, the gate, DeepGEMM's fp8 MQA
logits over the prompt itself), with the no_lora or the lora_adapter gate. The
core leaves out the Hadamard rotation, the k-cache store and the top-k: its time
is an underestimate of the split op's, so its overhead % is an upper bound.
Also an estimate of a fused kernel for a single adapter: one fp32 GEMM of x with
[W; A] (what a fused base + shrink would read) plus the expand.

Checks at 2048 tokens (4 requests, every other with the adapter): adapter rows
against the fp32 reference x Wᵀ + s·(x Aᵀ) Bᵀ, other rows bit-identical to the
gate without LoRA.

CUDA-event timing of each call (launch gaps included, as in the eager split op),
median over the iterations after a warm-up; L2 is not flushed.

    python3 benchmark/dsa_head_gate.py [--quick]

--quick: 512 and 8192 tokens, 20 iterations (about a minute on an H200, most of
it Triton/inductor compilation). Writes $OUT/dsa_head_gate.json, else
benchmark/results/dsa_head_gate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULT = "dsa_head_gate.json"
sys.path.insert(0, str(ROOT / "python"))

HIDDEN, N_HEADS, HEAD_DIM, Q_LORA_RANK = 7168, 64, 128, 1536
RANKS = (16, 64)
TOKENS = (512, 1024, 2048, 4096, 8192)
QUICK_TOKENS = (512, 8192)
TOKENS_PER_REQUEST = 2048
MAX_LORAS = 2  # pool slot 0: no adapter (rank 0); slot 1: the adapter
SCALING = 2.0
GOAL_PCT = 5.0


def _indexer(weights_proj):
    """An Indexer with what the head gate reads (its __init__ needs a model
    config, rope caches and the runtime context)."""
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer

    indexer = Indexer.__new__(Indexer)
    torch.nn.Module.__init__(indexer)
    indexer.weights_proj = weights_proj
    indexer.use_dsa_indexer_fusion = False
    indexer.n_heads, indexer.head_dim = N_HEADS, HEAD_DIM
    indexer.softmax_scale = HEAD_DIM**-0.5
    return indexer


def _backend(name: str, device):
    from sglang.srt.lora.backend.base_backend import BaseLoRABackend
    from sglang.srt.lora.backend.chunked_backend import ChunkedSgmvLoRABackend
    from sglang.srt.lora.backend.triton_backend import TritonLoRABackend

    if name == "triton":
        return TritonLoRABackend(MAX_LORAS, device)
    _fresh_csgmv_shrink_kernel()
    # ChunkedSgmvLoRABackend.__init__ reads max_lora_chunk_size from the
    # published server config; its default (16), without publishing one.
    backend = ChunkedSgmvLoRABackend.__new__(ChunkedSgmvLoRABackend)
    BaseLoRABackend.__init__(backend, MAX_LORAS, device)
    backend.max_chunk_size = 16
    return backend


def _fresh_csgmv_shrink_kernel():
    """Drop the compiled csgmv shrink kernels, as a new server process would.

    sglang keeps one compiled _chunked_lora_shrink_kernel per (K, NUM_SLICES,
    BLOCK_M) (its cached_triton_kernel key, chunked_sgmv_shrink.py), although N
    (num_slices x the pool's max rank) is a constexpr of the kernel too. A server
    has one max rank; this benchmark has two, and without this the rank-64 pool
    would run the kernel compiled for rank 16 (its adapter delta is lost)."""
    from sglang.kernels.ops.lora.dense import chunked_sgmv_shrink

    kernel = chunked_sgmv_shrink._chunked_lora_shrink_kernel
    if hasattr(kernel, "_clear_cache"):  # sglang's CachedKernel (CUDA)
        kernel._clear_cache()


def _lora_buffers(rank: int, device, gen):
    """Memory-pool buffers: slot 0 without adapter (zeros), slot 1 the adapter."""
    a = torch.zeros(MAX_LORAS, rank, HIDDEN, dtype=torch.bfloat16, device=device)
    b = torch.zeros(MAX_LORAS, N_HEADS, rank, dtype=torch.bfloat16, device=device)
    a[1] = torch.randn(rank, HIDDEN, generator=gen, device=device) / HIDDEN**0.5
    b[1] = torch.randn(N_HEADS, rank, generator=gen, device=device) * 0.1
    return a, b


def _lora_layer(base, backend_name: str, rank: int, device, gen):
    from sglang.srt.lora.layers import ReplicatedLinearWithLoRA

    layer = ReplicatedLinearWithLoRA(base, _backend(backend_name, device))
    layer.set_lora_info(*_lora_buffers(rank, device, gen))
    layer.lora_backend.init_prefill_cuda_graph_batch_info(
        max(TOKENS), max_num_requests=max(TOKENS) // TOKENS_PER_REQUEST + 4
    )
    return layer


def _requests(tokens: int):
    n = max(1, tokens // TOKENS_PER_REQUEST)
    return [tokens // n] * n


def _prepare(layer, lens, slots, rank: int, device):
    """The LoRA manager's per-batch step: the backend's prepare_lora_batch into
    the static prefill-graph batch info (what a breakable replay reads)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend = layer.lora_backend
    backend.prepare_lora_batch(
        SimpleNamespace(
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(lens),
            extend_seq_lens_cpu=list(lens),
            extend_seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
            extend_num_tokens=sum(lens),
            spec_info=None,
            return_logprob=False,
        ),
        list(slots),
        [0, rank],
        [0.0, SCALING],
        use_cuda_graph=False,
        use_prefill_cuda_graph=True,
    )
    backend.batch_info.has_active_lora = any(slots)


def _median_ms(fn, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _pct(value: float, reference: float) -> float:
    return round(100.0 * (value - reference) / reference, 2)


class SplitOpCore:
    """The split op's main kernels for ``tokens`` prompt tokens, around a head
    gate: wq_b and wk (bf16 GEMMs), act_quant of q and k (sglang's Triton
    kernel), the gate, DeepGEMM's fp8 MQA logits over the prompt (causal)."""

    def __init__(self, tokens: int, device, gen):
        from sglang.kernels.ops.quantization.act_quant_triton import act_quant

        self.act_quant = act_quant
        self.q_lora = torch.randn(
            tokens, Q_LORA_RANK, generator=gen, device=device
        ).bfloat16()
        self.wq_b = (
            0.02
            * torch.randn(N_HEADS * HEAD_DIM, Q_LORA_RANK, generator=gen, device=device)
        ).bfloat16()
        self.wk = (
            0.02 * torch.randn(HEAD_DIM, HIDDEN, generator=gen, device=device)
        ).bfloat16()
        self.ks = torch.zeros(tokens, dtype=torch.int32, device=device)
        self.ke = torch.arange(1, tokens + 1, dtype=torch.int32, device=device)
        self.mqa_logits, self.mqa_logits_error = None, None
        try:
            from sglang.srt.layers.attention.dsa.utils import resolve_fp8_mqa_logits_fn

            self.mqa_logits = resolve_fp8_mqa_logits_fn()
        except Exception as exc:  # noqa: BLE001 (no DeepGEMM: time the core without it)
            self.mqa_logits_error = repr(exc)[:300]

    def __call__(self, x, gate):
        tokens = x.shape[0]
        query = torch.nn.functional.linear(self.q_lora, self.wq_b)
        key = torch.nn.functional.linear(x, self.wk)
        q_fp8, q_scale = self.act_quant(
            query.view(tokens, N_HEADS, HEAD_DIM), 128, "ue8m0"
        )
        k_fp8, k_scale = self.act_quant(key, 128, "ue8m0")
        weights = gate(x, q_scale)
        if self.mqa_logits is not None:
            try:
                self.mqa_logits(
                    q_fp8,
                    (k_fp8, k_scale.view(torch.float32).squeeze(-1)),
                    weights.squeeze(-1),
                    self.ks,
                    self.ke,
                    clean_logits=False,
                )
            except Exception as exc:  # noqa: BLE001 (recorded in the results)
                self.mqa_logits, self.mqa_logits_error = None, repr(exc)[:300]
        return weights


def _fused_estimate(x, weight_and_a, lora_b):
    """One fp32 GEMM of x with [W; A] (a fused base + shrink reads x once) and the
    expand, for a batch with one adapter: a lower bound for a fused kernel."""
    out = torch.mm(x, weight_and_a.t(), out_dtype=torch.float32)
    base, xa = out[:, :N_HEADS], out[:, N_HEADS:]
    return base + SCALING * (xa.bfloat16() @ lora_b.t()).float()


def _check(plain, lora_indexer, device, gen) -> dict:
    """2048 tokens, 4 requests, every other with the adapter."""
    layer, base = lora_indexer.weights_proj, plain.weights_proj
    lens, slots = [512] * 4, [1, 0, 1, 0]
    rank = layer.lora_a.shape[1]
    _prepare(layer, lens, slots, rank, device)
    x = torch.randn(sum(lens), HIDDEN, generator=gen, device=device).bfloat16()
    q_scale = torch.rand(sum(lens), N_HEADS, 1, generator=gen, device=device) + 0.5
    gate = lora_indexer._get_logits_head_gate(x, q_scale)
    no_lora = plain._get_logits_head_gate(x, q_scale)
    rows = torch.arange(sum(lens), device=device)
    adapter = (rows // 512) % 2 == 0
    a, b = layer.lora_a[1].float(), layer.lora_b[1].float()
    logits = x.float() @ base.weight.float().t()
    logits[adapter] += SCALING * (x[adapter].float() @ a.t()) @ b.t()
    reference = (logits * N_HEADS**-0.5).unsqueeze(-1) * q_scale * HEAD_DIM**-0.5
    scale = reference[adapter].abs().max()
    return {
        "backend": type(layer.lora_backend).__name__,
        "rank": rank,
        "adapter_rows_max_rel_error": float(
            (gate[adapter] - reference[adapter]).abs().max() / scale
        ),
        "rows_without_adapter_bit_identical": bool(
            torch.equal(gate[~adapter], no_lora[~adapter])
        ),
        # How far the gate without the adapter is: what the check tells apart.
        "bare_gate_rel_distance": float(
            (no_lora[adapter] - reference[adapter]).abs().max() / scale
        ),
    }


def run(tokens_list, backends, iters: int, warmup: int, device="cuda") -> dict:
    import sglang_graphfix
    from sglang.srt.layers.linear import ReplicatedLinear

    sglang_graphfix.register()  # the patched Indexer._get_logits_head_gate
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.device(device):
        base = ReplicatedLinear(
            HIDDEN, N_HEADS, bias=False, params_dtype=torch.bfloat16
        )
    with torch.no_grad():
        base.weight.normal_(0.0, 0.02, generator=gen)
    plain = _indexer(base)
    lora_indexer = _indexer(base)
    results, checks = [], []
    for backend_name in backends:
        for rank in RANKS:
            layer = _lora_layer(base, backend_name, rank, device, gen)
            lora_indexer.weights_proj = layer
            weight_and_a = torch.cat([base.weight, layer.lora_a[1]])
            checks.append(_check(plain, lora_indexer, device, gen))
            for tokens in tokens_list:
                lens = _requests(tokens)
                x = torch.randn(tokens, HIDDEN, generator=gen, device=device).bfloat16()
                q_scale = (
                    torch.rand(tokens, N_HEADS, 1, generator=gen, device=device) + 0.5
                )
                core = SplitOpCore(tokens, device, gen)
                plain_gate = partial(plain._get_logits_head_gate, x, q_scale)
                lora_gate = partial(lora_indexer._get_logits_head_gate, x, q_scale)
                gate_ms = {"no_lora": _median_ms(plain_gate, iters, warmup)}
                core_ms = {
                    "no_lora": _median_ms(
                        partial(core, x, plain._get_logits_head_gate), iters, warmup
                    )
                }
                _prepare(layer, lens, [0] * len(lens), rank, device)
                gate_ms["lora_no_adapter"] = _median_ms(lora_gate, iters, warmup)
                _prepare(layer, lens, [1] * len(lens), rank, device)
                gate_ms["lora_adapter"] = _median_ms(lora_gate, iters, warmup)
                core_ms["lora_adapter"] = _median_ms(
                    partial(core, x, lora_indexer._get_logits_head_gate), iters, warmup
                )
                fused_ms = _median_ms(
                    partial(_fused_estimate, x, weight_and_a, layer.lora_b[1]),
                    iters,
                    warmup,
                )
                results.append(
                    {
                        "backend": backend_name,
                        "rank": rank,
                        "tokens": tokens,
                        "requests": len(lens),
                        "gate_ms": {k: round(v, 4) for k, v in gate_ms.items()},
                        "gate_overhead_pct": {
                            k: _pct(gate_ms[k], gate_ms["no_lora"])
                            for k in ("lora_adapter", "lora_no_adapter")
                        },
                        "split_op_core_ms": {
                            k: round(v, 4) for k, v in core_ms.items()
                        },
                        "split_op_core_overhead_pct": _pct(
                            core_ms["lora_adapter"], core_ms["no_lora"]
                        ),
                        # The extra gate time against the core without LoRA.
                        "gate_delta_vs_core_pct": {
                            k: _pct(
                                core_ms["no_lora"] + gate_ms[k] - gate_ms["no_lora"],
                                core_ms["no_lora"],
                            )
                            for k in ("lora_adapter", "lora_no_adapter")
                        },
                        "fused_estimate_gate_ms": round(fused_ms, 4),
                        "fused_estimate_overhead_vs_core_pct": _pct(
                            core_ms["no_lora"] + fused_ms - gate_ms["no_lora"],
                            core_ms["no_lora"],
                        ),
                        "mqa_logits_in_core": core.mqa_logits is not None,
                        "mqa_logits_error": core.mqa_logits_error,
                    }
                )
                print(json.dumps(results[-1]), flush=True)
    worst = max(r["split_op_core_overhead_pct"] for r in results)
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shapes": {
            "hidden": HIDDEN,
            "index_heads": N_HEADS,
            "index_head_dim": HEAD_DIM,
            "q_lora_rank": Q_LORA_RANK,
            "ranks": list(RANKS),
            "tokens": list(tokens_list),
            "tokens_per_request": TOKENS_PER_REQUEST,
        },
        "timing": f"CUDA events per call, median of {iters} after {warmup} warm-up calls",
        "goal_pct": GOAL_PCT,
        "summary": {
            "worst_split_op_core_overhead_pct": worst,
            "worst_gate_delta_vs_core_pct": max(
                r["gate_delta_vs_core_pct"]["lora_adapter"] for r in results
            ),
            "worst_no_adapter_gate_delta_vs_core_pct": max(
                r["gate_delta_vs_core_pct"]["lora_no_adapter"] for r in results
            ),
            "worst_fused_estimate_overhead_vs_core_pct": max(
                r["fused_estimate_overhead_vs_core_pct"] for r in results
            ),
            "meets_goal": worst <= GOAL_PCT,
            "checks_pass": all(
                c["rows_without_adapter_bit_identical"]
                and c["adapter_rows_max_rel_error"] < 2e-2
                for c in checks
            ),
        },
        "results": results,
        "checks": checks,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="512 and 8192 tokens, 20 iterations"
    )
    parser.add_argument("--backends", default="triton,csgmv")
    args = parser.parse_args()
    tokens = QUICK_TOKENS if args.quick else TOKENS
    iters, warmup = (20, 5) if args.quick else (100, 10)
    report = run(tokens, args.backends.split(","), iters, warmup)
    report["mode"] = "quick" if args.quick else "full"
    out = (
        Path(os.environ["OUT"])
        if os.environ.get("OUT")
        else ROOT / "benchmark" / "results"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {out / RESULT}")


if __name__ == "__main__":
    main()
