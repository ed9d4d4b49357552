"""sgl-kernel's linear prefill-graph table fill (one Triton program) in Triton's
CPU interpreter, on random batches padded as the full prefill runner pads a
replay (zero-length request slots, pool row 0's slot), with cached prefixes
(radix hits), prefix-cache snapshots and the capture batch: every table equals
sglang's host fill (KDAPrefillGraphMetadata.fill + build_track_rows)."""

from pathlib import Path

import pytest
from triton_interpreter import run_interpreted

SCRIPT = Path(__file__).with_name("interpret_linear_prefill_tables.py")
CASES = 40


@pytest.fixture(scope="module")
def results():
    return run_interpreted(SCRIPT, timeout=600, CASES=str(CASES))


def test_the_cases_cover_padding_prefixes_and_snapshots(results):
    assert len(results) == CASES + 3
    assert any(r["tracked"] for r in results) and not all(r["tracked"] for r in results)
    assert any(r["requests"] < r["slots"] for r in results)  # padded request slots
    assert any(r["requests"] == r["slots"] > 1 for r in results)
    assert max(r["requests"] for r in results) >= 16


def test_kernel_tables_equal_sglangs_host_fill(results):
    bad = [r for r in results if r["mismatches"]]
    assert not bad, bad
