"""sgl-kernel's masked state-row gather / scatter compiled on the GPU, on the CPU
test's random tables (test/masked_state_rows_cases.py): real rows equal the
torch reference bit for bit (bf16 pools rounded to nearest even, as torch
rounds), padding rows are neither read nor written, the padding slot stays
zero."""

import masked_state_rows_cases as cases
import pytest


@pytest.mark.parametrize("seed", range(60))
def test_kernel_copies_only_the_real_rows(seed):
    assert cases.mismatches(cases.make_case(seed, device="cuda")) == []


@pytest.mark.parametrize("seed", range(60))
def test_snapshot_kernel_writes_each_tracked_row_from_its_source(seed):
    """snapshot_state_rows (MAMBA2_SNAPSHOT_KERNEL), compiled: each tracked
    row's state from its mode's source, bit for bit; fillers write nothing."""
    case = cases.make_snapshot_case(seed, device="cuda")
    assert cases.snapshot_mismatches(case) == []
