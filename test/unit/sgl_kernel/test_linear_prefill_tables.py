"""sgl-kernel's linear prefill-graph table fill (one Triton program) in Triton's
CPU interpreter, on random batches padded as the full prefill runner pads a
replay (zero-length request slots, pool row 0's slot), with cached prefixes
(radix hits), prefix-cache snapshots and the capture batch: every table equals
sglang's host fill (KDAPrefillGraphMetadata.fill + build_track_rows)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("interpret_linear_prefill_tables.py")
CASES = 40


@pytest.fixture(scope="module")
def results():
    # TRITON_INTERPRET must be set before triton is imported: a fresh process.
    env = {**os.environ, "TRITON_INTERPRET": "1", "CASES": str(CASES)}
    run = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_the_cases_cover_padding_prefixes_and_snapshots(results):
    assert len(results) == CASES + 3
    assert any(r["tracked"] for r in results) and not all(r["tracked"] for r in results)
    assert any(r["requests"] < r["slots"] for r in results)  # padded request slots
    assert any(r["requests"] == r["slots"] > 1 for r in results)
    assert max(r["requests"] for r in results) >= 16


def test_kernel_tables_equal_sglangs_host_fill(results):
    bad = [r for r in results if r["mismatches"]]
    assert not bad, bad
