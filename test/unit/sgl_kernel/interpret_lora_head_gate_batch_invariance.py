"""sgl-kernel's LoRA head-gate delta in Triton's CPU interpreter: one request's
rows alone and then beside other requests of 1000 and 5000 tokens (a base-only
request, as a batch mixing requests with and without an adapter has), with the
tiles --enable-deterministic-inference takes (BATCH_INVARIANT_DELTA_TILES) and
with the default tiles, which follow the batch's tokens. Prints one JSON line
per tile choice and batch. A script: TRITON_INTERPRET must be set before triton
is imported (test_lora_head_gate.py runs it in a subprocess); fp16, as
interpret_lora_head_gate.py says why."""

import json

# Its import sets TRITON_INTERPRET and unpins torch's factories (no CUDA driver)
# before triton is imported, as its own cases need.
import interpret_lora_head_gate  # noqa: F401
import torch
from lora_head_gate_cases import prepare

from sglang_graphfix_kernel.lora_head_gate import (
    BATCH_INVARIANT_DELTA_TILES,
    add_lora_head_gate_delta_,
)

K, N, RANK, ROWS = 1024, 64, 16, 64

if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    x_request = torch.randn(ROWS, K, generator=g).half()
    lora_a = torch.zeros(3, RANK, K, dtype=torch.half)
    lora_b = torch.zeros(3, N, RANK, dtype=torch.half)
    lora_a[1] = (torch.randn(RANK, K, generator=g) / K**0.5).half()
    lora_b[1] = torch.randn(N, RANK, generator=g).half()
    base_request = torch.randn(ROWS, N, generator=g)
    for backend_name in ("triton", "csgmv"):
        for tiles_name, tiles in (
            ("batch_invariant", BATCH_INVARIANT_DELTA_TILES),
            ("default", {}),
        ):
            alone = None
            # The other request before it too: its rows then start at a row
            # that is no multiple of 16.
            for others, first in ((0, True), (1000, True), (5000, True), (1000, False)):
                other = [(others, 0)] if others else []
                requests = [(ROWS, 1)] + other if first else other + [(ROWS, 1)]
                backend = prepare(backend_name, False, requests, {1: (RANK, 2.0)})
                pad_x = torch.zeros(others, K, dtype=torch.half)
                pad_base = torch.zeros(others, N)
                x = torch.cat([x_request, pad_x] if first else [pad_x, x_request])
                base = torch.cat(
                    [base_request, pad_base] if first else [pad_base, base_request]
                )
                out = add_lora_head_gate_delta_(
                    base, x, lora_a, lora_b, backend.get_batch_info(), **tiles
                )
                out = out[:ROWS] if first else out[others:]
                alone = out.clone() if alone is None else alone
                print(
                    json.dumps(
                        {
                            "backend": backend_name,
                            "tiles": tiles_name,
                            "other_tokens": others,
                            "request_first": first,
                            "equal_to_alone": bool(torch.equal(out, alone)),
                            "max_abs_diff": float((out - alone).abs().max()),
                        }
                    ),
                    flush=True,
                )
