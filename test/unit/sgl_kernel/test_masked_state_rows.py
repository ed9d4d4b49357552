"""sgl-kernel's masked state-row gather / scatter (the per-request GDN states
of a captured FlashInfer prefill) in Triton's CPU interpreter, and its torch
path off CUDA, on random tables padded with slot -1 at random rows: real rows
equal the torch reference, padding rows are neither read into the rows nor
written to the pool, the reserved padding slot stays zero."""

from pathlib import Path

import masked_state_rows_cases as cases
import pytest
from triton_interpreter import run_interpreted

SCRIPT = Path(__file__).with_name("interpret_masked_state_rows.py")
CASES = 30


@pytest.fixture(scope="module")
def results():
    return run_interpreted(SCRIPT, timeout=300, CASES=str(CASES))


def test_the_cases_cover_padding_dtypes_and_strides(results):
    assert len(results) == CASES
    assert any(r["real"] == 0 for r in results)  # every row padding
    assert any(r["real"] == r["rows"] > 1 for r in results)  # no padding
    assert any(0 < r["real"] < r["rows"] for r in results)
    assert {r["dtype"] for r in results} == {"torch.float32", "torch.bfloat16"}
    assert any(r["strided"] for r in results) and not all(r["strided"] for r in results)


def test_kernel_copies_only_the_real_rows(results):
    bad = [r for r in results if r["mismatches"]]
    assert not bad, bad


@pytest.mark.parametrize("seed", range(CASES))
def test_torch_path_copies_only_the_real_rows(seed):
    assert cases.mismatches(cases.make_case(seed)) == []
