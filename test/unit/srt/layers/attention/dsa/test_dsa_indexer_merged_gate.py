"""The head gate of a batch on one adapter: upstream's GEMM on the merged
weights_proj (dsa_indexer.merged_weights_proj).
"""

import pytest
import torch
from dsa_indexer_lora_cases import (
    ADAPTERS,
    FULL_GATE_CALLS,
    FUSED_DELTA_CALLS,
    HIDDEN,
    MERGED_GEMM_CALLS,
    N_HEADS,
    ONE_ADAPTER_REQUESTS,
    TOKENS,
    _bare_logits,
    _gate,
    _indexer,
    _inputs,
    _lora_buffers,
    _lora_ids,
    _lora_weights_proj,
    _merged_reference,
    _one_adapter_gate,
    _q_scale,
    _reference_logits,
    _split_op_context,
    _weights_proj,
    cpu_stand_ins,  # noqa: F401  (autouse)
)


@pytest.mark.parametrize("backend", ["triton", "csgmv"])
def test_head_gate_with_one_adapter_for_every_request_is_a_merged_weight_gemm(
    backend,
):
    """A single-adapter batch: upstream's GEMM on W + s·B·A, no LoRA kernel at
    all, so the gate costs what it costs without LoRA. The merged weight (two
    bf16 halves) is built once per layer and adapter, from the adapter's rank
    only: whatever the pool slot holds past it stays out."""
    requests = ONE_ADAPTER_REQUESTS
    layer = _lora_weights_proj(_weights_proj(), backend=backend, requests=requests)
    rank = ADAPTERS[1][0]
    layer.lora_a[1, rank:] = float("nan")
    layer.lora_b[1, :, rank:] = float("nan")
    indexer = _indexer(layer)
    x, _, _ = _inputs()
    q_scale = _q_scale()

    with _split_op_context(_lora_ids(requests)):
        gate = indexer._get_logits_head_gate(x, q_scale)
        again = indexer._get_logits_head_gate(x, q_scale)

    assert not FULL_GATE_CALLS and not FUSED_DELTA_CALLS
    assert indexer.fp32_gemm_calls == 0
    first, second = MERGED_GEMM_CALLS
    assert second is first, "the merged weight was rebuilt"
    assert first.dtype == torch.bfloat16 and first.shape == (2 * N_HEADS, HIDDEN)
    high, low = first.float().chunk(2)
    merged = _merged_reference(1)
    assert torch.equal(high, merged.bfloat16().float())
    torch.testing.assert_close(high + low, merged, rtol=2**-15, atol=0)
    reference = _gate(_reference_logits(x, requests=requests), q_scale)[:TOKENS]
    # Graph padding rows get the adapter too: no request reads them.
    torch.testing.assert_close(
        gate[:TOKENS], reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item()
    )
    assert torch.equal(again, gate)
    bare = _gate(_bare_logits(x), q_scale)
    assert (gate - bare)[:TOKENS].abs().amax(dim=(1, 2)).min() > bare.abs().max()


def test_merged_weight_keeps_a_small_adapter():
    """An adapter that moves the gate by about 0.1%: one bf16 merged weight
    keeps 8 bits of W and rounds away most of that move; the gate on the two
    halves keeps it."""
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    layer.lora_b[1] *= 3e-5
    a, b = _lora_buffers()
    b[1] *= 3e-5
    merged = _merged_reference(1, (a, b))
    x, _, _ = _inputs()
    q_scale = _q_scale()
    bare = _gate(_bare_logits(x), q_scale)[:TOKENS]
    move = _gate(x.float() @ merged.t(), q_scale)[:TOKENS] - bare

    gate = _one_adapter_gate(layer, x, q_scale)[:TOKENS]
    one_bf16 = _gate(x.float() @ merged.bfloat16().float().t(), q_scale)[:TOKENS]

    assert (move.norm() / bare.norm()) < 0.01
    assert ((gate - bare - move).norm() / move.norm()) < 0.01
    assert ((one_bf16 - bare - move).norm() / move.norm()) > 0.3  # the control


def test_capture_never_caches_a_merged_weight(monkeypatch):
    """A merged weight built under stream capture would live in the graph's
    memory: under capture a single-adapter batch takes the whole-gate kernel."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    x, _, _ = _inputs()

    _one_adapter_gate(layer, x)

    assert len(FULL_GATE_CALLS) == 1 and not MERGED_GEMM_CALLS
