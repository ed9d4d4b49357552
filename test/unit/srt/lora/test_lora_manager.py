"""sglang's LoRA manager compiles the DSA indexer's merged-gate scaling when it
sets up its memory pool (sglang_graphfix/srt/lora/lora_manager.py)."""

import torch
from dsa_indexer_lora_cases import (
    MERGED_GEMM_CALLS,
    ONE_ADAPTER_REQUESTS,
    ROWS,
    _init_lora_pool,
    _inputs,
    _lora_manager,
    _lora_server,
    _lora_weights_proj,
    _one_adapter_gate,
    _resident,
    _weights_proj,
    cpu_stand_ins,  # noqa: F401  (autouse)
)
from torch._dynamo.testing import CompileCounter

from sglang.srt.utils.common import DynamicGradMode
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as ours


def test_pool_init_compiles_the_merged_gate_scaling(monkeypatch):
    """sglang's LoRAManager.init_memory_pool compiles scale_merged_head_gates
    (here with a counting backend instead of Inductor) on the shapes and
    constants the gate passes it and in the scheduler's grad mode, so the
    first single-adapter batch, of another token count, runs it without
    compiling."""
    _lora_server(monkeypatch)
    counter = CompileCounter()
    compiled = torch.compile(
        ours.scale_merged_head_gates._torchdynamo_orig_callable,
        dynamic=True,
        backend=counter,
    )
    monkeypatch.setattr(ours, "scale_merged_head_gates", compiled)
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    manager = _lora_manager(layer)
    x, _, _ = _inputs()

    with torch.compiler.set_stance("default"):
        _init_lora_pool(manager)
        compiled_at_startup = counter.frame_count
        _resident(manager.memory_pool, "adapter1", 1)
        with DynamicGradMode():  # the scheduler's event loop (Dynamo guards it)
            _one_adapter_gate(layer, x)

    assert compiled_at_startup == 1
    assert counter.frame_count == 1, "the first single-adapter batch compiled"
    assert len(MERGED_GEMM_CALLS) == 1 and x.shape[0] == ROWS
