"""GDN and KDA full prefill graph state under tensor parallelism (tp_size=2), on
CPU. The per-rank shapes are sglang's own: the mamba pool's conv / temporal
state shapes from Qwen3NextConfig / KimiLinearConfig.mamba2_cache_params with the
attention-TP width mocked, and the GDN layer's head counts as qwen3_next.py
divides them (num_k_heads // attn_tp_size, ...).

What sglang-graphfix adds per rank: the per-bucket tables
(KDAPrefillGraphMetadata: token, chunk, sequence and conv-block indices, no head
dimension) and, for GDN, the in-graph extend that splits the rank's mixed_qkv
by the layer's (per-rank) head counts. Every rank sees the same batch, so its
tables must be the same as every other rank's, and the extend must work on the
rank's heads only.
"""

import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from gdn_stub import BUCKET, capture_view, live_batch, make_gdn, replay_view
from kda_stub import make_kda

from sglang.srt.configs import kimi_linear, qwen3_next
from sglang.srt.configs.kimi_linear import KimiLinearConfig
from sglang.srt.configs.qwen3_next import Qwen3NextConfig
from sglang.srt.layers.radix_linear_attention import RadixLinearAttention
from sglang_graphfix.srt.layers.attention.linear import gdn_backend as gdn_ours
from sglang_graphfix.srt.layers.attention.linear import gdn_prefill_graph
from sglang_graphfix.srt.layers.attention.linear import kda_backend as kda_ours

SAMPLES = Path(gdn_ours.__file__).resolve().parents[4] / "sample_configs"
TP_SIZES = (1, 2)


def _config(cls, name, tp):
    """The sample config's mamba cache params as a rank of an attention-TP
    group of ``tp`` sees them."""
    parallel = SimpleNamespace(attn_tp_size=tp, tp_size=tp)
    with (
        mock.patch.object(qwen3_next, "linear_attn_tp_size", lambda: tp),
        mock.patch.object(qwen3_next, "get_parallel", lambda: parallel),
        mock.patch.object(kimi_linear, "get_parallel", lambda: parallel),
    ):
        config = cls(**json.loads((SAMPLES / name / "config.json").read_text()))
        return config, config.mamba2_cache_params.shape


def _gdn_on_rank(tp):
    """make_gdn's backend with the conv state shape of the rank's pool
    ([slots, conv_dim / tp, kernel - 1])."""
    _, shape = _config(Qwen3NextConfig, "qwen3-next", tp)
    backend = make_gdn()
    backend.conv_states_shape = (3, 5, *shape.conv[0])
    return backend


def _kda_on_rank(tp):
    """make_kda's backend with the rank's conv state shape as KDAAttnBackend
    exposes it (the pool's [kernel - 1, dim / tp], transposed)."""
    _, shape = _config(KimiLinearConfig, "kimi-linear", tp)
    backend = make_kda()
    backend.conv_states_shape = (5, *reversed(shape.conv[0]))
    return backend


def _tables(backend, prepare):
    prepare(backend, capture_view(), in_capture=True)
    return prepare(backend, replay_view(live_batch()), in_capture=False)


def test_per_rank_pool_shapes_are_sharded():
    """The control of the mock: at tp_size=2 the pool's conv and temporal
    states hold half the channels and heads of tp_size=1."""
    for cls, name in (
        (Qwen3NextConfig, "qwen3-next"),
        (KimiLinearConfig, "kimi-linear"),
    ):
        (_, one), (_, two) = (_config(cls, name, tp) for tp in TP_SIZES)
        assert one.temporal[0] == 2 * two.temporal[0]
        assert sum(one.conv[0]) > sum(two.conv[0])


@pytest.mark.parametrize(
    "make, prepare",
    [
        (_gdn_on_rank, gdn_ours.prepare_full_prefill_graph_tables),
        (_kda_on_rank, kda_ours.prepare_kda_full_prefill_graph_tables),
    ],
    ids=["gdn", "kda"],
)
def test_bucket_tables_are_the_same_on_every_rank(make, prepare):
    """The replayed bucket's tables on a tp_size=2 rank equal tp_size=1's
    (they describe the batch, which every rank shares, and carry no head
    dimension); the rank's conv window (kernel - 1, not sharded) is what the
    prefix-cache track rows read."""
    one, two = (_tables(make(tp), prepare) for tp in TP_SIZES)
    assert one.track and two.track  # the stub batch tracks every request
    # Every table is a view of one packed int32 buffer.
    assert torch.equal(one.packed, two.packed) and bool(one.packed.any())
    assert (one.num_tokens, one.max_seqs, one.max_chunks) == (
        two.num_tokens,
        two.max_seqs,
        two.max_chunks,
    )


def _gdn_layer(config, tp):
    """The GDN layer's RadixLinearAttention with the head counts qwen3_next.py
    gives it on an attention-TP group of ``tp``."""
    k_heads = config.linear_num_key_heads // tp
    v_heads = config.linear_num_value_heads // tp
    return RadixLinearAttention(
        layer_id=0,
        num_q_heads=k_heads,
        num_k_heads=k_heads,
        num_v_heads=v_heads,
        head_q_dim=config.linear_key_head_dim,
        head_k_dim=config.linear_key_head_dim,
        head_v_dim=config.linear_value_head_dim,
        conv_weights=torch.zeros(1),
        bias=None,
        A_log=torch.zeros(v_heads),
        dt_bias=torch.zeros(v_heads),
    )


@pytest.fixture
def gdn_kernels(monkeypatch):
    """The Triton kernels gdn_extend_in_graph launches, as recorders returning
    tensors of the shapes the real ones return."""
    calls = {}

    def conv(x, *args, **kwargs):
        calls["conv"] = x.shape
        return x

    def fused_split(x, nq, nk, nv, dq, dk, dv):
        calls["fused_split"] = (nq, nk, nv, dq, dk, dv)
        q, k, v = x.split([nq * dq, nk * dk, nv * dv], dim=-1)
        return (
            t.reshape(1, x.shape[0], n, d)
            for t, n, d in ((q, nq, dq), (k, nk, dk), (v, nv, dv))
        )

    def gating(A_log, a, b, dt_bias):
        calls["gating"] = (A_log.shape, a.shape)
        return a.unsqueeze(0), b.unsqueeze(0)

    def chunk(q, k, v, g, beta, ssm_states, meta):
        calls["chunk"] = (q.shape, k.shape, v.shape, g.shape, ssm_states.shape)
        return torch.zeros_like(v), None

    monkeypatch.setattr(gdn_prefill_graph, "causal_conv1d_fn", conv)
    monkeypatch.setattr(gdn_prefill_graph, "fused_qkv_split_gdn_prefill", fused_split)
    monkeypatch.setattr(gdn_prefill_graph, "fused_gdn_gating", gating)
    monkeypatch.setattr(gdn_prefill_graph, "chunk_gated_delta_rule_on_tables", chunk)
    return calls


def _gdn_extend(tp, layer_tp, *, fused):
    """gdn_extend_in_graph on a rank of an attention-TP group of ``tp``: the
    rank's mixed_qkv (conv_dim / tp channels) and state pools, a layer built
    for ``layer_tp``."""
    config, shape = _config(Qwen3NextConfig, "qwen3-next", tp)
    layer = _gdn_layer(config, layer_tp)
    conv_dim, window = shape.conv[0]
    backend = _gdn_on_rank(tp)
    # No prefix-cache snapshots: they index the pools; shapes only here.
    backend.req_to_token_pool.enable_mamba_extra_buffer = False
    meta = gdn_ours.prepare_full_prefill_graph_tables(
        backend, capture_view(), in_capture=True
    )
    limit = gdn_prefill_graph.MAX_FUSED_QKV_SPLIT_DIM if fused else 0
    with mock.patch.object(gdn_prefill_graph, "MAX_FUSED_QKV_SPLIT_DIM", limit):
        return gdn_prefill_graph.gdn_extend_in_graph(
            layer=layer,
            meta=meta,
            conv_states=torch.zeros(6, conv_dim, window),
            ssm_states=torch.zeros(6, *shape.temporal),
            mixed_qkv=torch.zeros(BUCKET, conv_dim),
            a=torch.zeros(BUCKET, layer.num_v_heads),
            b=torch.zeros(BUCKET, layer.num_v_heads),
        ), config


@pytest.mark.parametrize("fused", [True, False], ids=["fused-split", "torch-split"])
@pytest.mark.parametrize("tp", TP_SIZES)
def test_gdn_graph_extend_works_on_the_ranks_heads(gdn_kernels, tp, fused):
    """The in-graph GDN extend splits the rank's mixed_qkv into the rank's
    q / k / v heads (both split paths) and hands the kernels the rank's state
    pool: per-rank shapes throughout."""
    out, config = _gdn_extend(tp, tp, fused=fused)
    k_heads = config.linear_num_key_heads // tp
    v_heads = config.linear_num_value_heads // tp
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    q, k, v, g, ssm = gdn_kernels["chunk"]
    assert q == k == (1, BUCKET, k_heads, dk)
    assert v == (1, BUCKET, v_heads, dv) and g[-1] == v_heads
    assert ssm[1] == v_heads and out.shape == (1, BUCKET, v_heads, dv)
    assert ("fused_split" in gdn_kernels) == fused


def test_a_layer_with_unsharded_heads_does_not_fit_a_ranks_input(gdn_kernels):
    """The control: the tp_size=1 layer on a tp_size=2 rank's mixed_qkv cannot
    split it, so the test above would notice global head counts."""
    with pytest.raises(RuntimeError, match="split"):
        _gdn_extend(2, 1, fused=False)
