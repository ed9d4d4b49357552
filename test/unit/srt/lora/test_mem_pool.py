"""sglang's LoRA memory pool and the DSA indexer's merged weights_proj
(sglang_graphfix/srt/lora/mem_pool.py): the reservation made with the pool,
adapter loads and unloads.
"""

import logging
from types import SimpleNamespace

import pytest
import torch
from dsa_indexer_lora_cases import (
    FULL_GATE_CALLS,
    HIDDEN,
    MAX_LORAS,
    MERGED_GEMM_CALLS,
    N_HEADS,
    ONE_ADAPTER_REQUESTS,
    ROWS,
    TOKENS,
    _adapters,
    _indexer,
    _init_lora_pool,
    _inputs,
    _lora_buffers,
    _lora_manager,
    _lora_server,
    _lora_weights_proj,
    _merged_reference,
    _one_adapter_gate,
    _q_scale,
    _resident,
    _split_op_context,
    _weights_proj,
    cpu_stand_ins,  # noqa: F401  (autouse)
)
from lora_head_gate_cases import prepare as prepare_lora_batch

from sglang.srt.lora.lora_manager import LoRAManager
from sglang.srt.lora.lora_registry import LoRARef
from sglang.srt.lora.mem_pool import EMPTY_SLOT
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as ours
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
    torch.testing.assert_close(
        high + low, _merged_reference(1, (a, b)), rtol=2**-15, atol=0
    )
    assert not torch.allclose(after, before)


@pytest.mark.parametrize(
    "prefill, deterministic, dp_attention, reserved",
    [
        ("breakable", False, False, True),
        ("disabled", False, False, False),
        ("breakable", True, False, False),
        ("breakable", False, True, False),
    ],
    ids=["breakable", "no_prefill_graph", "deterministic", "dp_attention"],
)
def test_lora_pool_init_reserves_the_merged_weights(
    monkeypatch, caplog, prefill, deterministic, dp_attention, reserved
):
    """sglang's LoRAManager.init_memory_pool allocates, with the pool's own
    buffers and so before the KV cache is sized, one merged weights_proj per
    pool slot, and logs its size; a single-adapter gate then builds its
    merged weight there (the adapter's slot) and gives the gate of a merged
    weight allocated on the fly. Where the gate never takes the merged path
    (no breakable prefill graph, deterministic inference, DP attention, under
    which sglang's LoRA manager keeps the prefill eager) nothing is
    reserved."""
    _lora_server(monkeypatch, prefill=prefill, deterministic=deterministic)
    monkeypatch.setattr(
        ours, "get_parallel", lambda: SimpleNamespace(attn_dp_enabled=dp_attention)
    )
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    x, _, _ = _inputs()
    unreserved = _one_adapter_gate(
        _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS), x
    )
    MERGED_GEMM_CALLS.clear()
    manager = _lora_manager(layer)

    with caplog.at_level(logging.INFO, logger="sglang_graphfix"):
        _init_lora_pool(manager)

    logged = [r.getMessage() for r in caplog.records if "reserved" in r.getMessage()]
    if not reserved:
        assert layer not in ours._RESERVED and not logged
        return
    halves = ours._RESERVED[layer].halves
    assert halves.shape == (MAX_LORAS, 2 * N_HEADS, HIDDEN)
    assert halves.dtype == layer.weight.dtype
    assert manager.memory_pool.A_buffer["indexer.weights_proj"], "the pool's own"
    slot_mb = 2 * N_HEADS * HIDDEN * 2 / (1 << 20)
    (line,) = logged
    assert line.startswith("sglang-graphfix: reserved ")
    assert f"{MAX_LORAS * slot_mb:.2f} MB with the LoRA memory pool" in line
    assert f"(1 layers x {MAX_LORAS} slots x {slot_mb:.2f} MB" in line
    assert "before the KV cache is sized. avail mem=" in line

    # An adapter the pool does not hold (none in a server: its batch loads
    # it first) has no slot to merge into: the whole-gate kernel serves it.
    _one_adapter_gate(layer, x)
    assert len(FULL_GATE_CALLS) == 1 and not MERGED_GEMM_CALLS
    _resident(manager.memory_pool, "adapter1", 1)
    gate = _one_adapter_gate(layer, x)

    (merged,) = MERGED_GEMM_CALLS
    assert merged.data_ptr() == halves[1].data_ptr()
    assert torch.equal(gate, unreserved)


def test_unloading_an_adapter_drops_its_merged_weights(monkeypatch, caplog):
    """sglang's LoRAManager.unload_lora_adapter (the pool's remove_lora) drops
    the unloaded adapter's merged weights_proj and keeps the other adapter's;
    the reservation stays for the next adapter in that slot."""
    _lora_server(monkeypatch)
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    manager = _lora_manager(layer)
    _init_lora_pool(manager)
    pool = manager.memory_pool
    reservation = ours._RESERVED[layer].halves
    x, _, _ = _inputs()
    _resident(pool, "adapter1", 1)
    _resident(pool, "adapter2", 2)
    _one_adapter_gate(layer, x)  # adapter1, slot 1
    layer.lora_backend = prepare_lora_batch(
        "triton", True, [(TOKENS, 2)], _adapters(), rows=ROWS
    )
    with _split_op_context(["adapter2"]):
        _indexer(layer)._get_logits_head_gate(x, _q_scale())
    assert set(ours._MERGED[layer]) == {"adapter1", "adapter2"}

    with caplog.at_level(logging.INFO, logger="sglang_graphfix"):
        result = LoRAManager.unload_lora_adapter(
            manager, LoRARef(lora_id="adapter1", lora_name="a1", lora_path="/a1")
        )

    assert result.success, result.error_message
    assert pool.buffer_id_to_uid[1] is EMPTY_SLOT
    assert set(ours._MERGED[layer]) == {"adapter2"}
    assert ours._RESERVED[layer].halves is reservation
    messages = [r.getMessage() for r in caplog.records]
    assert (
        "sglang-graphfix: dropped the merged DSA indexer weights_proj of unloaded "
        "LoRA adapter adapter1 (1 layers)"
    ) in messages
