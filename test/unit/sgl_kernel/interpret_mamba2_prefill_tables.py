"""Runs test/mamba2_prefill_graph_cases.py's random batches through the Mamba2
table-fill kernel (sglang_graphfix_kernel.mamba2_prefill_tables) in Triton's CPU
interpreter and prints one JSON line per case: the tables where it differs from
the torch fill (Mamba2PrefillGraphTables.fill, Mamba2PrefillTrackTables.fill),
itself checked against sglang's eager builders by test_mamba2_prefill_graph.py.
A script, not a test: TRITON_INTERPRET must be set before triton is first
imported (test_mamba2_prefill_tables.py runs it in a subprocess)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402

from mamba2_prefill_graph_cases import table_fill_cases  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from sglang_graphfix_kernel import mamba2_prefill_tables  # noqa: E402

if __name__ == "__main__":
    kernel = mamba2_prefill_tables._fill_mamba2_prefill_tables
    assert isinstance(kernel, InterpretedFunction)  # the kernel, interpreted
    seeds = [int(a) for a in sys.argv[1:]] or range(int(os.environ.get("CASES", 40)))
    for result in table_fill_cases(seeds, device="cpu"):
        print(json.dumps(result), flush=True)
