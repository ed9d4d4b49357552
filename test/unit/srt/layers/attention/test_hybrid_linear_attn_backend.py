"""HybridLinearAttnBackend.init_forward_metadata_out_graph: the call the full
prefill runner makes before capture and before every replay."""

from types import SimpleNamespace

import pytest
import torch
from gdn_stub import BUCKET, capture_view, make_gdn

from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
    Mamba2AttnBackend,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode


class _Recorder:
    def __init__(self):
        self.calls = []

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        self.calls.append((forward_batch.forward_mode, in_capture))


def _hybrid(linear):
    backend = HybridLinearAttnBackend.__new__(HybridLinearAttnBackend)
    backend.full_attn_backend = _Recorder()
    backend.linear_attn_backend = linear
    backend.attn_backend_list = [backend.full_attn_backend, linear]
    return backend


def test_plain_extend_on_gdn_plans_full_attention_and_fills_gdn_tables():
    gdn = make_gdn()
    hybrid = _hybrid(gdn)
    hybrid.init_forward_metadata_out_graph(capture_view(), in_capture=True)
    assert hybrid.full_attn_backend.calls == [(ForwardMode.EXTEND, True)]
    assert gdn.full_prefill_graph_capture is gdn.full_prefill_graph_tables[BUCKET]


def test_upstream_crashes_on_the_same_call():
    """The reported failure, reproduced on upstream's method."""
    gdn = make_gdn()
    gdn.state_indices_list = []  # init_cuda_graph_state has not run
    gdn._fused_state_indices_ok = False
    gdn.replayssm_write_pos_list = None
    view = capture_view()
    view.spec_info, view.seq_lens_cpu = None, None
    with pytest.raises(IndexError, match="list index out of range"):
        HybridLinearAttnBackend.init_forward_metadata_out_graph.__wrapped__(
            _hybrid(gdn), view, in_capture=True
        )


@pytest.mark.parametrize(
    "linear_cls, mode",
    [
        (Mamba2AttnBackend, ForwardMode.EXTEND),  # other families: upstream path
        (None, ForwardMode.DECODE),  # GDN decode graphs: upstream path
        (None, ForwardMode.TARGET_VERIFY),
    ],
)
def test_every_other_call_takes_the_upstream_path(linear_cls, mode):
    linear = linear_cls.__new__(linear_cls) if linear_cls else make_gdn()
    linear.init_forward_metadata_out_graph = _Recorder().init_forward_metadata_out_graph
    recorded = linear.init_forward_metadata_out_graph.__self__.calls
    hybrid = _hybrid(linear)
    batch = SimpleNamespace(forward_mode=mode, input_ids=torch.zeros(BUCKET))
    hybrid.init_forward_metadata_out_graph(batch, in_capture=True)
    assert hybrid.full_attn_backend.calls == [(mode, True)]
    assert recorded == [(mode, True)]
    assert not hasattr(linear, "full_prefill_graph_tables")
