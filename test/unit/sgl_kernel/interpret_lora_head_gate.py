"""Runs test/lora_head_gate_cases.py's cases in Triton's CPU interpreter and
prints one JSON line per case. A script, not a test: TRITON_INTERPRET must be set
before triton is first imported (test_lora_head_gate.py runs it in a subprocess).

The interpreter's bf16 tl.dot is wrong on CPU (Triton 3.8), so activations and
LoRA buffers are fp16 here; bf16 at DeepSeek-V3.2 shapes runs on the GPU
(test/gpu/test_lora_head_gate_kernel.py)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

# Imports sglang_graphfix_kernel and test/lora_head_gate_cases.py: run it with
# PYTHONPATH=sgl-kernel/python:test (test/triton_interpreter.py does).


def _unpinned(factory):
    def unpinned(*args, pin_memory=False, **kwargs):
        return factory(*args, **kwargs)  # pinning needs a CUDA driver

    return unpinned


for _name in ("tensor", "zeros", "empty", "arange"):
    setattr(torch, _name, _unpinned(getattr(torch, _name)))

from lora_head_gate_cases import CASES, VARIANTS, run  # noqa: E402

if __name__ == "__main__":
    # K=1100: several K tiles and a tail.
    for name in sys.argv[1:] or CASES:
        for variant, kwargs in VARIANTS.items():
            result = run(**CASES[name], k=1100, **kwargs)
            print(json.dumps({"case": f"{name}-{variant}", **result}), flush=True)
