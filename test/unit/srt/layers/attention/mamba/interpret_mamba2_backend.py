"""Runs test/mamba2_backend_cases.py's comparison (Mamba2AttnBackend.forward ->
MambaMixer2.forward, eager vs as the full prefill graph runs it) with sglang's
Triton kernels in the CPU interpreter, and prints one JSON line per case (also
with MAMBA2_SNAPSHOT_KERNEL on, for SNAPSHOT_KERNEL_SEEDS). A
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


def with_snapshot_kernel(seed):
    """Case ``seed`` with MAMBA2_SNAPSHOT_KERNEL on, counting the snapshot
    kernel's launches (in the interpreter: the kernel, not its torch path)."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability
    from sglang_graphfix_kernel import masked_state_rows

    assert masked_state_rows._interpreting()
    kernel, launches = masked_state_rows._snapshot_state_rows, []

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    capability.MAMBA2_SNAPSHOT_KERNEL, masked_state_rows._snapshot_state_rows = (
        True,
        Counted(),
    )
    try:
        result = run_case(seed)
    finally:
        capability.MAMBA2_SNAPSHOT_KERNEL = False
        masked_state_rows._snapshot_state_rows = kernel
    return {**result, "snapshot_kernel_launches": len(launches)}


if __name__ == "__main__":
    seeds = [int(a) for a in sys.argv[1:]] or range(int(os.environ.get("CASES", 12)))
    runs = [(seed, "") for seed in seeds]
    if os.environ.get("MUTATE", "1") == "1":
        runs += [(seed, m) for m, seed in MUTATIONS.items()]
    for seed, mutate in runs:
        print(json.dumps(run_case(seed, mutate)), flush=True)
    # MAMBA2_SNAPSHOT_KERNEL's seeds (comma-separated), after the others.
    for seed in filter(None, os.environ.get("SNAPSHOT_KERNEL_SEEDS", "").split(",")):
        print(json.dumps(with_snapshot_kernel(int(seed))), flush=True)
