"""KDA full prefill graph tables on CPU: the capture tables (zero-length sentinel
slots), the replay refill from the runner's slot-padded batch checked against
upstream's own breakable-graph fill of the same live batch, the extend routed to
them, eager forwards off them, and the capture-time checks."""

from types import SimpleNamespace

import pytest
import torch
from gdn_stub import (
    BUCKET,
    CHUNK,
    SLOTS_PER_GRAPH,
    capture_view,
    live_batch,
    replay_view,
)
from kda_stub import make_kda

from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID
from sglang.kernels.ops.mamba.kda_prefill_track import (
    TRACK_CHUNK_STATE,
    TRACK_FINAL_STATE,
    TRACK_NONE,
)
from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase
from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
)
from sglang_graphfix.srt.layers.attention.linear import kda_backend as ours

UPSTREAM = "sglang.srt.layers.attention.linear.kda_backend."
GRAPH = "sglang.srt.layers.attention.linear.kda_prefill_graph."


@pytest.fixture(autouse=True)
def kda_runtime_probes(monkeypatch):
    monkeypatch.setattr(UPSTREAM + "mamba_cache_chunk_size", lambda: CHUNK)
    monkeypatch.delenv("SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND", raising=False)


def _captured(kda):
    return ours.prepare_kda_full_prefill_graph_tables(
        kda, capture_view(), in_capture=True
    )


def test_capture_tables_hold_every_slot_and_pad_the_sentinels():
    kda = make_kda()
    meta = _captured(kda)
    assert (
        kda.prefill_graph_metadata
        is meta
        is kda.full_prefill_graph_tables[BUCKET, SLOTS_PER_GRAPH]
    )
    assert meta.num_tokens == BUCKET and meta.max_seqs == SLOTS_PER_GRAPH
    assert meta.track  # replays of the bucket may carry prefix-cache snapshots
    # one real capture sequence, then zero-length sentinel slots doing no work
    assert meta.cu_seqlens.tolist() == [0] + [BUCKET] * SLOTS_PER_GRAPH
    assert meta.cache_indices.tolist() == [0] + [PAD_SLOT_ID] * (SLOTS_PER_GRAPH - 1)
    assert meta.track_mode.tolist() == [TRACK_NONE] * SLOTS_PER_GRAPH


def test_replay_tables_equal_upstreams_breakable_fill_of_thelive_batch():
    kda = make_kda()
    _captured(kda)
    ours_meta = ours.prepare_kda_full_prefill_graph_tables(
        kda, replay_view(live_batch()), in_capture=False
    )
    assert ours_meta is kda.full_prefill_graph_tables[BUCKET, SLOTS_PER_GRAPH]
    assert kda.prefill_graph_metadata is ours_meta

    # Upstream's breakable-graph refill (KDAAttnBackend.refresh_prefill_graph_
    # metadata) of the unpadded batch, on tables of the same bounds.
    reference = KDAPrefillGraphMetadata.allocate(
        num_tokens=BUCKET,
        max_seqs_cap=SLOTS_PER_GRAPH,
        track=True,
        cache_index_dtype=ours_meta.cache_indices.dtype,
        device=torch.device("cpu"),
    )
    upstream = make_kda()
    upstream.refresh_prefill_graph_metadata(reference, live_batch())

    assert torch.equal(ours_meta.packed, reference.packed)
    assert torch.equal(ours_meta.cache_indices, reference.cache_indices)
    assert torch.equal(ours_meta.has_initial_state, reference.has_initial_state)
    assert torch.equal(ours_meta.track_dst, reference.track_dst)
    # and what they say: the sentinel slot is padded, prefixes resume state
    assert ours_meta.cu_seqlens.tolist() == [0, 37, 137, 247, 247]
    assert ours_meta.cache_indices.tolist() == [5, 9, 2, PAD_SLOT_ID]
    assert ours_meta.has_initial_state.tolist() == [False, True, True, False]
    assert ours_meta.track_mode.tolist() == [
        TRACK_CHUNK_STATE,
        TRACK_FINAL_STATE,
        TRACK_CHUNK_STATE,
        TRACK_NONE,
    ]


def test_tables_are_sized_by_the_runner_slots_not_the_breakable_cap(monkeypatch):
    monkeypatch.setenv("SGLANG_KDA_PREFILL_GRAPH_MAX_SEQS", "2")
    kda = make_kda()
    kda.prefill_graph_max_seqs = 2
    assert _captured(kda).max_seqs == SLOTS_PER_GRAPH  # 4 slots > cap 2
    small = capture_view()  # a bucket smaller than the slot count
    small.input_ids = torch.zeros(3, dtype=torch.int64)
    small.extend_seq_lens_cpu = [3, 0, 0, 0]
    meta = ours.prepare_kda_full_prefill_graph_tables(kda, small, in_capture=True)
    assert meta.max_seqs == 3  # every request holds a token


def test_replay_errors_name_the_problem():
    kda = make_kda()
    with pytest.raises(RuntimeError, match="no tables were captured for the 256"):
        ours.prepare_kda_full_prefill_graph_tables(
            kda, replay_view(live_batch()), in_capture=False
        )
    kda.req_to_token_pool.enable_mamba_extra_buffer = False  # instance override
    _captured(kda)
    with pytest.raises(RuntimeError, match="captured without track copies"):
        ours.prepare_kda_full_prefill_graph_tables(
            kda, replay_view(live_batch()), in_capture=False
        )


def _layer_cache(kda):
    cache = SimpleNamespace(conv=[torch.zeros(5, 3, 8)], temporal=torch.zeros(5, 1))
    kda.req_to_token_pool.mamba2_layer_cache = lambda layer_id: cache
    return cache


def test_forward_extend_runs_on_the_tables(monkeypatch):
    kda = make_kda()
    cache = _layer_cache(kda)
    meta = _captured(kda)
    calls = []
    monkeypatch.setattr(
        UPSTREAM + "kda_extend_in_graph", lambda **kw: calls.append(kw) or "in-graph"
    )
    x = torch.zeros(BUCKET, 8)
    out = kda.forward_extend(
        layer=SimpleNamespace(layer_id=0), forward_batch=capture_view(),
        mixed_qkv=x, a=torch.zeros(BUCKET, 8), b=None,
    )  # fmt: skip
    assert out == "in-graph" and calls[0]["meta"] is meta
    assert calls[0]["conv_pool"] is cache.conv[0]


HEADS, HEAD_DIM = 2, 4


def _graph_extend_beta_is_raw(monkeypatch, forward_extend):
    """Runs upstream's kda_extend_in_graph behind ``forward_extend`` with the
    gate Kimi-Linear passes, (1, T, H, K); records what reaches the KDA kernel."""
    kda = make_kda()
    _layer_cache(kda)
    _captured(kda)
    for launch in ("kda_track_conv_window", "kda_track_ssm_state"):
        monkeypatch.setattr(f"{GRAPH}{launch}", lambda **kw: None)
    monkeypatch.setattr(f"{GRAPH}causal_conv1d_fn", lambda x, *args, **kw: x)
    calls = []
    kda.kernel_dispatcher.extend = lambda **kw: calls.append(kw) or kw["v"].clone()
    dim = HEADS * HEAD_DIM
    layer = SimpleNamespace(
        layer_id=0, conv_weights=None, bias=None, A_log=None, dt_bias=None,
        lower_bound=None, q_dim=dim, k_dim=dim, v_dim=dim,
        head_q_dim=HEAD_DIM, head_k_dim=HEAD_DIM, head_v_dim=HEAD_DIM,
    )  # fmt: skip
    forward_extend(
        kda, layer=layer, forward_batch=capture_view(),
        mixed_qkv=torch.zeros(BUCKET, 3 * dim),
        a=torch.zeros(1, BUCKET, HEADS, HEAD_DIM), b=torch.zeros(1, BUCKET, HEADS),
    )  # fmt: skip
    (call,) = calls
    assert call["g"].shape == (1, BUCKET, HEADS, HEAD_DIM)
    return call["beta_is_raw"]


def test_graph_extend_applies_the_beta_sigmoid_like_eager(monkeypatch):
    """Eager KDA extend always passes beta_is_raw=True (the kernel applies the
    sigmoid). Upstream's graph extend does so only for a flat gate, so Kimi-Linear
    ran its graph prefills on raw beta: on the H200 every prompt's first-token
    logprobs differed from eager; with this hook they match bit for bit."""
    upstream = KDAAttnBackend.forward_extend.__wrapped__
    assert _graph_extend_beta_is_raw(monkeypatch, upstream) is False
    assert _graph_extend_beta_is_raw(monkeypatch, KDAAttnBackend.forward_extend)


def test_an_eager_forward_never_runs_on_the_tables(monkeypatch):
    """Upstream's KDAAttnBackend.init_forward_metadata (every eager forward)
    drops the graph tables before the extend reads them."""
    kda = make_kda()
    _captured(kda)
    monkeypatch.setattr(
        MambaAttnBackendBase,
        "init_forward_metadata",
        lambda self, fb: setattr(
            self, "forward_metadata", SimpleNamespace(has_mamba_track_mask=False)
        ),
    )
    kda.init_forward_metadata(live_batch())
    assert kda.prefill_graph_metadata is None
    monkeypatch.setattr(
        UPSTREAM + "kda_extend_in_graph", lambda **kw: pytest.fail("used the tables")
    )
    kda.forward_metadata = None  # upstream's eager body fails on this stub
    _layer_cache(kda)
    with pytest.raises(AttributeError, match="query_start_loc"):
        kda.forward_extend(
            layer=SimpleNamespace(layer_id=0), forward_batch=live_batch(),
            mixed_qkv=torch.zeros(247, 8), a=None, b=None,
        )  # fmt: skip


@pytest.mark.parametrize(
    "setup, flag",
    [
        (lambda kda, mp: setattr(kda.kernel_dispatcher, "extend_kernel", object()),
         "--linear-attn-prefill-backend triton"),
        (lambda kda, mp: mp.setenv("SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND", "1"),
         "SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND"),
        (lambda kda, mp: setattr(kda, "accept_lens_pool", torch.ones(4)),
         "--linear-attn-verify-backend triton"),
    ],
)  # fmt: skip
def test_uncapturable_kda_extend_fails_at_capture(monkeypatch, setup, flag):
    kda = make_kda()
    setup(kda, monkeypatch)
    with pytest.raises(ValueError, match=flag) as err:
        _captured(kda)
    # Not "breakable": sglang's own rules refuse it for KDA outside GLM-5.3 Flash.
    assert "--cuda-graph-backend-prefill disabled" in str(err.value)
    assert kda.prefill_graph_metadata is None
