"""Runs test/mamba2_backend_cases.py's comparison (Mamba2AttnBackend.forward ->
MambaMixer2.forward, eager vs as the full prefill graph runs it) with sglang's
Triton kernels in the CPU interpreter, and prints one JSON line per case. A
script, not a test: TRITON_INTERPRET must be set before triton is first imported
(test_mamba2_prefill_graph.py runs it in a subprocess)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import contextlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

# The SSD wrappers enter the tensors' device context; torch.cpu has none.
torch.cpu.device = lambda index=None: contextlib.nullcontext()

from triton.runtime.autotuner import Autotuner  # noqa: E402

import sglang_graphfix  # noqa: E402
from sglang.kernels.ops.mamba import causal_conv1d_triton  # noqa: E402
from sglang.kernels.ops.mamba.triton_ops import (  # noqa: E402
    ssd_bmm,
    ssd_chunk_scan,
    ssd_chunk_state,
    ssd_state_passing,
)
from sglang.srt.layers.attention.mamba import causal_conv1d, mamba  # noqa: E402

sglang_graphfix.register()

from mamba2_backend_cases import MUTATIONS, run_case  # noqa: E402

# Autotuning benchmarks on a GPU: the interpreter runs each kernel's first config.
for module in (ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_state_passing):
    for kernel in vars(module).values():
        if isinstance(kernel, Autotuner):
            kernel.configs = kernel.configs[:1]

# mamba.py binds its conv entry points only on CUDA (is_cuda()): bind them as on
# a GPU (the extend takes the Triton kernel there too, for a transposed input
# with seq_lens_cpu; causal_conv1d_fn picks it off CUDA anyway).
mamba.causal_conv1d_fn_triton = causal_conv1d_triton.causal_conv1d_fn
mamba.causal_conv1d_fn = causal_conv1d.causal_conv1d_fn

if __name__ == "__main__":
    seeds = [int(a) for a in sys.argv[1:]] or range(int(os.environ.get("CASES", 12)))
    runs = [(seed, "") for seed in seeds]
    if os.environ.get("MUTATE", "1") == "1":
        runs += [(seed, m) for m, seed in MUTATIONS.items()]
    for seed, mutate in runs:
        print(json.dumps(run_case(seed, mutate)), flush=True)
