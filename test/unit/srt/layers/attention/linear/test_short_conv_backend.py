"""LFM2's short conv under a full prefill graph (LFM2_FULL_PREFILL_GRAPH on):
the metadata call the full prefill runner makes before capture and before every
replay, through sglang's HybridLinearAttnBackend.init_forward_metadata_out_graph,
gives sglang's ShortConvAttnBackend per-bucket tables that its conv layers read
through its own conv_state_metadata, equal to sglang's eager metadata for the
batch's rows (the kernel runs on a GPU only: test/gpu)."""

import random
from contextlib import ExitStack
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from mamba2_prefill_graph_cases import (
    Pool,
    capture_batch,
    graph_runtime,
    live_batch,
    random_case,
    replay_view,
)
from tiny_configs import write_config

from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID
from sglang.srt.arg_groups.overrides import model_config_of
from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
)
from sglang.srt.layers.attention.linear.inkling_sconv_backend import (
    InklingShortConvAttnBackend,
)
from sglang.srt.layers.attention.linear.short_conv_backend import ShortConvAttnBackend
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.srt import full_prefill_graph_capability as capability


class _Recorder:
    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        pass


class _LayerCachePool(Pool):
    def mamba2_layer_cache(self, layer_id):
        return SimpleNamespace(conv=[f"conv state of layer {layer_id}"])

    def translate_mamba_indices(self, indices):
        return indices + 1000  # virtual -> physical slots (a unified pool)


@pytest.fixture(scope="module")
def lfm2_config(tmp_path_factory):
    path = write_config("lfm2", tmp_path_factory.mktemp("lfm2"))
    return model_config_of(
        ServerArgs(model_path=path, dtype="bfloat16", attention_backend="flashinfer")
    )


def _backend(model_config, cls=ShortConvAttnBackend):
    backend = cls.__new__(cls)
    backend.req_to_token_pool = _LayerCachePool()
    backend.device = torch.device("cpu")
    backend.topk = 0
    backend.conv_states_shape = (2, 81, 32, 3)
    backend._mamba_chunk_size = 64
    backend._model_runner = SimpleNamespace(model_config=model_config)
    backend._cache_indices_buf = None
    backend.forward_metadata = None
    backend._reset_step_state()
    return backend


def _hybrid(linear):
    hybrid = HybridLinearAttnBackend.__new__(HybridLinearAttnBackend)
    hybrid.full_attn_backend = _Recorder()
    hybrid.linear_attn_backend = linear
    hybrid.attn_backend_list = [hybrid.full_attn_backend, linear]
    return hybrid


def _runtime(case, lfm2_switch=True):
    stack = ExitStack()
    for patch in graph_runtime(case):
        stack.enter_context(patch)
    stack.enter_context(
        mock.patch.object(capability, "LFM2_FULL_PREFILL_GRAPH", lfm2_switch)
    )
    return stack


def test_lfm2_switch_ships_on():
    assert capability.LFM2_FULL_PREFILL_GRAPH is True


def test_plain_extend_on_lfm2_runs_on_the_buckets_static_tables(lfm2_config):
    """Per bucket one set of tables (the same tensors on every replay, which the
    captured conv layers read) describing the replayed batch as sglang's eager
    ShortConvAttnBackend.init_forward_metadata does for its rows; the runner's
    padding rows get no tokens and PAD_SLOT_ID (the conv kernel skips them),
    and no host mirrors are built."""
    rng = random.Random(3)
    for case in [random_case(rng) for _ in range(30)]:
        live = live_batch(case)
        eager = _backend(lfm2_config)
        with _runtime(case):
            ShortConvAttnBackend.init_forward_metadata(eager, live)
            backend = _backend(lfm2_config)
            hybrid = _hybrid(backend)
            hybrid.init_forward_metadata_out_graph(
                capture_batch(case, track=False), in_capture=True
            )
            captured = backend.conv_state_metadata(0, None)
            # An eager prefill in between (an engine runs those too) leaves its
            # metadata and host mirrors on the backend.
            ShortConvAttnBackend.init_forward_metadata(backend, live)
            hybrid.init_forward_metadata_out_graph(
                replay_view(case, live), in_capture=False
            )
        meta = backend.conv_state_metadata(1, None)
        expected = eager.conv_state_metadata(1, None)
        bs, R = len(case.lens), case.slots
        for name in ("query_start_loc", "cache_indices", "has_initial_state"):
            assert getattr(meta, name) is getattr(captured, name), name
        assert meta.layer_cache.conv[0] == "conv state of layer 1"
        qsl = meta.query_start_loc
        assert qsl.dtype == torch.int32 and qsl.shape == (R + 1,)
        assert torch.equal(qsl[: bs + 1], expected.query_start_loc.to(torch.int32))
        assert (qsl[bs + 1 :] == qsl[bs]).all()
        assert meta.cache_indices.shape == (R,)
        assert torch.equal(meta.cache_indices[:bs], expected.cache_indices)
        assert (meta.cache_indices[bs:] == PAD_SLOT_ID).all()
        assert torch.equal(meta.has_initial_state[:bs], expected.has_initial_state)
        assert not meta.has_initial_state[bs:].any()
        assert meta.slot_ids_cpu is None and meta.has_prefix_cpu is None
        assert expected.slot_ids_cpu is not None  # eager syncs them for ZAYA1


@pytest.mark.parametrize(
    "cls, lfm2_switch",
    [
        (ShortConvAttnBackend, False),
        # Inkling's subclass plans its own full-graph metadata, switch on or off.
        (InklingShortConvAttnBackend, True),
    ],
    ids=["lfm2-switch-off", "inkling"],
)
def test_upstream_path_otherwise(lfm2_config, cls, lfm2_switch):
    case = random_case(random.Random(5))
    backend = _backend(lfm2_config, cls)
    upstream = mock.Mock()
    with (
        _runtime(case, lfm2_switch=lfm2_switch),
        mock.patch.object(cls, "init_forward_metadata_out_graph", upstream),
    ):
        _hybrid(backend).init_forward_metadata_out_graph(
            capture_batch(case, track=False), in_capture=True
        )
    upstream.assert_called_once()
    assert "short_conv_full_prefill_graph_tables" not in backend.__dict__


def test_lfm2_replay_without_its_capture_fails_clearly(lfm2_config):
    case = random_case(random.Random(9))
    with (
        _runtime(case),
        pytest.raises(RuntimeError, match="no tables were captured"),
    ):
        _hybrid(_backend(lfm2_config)).init_forward_metadata_out_graph(
            replay_view(case, live_batch(case)), in_capture=False
        )
