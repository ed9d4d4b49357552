"""benchmark/dsa_head_gate.py's own setup, checks, timing rounds and verdict,
on CPU with the DSA stand-ins.
"""

import pytest
import torch
from benchmark_modules import load_benchmark
from dsa_indexer_lora_cases import (
    FULL_GATE_CALLS,
    FUSED_DELTA_CALLS,
    MERGED_GEMM_CALLS,
    cpu_stand_ins,  # noqa: F401  (autouse)
)

from sglang.srt.layers.linear import ReplicatedLinear


def _benchmark():
    return load_benchmark("dsa_head_gate", "dsa_head_gate_benchmark")


def _benchmark_setup(bench, backend, ranks):
    """The benchmark's weights_proj, plain and LoRA Indexers, on CPU."""
    gen = torch.Generator().manual_seed(0)
    base = ReplicatedLinear(
        bench.HIDDEN, bench.N_HEADS, bias=False, params_dtype=torch.bfloat16
    )
    with torch.no_grad():
        base.weight.normal_(0.0, 0.02, generator=gen)
    plain, lora_indexer = bench._indexer(base), bench._indexer(base)
    for rank in ranks:
        lora_indexer.weights_proj = bench._lora_layer(
            base, backend, rank, torch.device("cpu"), gen
        )
        yield rank, plain, lora_indexer, gen


@pytest.mark.parametrize(
    "fresh_kernel", [True, False], ids=["as_is", "no_fresh_kernel"]
)
def test_benchmark_checks_csgmv_rank16_then_rank64(monkeypatch, fresh_kernel):
    """benchmark/dsa_head_gate.py's own setup and check (DeepSeek-V3.2 shapes,
    2048 tokens) for csgmv rank 16 then 64 in one process, as it runs them on the
    GPU: every check passes. Without its fresh shrink kernel per backend the
    rank-64 unfused reference (sglang's shrink) fails as it did on the H200; the
    fused gate does not use that kernel and passes either way."""
    bench = _benchmark()
    if not fresh_kernel:
        monkeypatch.setattr(bench, "_fresh_csgmv_shrink_kernel", lambda: None)
    passed = {}
    for rank, plain, lora_indexer, gen in _benchmark_setup(bench, "csgmv", bench.RANKS):
        check = bench._check(plain, lora_indexer, torch.device("cpu"), gen)
        assert check["rank"] == rank
        assert check["has_active_lora"] == {
            "mixed_batch": True,
            "no_adapter_batch": False,
        }
        assert check["lora_adapter"]["ok"]
        assert check["lora_adapter"]["launches"] == {"merged": 1, "delta": 0, "full": 0}
        assert check["lora_adapter_whole_gate"]["ok"]
        assert check["lora_adapter_whole_gate"]["launches"] == {
            "merged": 0, "delta": 0, "full": 1
        }  # fmt: skip
        assert check["mixed_batch"]["ok"]
        assert check["mixed_batch"]["launches"] == {"merged": 0, "delta": 1, "full": 0}
        assert check["lora_no_adapter"] == {
            "bit_identical_to_no_lora": True,
            "launches": {"merged": 0, "delta": 0, "full": 0},
        }
        assert check["unfused_reference"]["rows_without_adapter_bit_identical"]
        passed[rank] = check["pass"]

    assert passed == {16: True, 64: fresh_kernel}


def test_benchmark_checks_triton_backend():
    bench = _benchmark()
    for rank, plain, lora_indexer, gen in _benchmark_setup(
        bench, "triton", bench.RANKS
    ):
        check = bench._check(plain, lora_indexer, torch.device("cpu"), gen)
        assert check["pass"], check


class _StateTimer:
    """Stands in for the benchmark's CUDA-event Timer: each "time" it reports is
    the state the call ran in: latency = launches of the delta kernel + 10 x
    launches of the whole-gate kernel + 100 x merged-weight GEMMs during the
    call, throughput = 1 + the batch's has_active_lora."""

    def __init__(self, layer):
        self.layer = layer

    @staticmethod
    def _launches():
        return (
            len(FUSED_DELTA_CALLS)
            + 10 * len(FULL_GATE_CALLS)
            + 100 * len(MERGED_GEMM_CALLS)
        )

    def _call(self, fn):
        launches = self._launches()
        fn()
        return self._launches() - launches

    def host_ms(self, fn):
        fn()
        return 0.0

    def latency(self, fn, n):
        return [float(self._call(fn)) for _ in range(n)]

    def throughput(self, fn, lead_ms):
        self._call(fn)
        return 1.0 + self.layer.lora_backend.batch_info.has_active_lora, False


@pytest.mark.parametrize("backend", ["csgmv", "triton"])
def test_benchmark_times_each_variant_in_its_batch_state(backend):
    """The benchmark's interleaved rounds prepare each variant's batch (what the
    LoRA manager sets, has_active_lora included) and the split op's lora_ids
    before timing it: the adapter gate runs the merged-weight GEMM, the same
    batch named as on two adapters the whole-gate kernel, on the mixed-batch
    path the delta kernel, the batch without adapters
    and the unfused reference neither; the split-op core runs the same gates."""
    bench = _benchmark()
    ((rank, plain, lora_indexer, gen),) = _benchmark_setup(bench, backend, [16])
    tokens, device = 32, torch.device("cpu")
    x = torch.randn(tokens, bench.HIDDEN, generator=gen).bfloat16()
    q_scale = torch.rand(tokens, bench.N_HEADS, 1, generator=gen) + 0.5
    core = bench.SplitOpCore(tokens, device, gen)
    variants = bench._variants(plain, lora_indexer, [16, 16], rank, x, q_scale, core)

    measured = bench._measure(
        _StateTimer(lora_indexer.weights_proj),
        variants,
        rounds=2,
        per_round=1,
        warmup=1,
    )

    state = {key: (m["latency_ms"], m["throughput_ms"]) for key, m in measured.items()}
    for part in bench.PARTS:
        assert state[(part, "lora_adapter")] == (100.0, 2.0)
        assert state[(part, "lora_adapter_whole_gate")] == (10.0, 2.0)
        assert state[(part, "lora_adapter_gemm_plus_delta")] == (1.0, 2.0)
        assert state[(part, "lora_no_adapter")] == (0.0, 1.0)
        assert state[(part, "unfused_reference")] == (0.0, 2.0)
        assert state[(part, "no_lora")][0] == 0.0


def test_benchmark_goal_is_the_adapter_split_op_cores_gpu_bound_overhead():
    """meets_goal reads split_op_core throughput of lora_adapter only; the
    latency-based verdict and the gate alone are reported beside it."""
    bench = _benchmark()

    def part(throughput, latency):
        others = dict.fromkeys(
            (
                "lora_adapter_whole_gate",
                "lora_adapter_gemm_plus_delta",
                "lora_no_adapter",
                "unfused_reference",
            ),
            0.0,
        )
        return {
            "throughput_overhead_pct": {**others, "lora_adapter": throughput},
            "latency_overhead_pct": {**others, "lora_adapter": latency},
            "throughput_host_bound_rounds": {"no_lora": 1},
        }

    results = [
        {"gate": part(50.0, 80.0), "split_op_core": part(4.0, 12.0)},
        {"gate": part(1.0, 1.0), "split_op_core": part(-1.0, 1.0)},
    ]
    verdict = bench.summary(results, [{"pass": True}])
    assert verdict["meets_goal"] and not verdict["meets_goal_on_latency"]
    assert verdict["worst_split_op_core_latency_overhead_pct_lora_adapter"] == 12.0
    assert verdict["worst_gate_throughput_overhead_pct"]["lora_adapter"] == 50.0
    assert verdict["throughput_host_bound_rounds"] == 4
    assert verdict["checks_pass"]

    results[1]["split_op_core"] = part(6.0, 1.0)
    assert not bench.summary(results, [{"pass": False}])["meets_goal"]
    assert not bench.summary(results, [{"pass": False}])["checks_pass"]
