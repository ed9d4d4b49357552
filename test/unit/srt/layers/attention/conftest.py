"""Runtime probes for the attention tests: the published config they read and
host pinning (CUDA only)."""

from types import SimpleNamespace

import pytest
import torch
from gdn_stub import CHUNK

from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention.linear import kda_prefill_graph as tables


@pytest.fixture(autouse=True)
def runtime_probes(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args, **kwargs: self)
    monkeypatch.setattr(
        capability,
        "get_memory",
        lambda: SimpleNamespace(enable_page_major_kv_layout=False),
    )
    monkeypatch.setattr(tables, "mamba_cache_chunk_size", lambda: CHUNK)
    monkeypatch.setattr(
        "sglang.srt.model_executor.forward_batch_info.mamba_cache_chunk_size",
        lambda: CHUNK,
    )
