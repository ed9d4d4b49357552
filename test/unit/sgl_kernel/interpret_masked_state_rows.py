"""Runs test/masked_state_rows_cases.py's random tables through sgl-kernel's
masked state-row gather and scatter, and its snapshot of track rows
(make_snapshot_case), in Triton's CPU interpreter and prints one JSON line per
case and op: what differs from the torch reference. A script, not a
test: TRITON_INTERPRET must be set before triton is first imported
(test_masked_state_rows.py runs it in a subprocess)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402

import masked_state_rows_cases as cases  # noqa: E402

from sglang_graphfix_kernel import masked_state_rows  # noqa: E402

if __name__ == "__main__":
    assert masked_state_rows._interpreting()  # the kernel, not the torch ops
    seeds = [int(a) for a in sys.argv[1:]] or range(int(os.environ.get("CASES", 30)))
    for seed in seeds:
        case = cases.make_case(seed)
        row = {k: case[k] for k in ("seed", "rows", "real", "strided")}
        row["dtype"] = str(case["pool"].dtype)
        print(
            json.dumps({**row, "mismatches": cases.mismatches(case, interpreted=True)}),
            flush=True,
        )
        case = cases.make_snapshot_case(seed)
        row = {k: case[k] for k in ("seed", "rows", "modes", "strided")}
        row["dtype"] = str(case["pool"].dtype)
        bad = cases.snapshot_mismatches(case, interpreted=True)
        print(json.dumps({**row, "snapshot": True, "mismatches": bad}), flush=True)
