"""Runs test/linear_prefill_table_cases.py's random batches through the Triton
table-fill kernel in Triton's CPU interpreter and prints one JSON line per case:
the fields where it differs from sglang's host fill. A script, not a test:
TRITON_INTERPRET must be set before triton is first imported
(test_linear_prefill_tables.py runs it in a subprocess)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

# sglang's host fill pins its staging block; pinning needs a CUDA driver.
torch.Tensor.pin_memory = lambda self, *args, **kwargs: self

import linear_prefill_table_cases as cases  # noqa: E402

from sglang_graphfix_kernel import linear_prefill_tables  # noqa: E402

if __name__ == "__main__":
    assert linear_prefill_tables._interpreting()  # the kernel, not the torch steps
    seeds = [int(a) for a in sys.argv[1:]] or range(int(os.environ.get("CASES", 60)))
    batches = [cases.make_case(seed) for seed in seeds]
    batches += [cases.capture_case(b, s) for b, s in ((16, 4), (256, 1), (8, 32))]
    for case in batches:
        print(
            json.dumps(
                {
                    "seed": case["seed"],
                    "bucket": case["bucket"],
                    "requests": len(case["lens"]),
                    "slots": case["slots"],
                    "tracked": case["mask"] is not None,
                    "mismatches": cases.mismatches(case),
                }
            ),
            flush=True,
        )
