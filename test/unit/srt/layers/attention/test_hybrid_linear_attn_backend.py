"""HybridLinearAttnBackend and MambaAttnBackendBase under full prefill graphs:
the metadata call the full prefill runner makes before capture and before every
replay, the linear backends' CUDA-graph state (allocated once, guarded on
replay), and the wrapper's chunked-prefix capability."""

from types import SimpleNamespace

import pytest
import torch
from gdn_stub import BUCKET, capture_view, make_gdn
from kda_stub import make_kda, with_graph_lists

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.attention.flashinfer_mla_backend import (
    FlashInferMLAAttnBackend,
)
from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
    Mamba2AttnBackend,
    MambaAttnBackendBase,
)
from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode


class _Recorder:
    def __init__(self):
        self.calls = []

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        self.calls.append((forward_batch.forward_mode, in_capture))


def _hybrid(linear, full=None):
    backend = HybridLinearAttnBackend.__new__(HybridLinearAttnBackend)
    backend.full_attn_backend = full or _Recorder()
    backend.linear_attn_backend = linear
    backend.attn_backend_list = [backend.full_attn_backend, linear]
    return backend


# --- init_forward_metadata_out_graph ---------------------------------------


def test_plain_extend_on_gdn_plans_full_attention_and_fills_gdn_tables():
    gdn = make_gdn()
    hybrid = _hybrid(gdn)
    hybrid.init_forward_metadata_out_graph(capture_view(), in_capture=True)
    assert hybrid.full_attn_backend.calls == [(ForwardMode.EXTEND, True)]
    assert gdn.full_prefill_graph_capture is gdn.full_prefill_graph_tables[BUCKET]


def test_plain_extend_on_kda_plans_full_attention_and_fills_kda_tables():
    kda = make_kda()
    hybrid = _hybrid(kda)
    hybrid.init_forward_metadata_out_graph(capture_view(), in_capture=True)
    assert hybrid.full_attn_backend.calls == [(ForwardMode.EXTEND, True)]
    # upstream's forward_extend runs kda_extend_in_graph on this
    assert kda.prefill_graph_metadata is kda.full_prefill_graph_tables[BUCKET]


def test_upstream_crashes_on_the_same_call(monkeypatch):
    """The reported failure on upstream's method: an IndexError without the
    guard, the guard's RuntimeError with it."""
    gdn = with_graph_lists(make_gdn())  # init_cuda_graph_state has not run
    view = capture_view()
    view.spec_info, view.seq_lens_cpu = None, None
    upstream = HybridLinearAttnBackend.init_forward_metadata_out_graph.__wrapped__
    with pytest.raises(RuntimeError, match="GDNAttnBackend: no CUDA-graph state"):
        upstream(_hybrid(gdn), view, in_capture=True)
    monkeypatch.setattr(
        MambaAttnBackendBase,
        "_replay_metadata",
        MambaAttnBackendBase._replay_metadata.__wrapped__,
    )
    with pytest.raises(IndexError, match="list index out of range"):
        upstream(_hybrid(gdn), view, in_capture=True)


@pytest.mark.parametrize(
    "linear_cls, mode",
    [
        (Mamba2AttnBackend, ForwardMode.EXTEND),  # other families: upstream path
        (None, ForwardMode.DECODE),  # GDN decode graphs: upstream path
        (None, ForwardMode.TARGET_VERIFY),
        (KDAAttnBackend, ForwardMode.DECODE),  # KDA decode graphs: upstream path
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


def test_full_attention_without_a_full_prefill_plan_fails_clearly():
    """FlashInfer MLA (Kimi-Linear's attention under --attention-backend
    flashinfer) plans no EXTEND for full graphs; capture names the backend and
    the way out instead of a bare 'Invalid mode'."""
    mla = FlashInferMLAAttnBackend.__new__(FlashInferMLAAttnBackend)
    view = capture_view()
    view.positions = torch.zeros(BUCKET, dtype=torch.int64)
    view.seq_lens = torch.tensor([BUCKET, 0, 0, 0])
    view.spec_info = None
    kda = make_kda()
    with pytest.raises(
        ValueError, match="FlashInferMLAAttnBackend could not plan"
    ) as err:
        _hybrid(kda, full=mla).init_forward_metadata_out_graph(view, in_capture=True)
    assert "Invalid mode" in str(err.value)
    assert "--attention-backend fa3" in str(err.value)
    assert "--cuda-graph-backend-prefill breakable" in str(err.value)
    assert not hasattr(kda, "full_prefill_graph_tables")


# --- init_cuda_graph_state: one allocation ----------------------------------


def _state_ids(backend):
    lists = (
        backend.state_indices_list,
        backend.query_start_loc_list,
        backend.retrieve_next_token_list,
    )
    return [id(t) for lst in lists for t in lst] + [
        id(backend.mamba_track_indices_buf),
        id(backend.cached_cuda_graph_decode_query_start_loc),
        id(backend.cached_cuda_graph_verify_query_start_loc),
    ]


def test_graph_state_is_allocated_once_and_kept_for_smaller_calls():
    gdn = with_graph_lists(make_gdn())
    gdn.init_cuda_graph_state(8, 8)
    assert len(gdn.state_indices_list) == 8 and gdn.graph_state_bounds == (8, 1)
    before = _state_ids(gdn)
    for max_bs in (8, 4, 1):  # e.g. the decode runner after the prefill runner
        gdn.init_cuda_graph_state(max_bs, max_bs)
    assert _state_ids(gdn) == before  # no list doubled, no buffer replaced


@pytest.mark.parametrize("max_bs, max_num_tokens", [(16, 16), (4, 8)])
def test_graph_state_beyond_the_allocation_raises(max_bs, max_num_tokens):
    gdn = with_graph_lists(make_gdn())
    gdn.init_cuda_graph_state(8, 8)
    with pytest.raises(RuntimeError, match=r"already allocated for max_bs=8 with 1"):
        gdn.init_cuda_graph_state(max_bs, max_num_tokens)
    assert len(gdn.state_indices_list) == 8


def test_upstream_assert_is_kept_for_the_first_allocation():
    with pytest.raises(AssertionError, match="must be divisible"):
        with_graph_lists(make_gdn()).init_cuda_graph_state(4, 10)


# --- _replay_metadata guard ---------------------------------------------------


def _decode_replay(backend, replay=None):
    replay = replay or MambaAttnBackendBase._replay_metadata
    return replay(
        backend,
        3,
        torch.tensor([1, 4, 0]),
        ForwardMode.DECODE,
        None,
        torch.tensor([9, 12, 1]),
        num_padding=1,
        mamba_track_indices=torch.tensor([3, 6, 0]),
    )


def test_missing_batch_size_raises_a_runtime_error_naming_it():
    gdn = with_graph_lists(make_gdn())
    gdn.init_cuda_graph_state(2, 2)
    with pytest.raises(RuntimeError) as err:
        _decode_replay(gdn)
    message = str(err.value)
    assert "GDNAttnBackend" in message and "batch size 3" in message
    assert "init_cuda_graph_state" in message and "2 per-batch-size" in message


def test_decode_replay_is_bit_identical_to_upstream():
    guarded, upstream = (with_graph_lists(make_gdn()) for _ in range(2))
    for backend in (guarded, upstream):
        backend.init_cuda_graph_state(4, 4)
    ours = _decode_replay(guarded)
    theirs = _decode_replay(upstream, MambaAttnBackendBase._replay_metadata.__wrapped__)
    assert torch.equal(ours.query_start_loc, theirs.query_start_loc)
    assert torch.equal(ours.mamba_cache_indices, theirs.mamba_cache_indices)
    assert torch.equal(ours.mamba_track_indices, theirs.mamba_track_indices)
    assert ours.mamba_cache_indices.tolist() == [5, 7, -1]  # padded row: sentinel
    assert ours.query_start_loc.tolist() == [0, 1, 2, 2]


# --- chunked-prefix full prefill graphs through the wrapper -------------------


class _ChunkedPrefixAttn(AttentionBackend):
    """A full-attention child with chunked-prefix full graphs (fa3's flag)."""

    supports_full_cuda_graph_chunked_prefix = True

    def __init__(self):
        self.token_to_kv_pool = self.req_to_token_pool = None
        self.kv_index_translator = None
        self.needs_cpu_seq_lens = False
        self.prepared = []

    def prepare_full_cuda_graph_chunked_prefix(self, forward_batch, *, in_capture):
        self.prepared.append((forward_batch, in_capture))

    def init_forward_metadata(self, forward_batch):
        pass


def _constructed(cls, full, monkeypatch):
    monkeypatch.setattr(
        "sglang.srt.layers.attention.hybrid_linear_attn_backend."
        "check_cuda_graph_backend",
        lambda phase, backend: False,
    )
    linear = make_gdn()
    linear.needs_cpu_seq_lens = False
    return cls(full, linear, full_attn_layers=[3])


def test_wrapper_exposes_the_childs_chunked_prefix_capture(monkeypatch):
    full = _ChunkedPrefixAttn()
    hybrid = _constructed(HybridLinearAttnBackend, full, monkeypatch)
    assert hybrid.supports_full_cuda_graph_chunked_prefix is True
    hybrid.prepare_full_cuda_graph_chunked_prefix("batch", in_capture=True)
    assert full.prepared == [("batch", True)]


def test_wrapper_keeps_false_for_a_child_without_it(monkeypatch):
    full = FlashInferMLAAttnBackend.__new__(FlashInferMLAAttnBackend)
    full.token_to_kv_pool = full.req_to_token_pool = full.kv_index_translator = None
    full.needs_cpu_seq_lens = False
    hybrid = _constructed(HybridLinearAttnBackend, full, monkeypatch)
    assert hybrid.supports_full_cuda_graph_chunked_prefix is False


def test_subclass_with_its_own_flag_is_left_alone(monkeypatch):
    class OwnFlag(HybridLinearAttnBackend):  # like Inkling's hybrid
        @property
        def supports_full_cuda_graph_chunked_prefix(self):
            return "own"

    hybrid = _constructed(OwnFlag, _ChunkedPrefixAttn(), monkeypatch)
    assert hybrid.supports_full_cuda_graph_chunked_prefix == "own"
    assert "prepare_full_cuda_graph_chunked_prefix" not in vars(hybrid)
