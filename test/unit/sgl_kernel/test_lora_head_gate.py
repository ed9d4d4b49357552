"""sgl-kernel's fused LoRA head-gate delta (shrink, expand, scaling, add into the
fp32 base) in Triton's CPU interpreter, on batch info from sglang's own csgmv and
Triton LoRA backends (eager and prefill-graph buffers, two adapters of different ranks, requests without one, graph padding rows),
against the fp32 reference x Wᵀ + s·(x Aᵀ) Bᵀ: the delta into a given base
(K split or not) and the whole gate
(base and delta from one read of x)."""

from pathlib import Path

import pytest
from lora_head_gate_cases import VARIANTS
from triton_interpreter import run_interpreted

SCRIPT = Path(__file__).with_name("interpret_lora_head_gate.py")


@pytest.fixture(scope="module")
def results():
    return {r["case"]: r for r in run_interpreted(SCRIPT, timeout=300)}


def test_every_case_ran(results):
    assert len(results) == 8 * len(VARIANTS)
    assert {n.split("-")[0] for n in results} == {"triton", "csgmv"}
    # Per request on both backends (csgmv's own segments are 16-token chunks).
    assert {r["requests"] for r in results.values()} == {5}


@pytest.mark.parametrize(
    "case",
    [
        f"{backend}-{mode}-rank{rank}-{variant}"
        for backend in ("triton", "csgmv")
        for mode in ("eager", "graph")
        for rank in (16, 64)
        for variant in VARIANTS
    ],
)
def test_gate_matches_the_fp32_reference(results, case):
    r = results[case]
    assert r["adapter_rows"] == 58
    # fp16 inputs, x Aᵀ rounded to fp16 in both: only summation order differs.
    assert r["adapter_rows_max_rel_error"] < 1e-3
    if "-full-" in case:
        # The whole gate: rows without an adapter and graph padding get x Wᵀ
        # (from this kernel, so equal up to fp32 summation order).
        assert r["other_rows_max_rel_error"] < 1e-5
    else:
        # The delta: rows without an adapter (and padding) are never written.
        assert r["other_rows_bit_identical"]
    # The same output against swapped adapters: the comparison can fail.
    assert r["swapped_adapters_max_rel_error"] > 0.1


def test_batch_invariant_tiles_give_a_request_the_same_delta_in_any_batch():
    """--enable-deterministic-inference: with BATCH_INVARIANT_DELTA_TILES a
    request's delta is bit-identical alone and beside 1000 or 5000 other tokens
    (after them too, from a row that is no multiple of 16), on both dense LoRA
    backends' batch info;
    the default tiles (split K and the K tile follow the token count) are not:
    the control that shows the comparison can fail."""
    rows = run_interpreted(
        Path(__file__).with_name("interpret_lora_head_gate_batch_invariance.py"),
        timeout=300,
    )
    for backend in ("triton", "csgmv"):
        invariant = [
            r
            for r in rows
            if (r["backend"], r["tiles"]) == (backend, "batch_invariant")
        ]
        default = [
            r for r in rows if (r["backend"], r["tiles"]) == (backend, "default")
        ]
        assert [(r["other_tokens"], r["request_first"]) for r in invariant] == [
            (0, True), (1000, True), (5000, True), (1000, False),
        ]  # fmt: skip
        assert all(r["equal_to_alone"] for r in invariant), invariant
        assert not all(r["equal_to_alone"] for r in default), default
