"""Online weight updates and the DSA indexer's merged weights_proj
(sglang_graphfix/srt/model_executor/model_runner_components/weight_updater.py).
"""

from functools import partial
from types import SimpleNamespace

import pytest
import torch
from dsa_indexer_lora_cases import (
    ONE_ADAPTER_REQUESTS,
    _inputs,
    _lora_weights_proj,
    _one_adapter_gate,
    _weights_proj,
    cpu_stand_ins,  # noqa: F401  (autouse)
)

from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as ours
from sglang_graphfix.srt.model_executor.model_runner_components import weight_updater


@pytest.mark.parametrize("refused", [False, True], ids=["update", "refused"])
def test_merged_weight_is_rebuilt_after_an_online_weight_update(refused):
    """Every online weight update runs sglang's derived-cache check before it
    rewrites weights in place; one that goes ahead drops every merged weight,
    a refused one (the check's error) keeps them."""
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    x, _, _ = _inputs()
    before = _one_adapter_gate(layer, x)
    with torch.no_grad():
        layer.base_layer.weight.mul_(-1.0)  # the update's in-place write
    error = "refused" if refused else None

    assert (
        weight_updater.drop_merged_gates_on_weight_update(lambda model: error, None)
        == error
    )
    after = _one_adapter_gate(layer, x)

    assert torch.equal(after, before) == refused


def test_sglangs_pool_load_and_weight_updates_drop_merged_weights():
    """The hooks on sglang's own functions, as applied by register(): a pool
    load (here of the base model into slot 0, on a pool without buffers), an
    online update's derived-cache check and the end of a weight-update session
    each drop every merged weight."""
    from sglang.srt.lora.mem_pool import LoRAMemoryPool
    from sglang.srt.model_executor.model_runner_components import (
        weight_updater as upstream_updater,
    )

    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    buffers = ("A_buffer", "B_buffer", "embedding_A_buffer", "embedding_B_buffer")
    buffers += ("lm_head_A_buffer", "lm_head_B_buffer", "new_embeddings_buffer")
    pool = SimpleNamespace(**{name: {} for name in buffers})
    pool._clear_buffer_slot_for_base = partial(
        LoRAMemoryPool._clear_buffer_slot_for_base, pool
    )
    model = torch.nn.Linear(2, 2)
    updater = SimpleNamespace(get_model=lambda: model, device="cpu")
    drops = {
        "pool_load": lambda: LoRAMemoryPool.load_lora_weight_to_buffer(
            pool, None, 0, None, [], None, None
        ),
        "update_check": lambda: (
            upstream_updater._unsupported_derived_weight_cache_error(model)
        ),
        "session_end": lambda: upstream_updater.WeightUpdater.end_weight_update(
            updater, run_post_load=False
        ),
    }
    for name, drop in drops.items():
        _one_adapter_gate(layer, _inputs()[0])
        assert layer in ours._MERGED, name
        drop()
        assert layer not in ours._MERGED, name
