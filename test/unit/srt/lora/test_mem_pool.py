"""Adapter loads into sglang's LoRA memory pool and the DSA indexer's merged
weights_proj (sglang_graphfix/srt/lora/mem_pool.py).
"""

import torch
from dsa_indexer_lora_cases import (
    MERGED_GEMM_CALLS,
    ONE_ADAPTER_REQUESTS,
    _inputs,
    _lora_buffers,
    _lora_weights_proj,
    _merged_reference,
    _one_adapter_gate,
    _weights_proj,
    cpu_stand_ins,  # noqa: F401  (autouse)
)
from sglang_graphfix.srt.lora import mem_pool


def test_merged_weight_is_rebuilt_after_a_pool_load():
    """A load into the LoRA memory pool may rewrite the slot a merged weight
    came from (the same adapter id can come back with other weights): the
    pool-load hook drops every merged weight."""
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    x, _, _ = _inputs()
    before = _one_adapter_gate(layer, x)
    layer.lora_b[1].neg_()  # the slot rewritten, as a load does
    stale = _one_adapter_gate(layer, x)
    loads = []
    mem_pool.drop_merged_gates_on_pool_load(
        lambda pool, *args: loads.append(args), None, "uid", 1
    )
    after = _one_adapter_gate(layer, x)

    assert loads == [("uid", 1)]
    assert torch.equal(stale, before), "without the hook the cache stands"
    a, b = _lora_buffers()
    b[1].neg_()
    high, low = MERGED_GEMM_CALLS[-1].float().chunk(2)
    torch.testing.assert_close(high + low, _merged_reference(1, (a, b)), rtol=2**-15, atol=0)
    assert not torch.allclose(after, before)

