"""GDN full prefill graph tables on CPU: what a replay refills, checked against
sglang's own eager helpers (FLA chunk indices/offsets, the eager track plan and
conv-window indices of MambaAttnBackendBase)."""

from types import SimpleNamespace

import pytest
import torch
from gdn_stub import (
    BUCKET,
    CHUNK,
    LENS,
    MAPPING,
    SLOTS_PER_GRAPH,
    TRACK_DST,
    WINDOW,
    capture_view,
    live_batch,
    live_batch_without_first_chunk_track,
    make_gdn,
    replay_view,
)
from tiny_configs import write_config

from sglang.kernels.ops.attention.fla.index import (
    prepare_chunk_indices,
    prepare_chunk_offsets,
)
from sglang.kernels.ops.mamba.causal_conv1d_triton import (
    CAUSAL_CONV1D_FWD_BLOCK_M,
    PAD_SLOT_ID,
)
from sglang.kernels.ops.mamba.kda_prefill_track import (
    TRACK_CHUNK_STATE,
    TRACK_FINAL_STATE,
    TRACK_NONE,
)
from sglang.srt.arg_groups.overrides import model_config_of
from sglang.srt.layers.attention.attention_registry import attn_backend_wrapper
from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase
from sglang.srt.layers.attention.linear.kernels import gdn_flashinfer
from sglang.srt.model_executor.runner_utils.prefill_graph import prefill_graph_scope
from sglang.srt.runtime_context import create_context, use_context
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.cli import simulated_gpu
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention.linear import gdn_backend as ours
from sglang_graphfix.srt.layers.attention.linear import gdn_prefill_graph


def _captured_then_replayed(backend):
    ours.prepare_full_prefill_graph_tables(backend, capture_view(), in_capture=True)
    live = live_batch()
    meta = ours.prepare_full_prefill_graph_tables(
        backend, replay_view(live), in_capture=False
    )
    assert (
        meta
        is backend.full_prefill_graph_tables[BUCKET, SLOTS_PER_GRAPH]
        is backend.full_prefill_graph_capture
    )
    return meta, live


def test_replay_tables_describe_the_real_batch():
    meta, _ = _captured_then_replayed(make_gdn())
    cu_real = torch.tensor([0, 37, 137, 247])
    n = len(LENS)
    assert meta.max_seqs == SLOTS_PER_GRAPH and meta.num_tokens == BUCKET
    assert meta.cu_seqlens.tolist() == [0, 37, 137, 247, 247]
    assert int(meta.num_logical_tokens) == 247
    eager_chunks = prepare_chunk_indices(cu_real, CHUNK)
    assert meta.chunk_indices[: len(eager_chunks)].tolist() == eager_chunks.tolist()
    assert (
        meta.chunk_indices[len(eager_chunks) :, 1] >= BUCKET
    ).all()  # past every sequence
    assert (
        meta.chunk_offsets[: n + 1].tolist()
        == prepare_chunk_offsets(cu_real, CHUNK).tolist()
    )
    assert meta.cache_indices.tolist() == [5, 9, 2, PAD_SLOT_ID]
    assert meta.has_initial_state.tolist() == [False, True, True, False]
    blocks = [
        (s, b)
        for s, length in enumerate(LENS)
        for b in range(-(-length // CAUSAL_CONV1D_FWD_BLOCK_M))
    ]
    assert [tuple(r) for r in meta.conv_block_table[: len(blocks)].tolist()] == blocks
    assert (meta.conv_block_table[len(blocks) :, 0] == PAD_SLOT_ID).all()


def test_replay_track_rows_match_the_eager_track_plan():
    """The rows a replay tracks, on Triton's chunk states (the tables the captured
    extend's layers read, build_forward_tables), equal sglang's eager track plan
    on the same batch: chunk-state source rows, final-state slots, conv windows
    and their destinations."""
    backend = make_gdn()
    meta, live = _captured_then_replayed(backend)
    slots = backend.req_to_token_pool.get_mamba_indices(live.req_pool_indices)
    (_, h_src, h_dst, _, final_src, final_dst, *_) = (
        MambaAttnBackendBase._init_track_ssm_indices_from_cpu(backend, slots, live)
    )
    modes = meta.track_mode.tolist()
    chunk_rows = [r for r, m in enumerate(modes) if m == TRACK_CHUNK_STATE]
    final_rows = [r for r, m in enumerate(modes) if m == TRACK_FINAL_STATE]
    assert chunk_rows == [0, 2] and final_rows == [1]
    tables = gdn_prefill_graph.build_forward_tables(
        meta, flashinfer=False, conv_window=WINDOW, device="cpu"
    )
    assert tables.ssm_rows[chunk_rows].tolist() == h_src.tolist()
    assert meta.track_dst[chunk_rows].tolist() == h_dst.tolist()
    assert meta.cache_indices[final_rows].tolist() == final_src.tolist()
    assert meta.track_dst[final_rows].tolist() == final_dst.tolist()

    qsl = torch.tensor([0, 37, 137, 247], dtype=torch.int32)
    eager_windows = MambaAttnBackendBase._init_track_conv_indices(
        backend, qsl, live, torch.arange(3)
    )
    rows, dst = tables.conv_rows, tables.conv_dst
    assert rows[:3].tolist() == eager_windows.tolist()
    assert dst.tolist() == TRACK_DST + [
        0
    ]  # the untracked pad row writes the padding slot
    assert modes[3] == TRACK_NONE


def test_capture_tables_track_nothing():
    backend = make_gdn()
    meta = ours.prepare_full_prefill_graph_tables(
        backend, capture_view(), in_capture=True
    )
    assert meta.track  # the track copies are recorded for replays that track
    assert meta.track_mode.tolist() == [TRACK_NONE] * SLOTS_PER_GRAPH
    assert meta.cu_seqlens.tolist() == [0, BUCKET, BUCKET, BUCKET, BUCKET]


@pytest.mark.parametrize(
    "backend_kwargs, page_major, flag",
    [
        ({"extend_kernel": object()}, False, "--linear-attn-prefill-backend triton"),
        ({"enable_mis": True}, False, "--enable-mis"),
        ({}, True, "--enable-page-major-kv-layout"),
    ],
)
def test_uncapturable_gdn_extend_fails_at_capture(
    monkeypatch, backend_kwargs, page_major, flag
):
    monkeypatch.setattr(
        capability,
        "get_memory",
        lambda: SimpleNamespace(enable_page_major_kv_layout=page_major),
    )
    with pytest.raises(ValueError, match=flag) as err:
        ours.prepare_full_prefill_graph_tables(
            make_gdn(**backend_kwargs), capture_view(), in_capture=True
        )
    assert "--cuda-graph-backend-prefill disabled" in str(err.value)


def _layer_cache_backend():
    backend = make_gdn()
    caches = {
        0: SimpleNamespace(
            conv=[torch.zeros(5, 8, WINDOW)], temporal=torch.zeros(5, 2, 4, 4)
        )
    }
    backend.req_to_token_pool.mamba2_layer_cache = caches.__getitem__
    ours.prepare_full_prefill_graph_tables(backend, capture_view(), in_capture=True)
    return backend, caches[0]


def test_forward_extend_runs_on_the_tables_inside_a_full_prefill_graph(monkeypatch):
    backend, cache = _layer_cache_backend()
    calls = []
    monkeypatch.setattr(
        ours, "gdn_extend_in_graph", lambda **kw: calls.append(kw) or "in-graph"
    )
    layer = SimpleNamespace(layer_id=0)
    x, a, b = torch.zeros(BUCKET, 8), torch.zeros(BUCKET, 2), torch.zeros(BUCKET, 2)
    with prefill_graph_scope(full_graph=True):
        out = backend.forward_extend(
            layer=layer, forward_batch=capture_view(), mixed_qkv=x, a=a, b=b
        )
        assert out == "in-graph"
        assert calls[0]["meta"] is backend.full_prefill_graph_capture
        assert (
            calls[0]["conv_states"] is cache.conv[0]
            and calls[0]["ssm_states"] is cache.temporal
        )
        with pytest.raises(RuntimeError, match="hold 256 tokens"):
            backend.forward_extend(
                layer=layer, forward_batch=capture_view(), mixed_qkv=x[:128], a=a, b=b
            )


@pytest.mark.parametrize("scope", [None, False])
def test_forward_extend_is_upstream_outside_a_full_prefill_graph(monkeypatch, scope):
    backend, _ = _layer_cache_backend()
    monkeypatch.setattr(
        ours, "gdn_extend_in_graph", lambda **kw: pytest.fail("used the tables")
    )
    backend.forward_metadata = None  # upstream's eager body fails on this stub
    kwargs = dict(layer=SimpleNamespace(layer_id=0), forward_batch=capture_view(),
                  mixed_qkv=torch.zeros(BUCKET, 8), a=None, b=None)  # fmt: skip
    with pytest.raises(AttributeError, match="query_start_loc"):
        if scope is None:
            backend.forward_extend(**kwargs)
        else:
            with prefill_graph_scope(full_graph=scope):
                backend.forward_extend(**kwargs)


class _Built(Exception):
    """Stops attn_backend_wrapper where it constructs the GDN backend."""


@pytest.mark.parametrize(
    "prefill_graph, capture_sm, kernel",
    [("full", None, "triton"), ("full", 90, "flashinfer"), ("full", 100, "triton"),
     ("breakable", None, "flashinfer")],
)  # fmt: skip
def test_gdn_prefill_kernel_sglang_picks_under_each_prefill_graph(
    tmp_path, monkeypatch, caplog, prefill_graph, capture_sm, kernel
):
    """sglang's attn_backend_wrapper asks flashinfer_gdn_prefill_default for the
    GDN prefill kernel of a Qwen3-Next on an H200 (resolved and published as a
    scheduler does; only the hardware probes answered): FlashInfer, unless the
    prefill graph is full and FlashInfer's capture is off (capture_sm None) or
    meant for another GPU (the shipped 90 on an SM100): then the Triton kernels
    the graph captures."""
    monkeypatch.setattr(capability, "FLASHINFER_GDN_CAPTURE_SM", capture_sm)
    args = ServerArgs(
        model_path=write_config("qwen3_next", tmp_path / "qwen3_next"),
        cuda_graph_backend_prefill=prefill_graph,
        attention_backend="flashinfer",
    )
    with simulated_gpu("h200"):
        args.resolve_once()
        context = create_context(args, role="scheduler")
    built = {}

    def gdn_backend(runner):
        built["backends"] = runner.linear_attn_backends
        raise _Built

    upstream = "sglang.srt.layers.attention.linear.gdn_backend."
    monkeypatch.setattr(upstream + "GDNAttnBackend", gdn_backend)
    monkeypatch.setattr(upstream + "is_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    monkeypatch.setattr(
        "sglang.srt.layers.attention.linear.kernels.gdn_flashinfer."
        "is_flashinfer_gdn_prefill_available",
        lambda: True,
    )
    fp32_state = SimpleNamespace(temporal=torch.zeros(1, dtype=torch.float32))
    runner = SimpleNamespace(
        model_config=model_config_of(args),
        use_mla_backend=False,
        req_to_token_pool=SimpleNamespace(
            mamba_pool=SimpleNamespace(mamba_cache=fp32_state)
        ),
    )
    with simulated_gpu("h200"), use_context(context), pytest.raises(_Built):
        attn_backend_wrapper(runner, object())
    assert built["backends"].prefill.value == kernel
    assert ("Keeping the Triton GDN prefill kernel" in caplog.text) == (
        kernel == "triton"
    )


# ---- FlashInfer GDN prefill inside the graph (sglang's default on SM90) ----


def _replayed_without_first_chunk_track(backend, track_row0=False):
    """The live batch replayed on a captured bucket, its row 0 (tracked inside its
    first chunk) untracked unless ``track_row0``."""
    ours.prepare_full_prefill_graph_tables(backend, capture_view(), in_capture=True)
    live = live_batch_without_first_chunk_track(track_row0)
    meta = ours.prepare_full_prefill_graph_tables(
        backend, replay_view(live), in_capture=False
    )
    return meta, live


def test_flashinfer_snapshot_rows_match_sglangs_eager_checkpoint_plan(monkeypatch):
    """The rows of FlashInfer's chunk-boundary snapshots the captured extend copies
    to the track slots equal sglang's eager plan (maybe_build_flashinfer_checkpoint_plan,
    on the same batch), as do the per-row snapshot starts. Row 0 is untracked
    here: its track point lies in its first chunk, which the eager FlashInfer
    plan refuses ("precedes the first FlashInfer checkpoint")."""
    monkeypatch.setattr(gdn_flashinfer, "mamba_cache_chunk_size", lambda: CHUNK)
    backend = make_gdn()
    meta, live = _replayed_without_first_chunk_track(backend)
    slots = backend.req_to_token_pool.get_mamba_indices(live.req_pool_indices)
    (_, h_src, h_dst, *_) = MambaAttnBackendBase._init_track_ssm_indices_from_cpu(
        backend, slots, live
    )
    plan = SimpleNamespace(track_ssm_h_src=h_src, track_ssm_h_dst=h_dst)
    gdn_flashinfer.maybe_build_flashinfer_checkpoint_plan(live, plan, "cpu")
    chunk_rows = [
        r for r, m in enumerate(meta.track_mode.tolist()) if m == TRACK_CHUNK_STATE
    ]
    tables = gdn_prefill_graph.build_forward_tables(
        meta, flashinfer=True, conv_window=WINDOW, device="cpu"
    )
    starts = tables.checkpoint_starts
    assert starts[: len(LENS) + 1].tolist() == plan.state_checkpoint_cu_starts.tolist()
    assert (starts[len(LENS) :] == plan.num_state_checkpoints).all()  # padding rows
    rows = tables.ssm_rows
    assert chunk_rows == [2]
    assert rows[chunk_rows].tolist() == plan.track_ssm_h_src.tolist()


class _RecordingFlashInferKernel(gdn_flashinfer.FlashInferGDNKernel):
    """FlashInferGDNKernel whose prefill function (FlashInfer's
    chunk_gated_delta_rule, no GPU here) records its arguments and keeps its state
    contract: a sequence with tokens gets a final state (here its initial state
    plus its length); a zero-length one's rows, initial and final, are neither
    read nor written (its final row is left NaN here, as uninitialised memory)."""

    def __init__(self):
        self.calls = []
        self._prefill_fn = self._prefill

    def _prefill(self, **kwargs):
        self.calls.append(kwargs)
        initial, final = kwargs["initial_state"], kwargs["output_state"]
        final.fill_(float("nan"))
        for row, n in enumerate(kwargs["cu_seqlens"].diff().tolist()):
            if n:
                final[row] = initial[row] + n
        if kwargs["state_checkpoints"] is not None:
            kwargs["state_checkpoints"].zero_()
        return kwargs["output"], final


def test_captured_extend_runs_the_flashinfer_kernel_on_the_tables(monkeypatch):
    """gdn_extend_in_graph with the backend's FlashInfer prefill kernel: it gets
    the bucket's cu_seqlens (int64), fp32 alpha = exp(g) and beta, one snapshot
    per 64 tokens of the bucket at the table's per-row starts, and a zeroed
    output (tokens past the batch stay zero); the rows past the batch reach it as
    zeros whatever the bucket's buffers held there (here NaN). Only the real
    requests' states move: each real slot's state comes back updated, the padding
    request slot (-1) reads and writes no pool slot, so the reserved padding slot
    stays zero and every other slot keeps its value."""
    meta, _ = _replayed_without_first_chunk_track(make_gdn())
    assert meta.cache_indices.tolist() == [5, 9, 2, PAD_SLOT_ID]
    kernel = _RecordingFlashInferKernel()
    launched = {}
    _stub_kernels_around_flashinfer(monkeypatch, launched)
    out, ssm, a, b, real = _flashinfer_extend(meta, kernel)
    (call,) = kernel.calls
    assert torch.equal(call["cu_seqlens"], meta.cu_seqlens.long())
    assert call["cu_seqlens"].dtype == torch.int64
    assert call["state_checkpoints"].shape == (BUCKET // CHUNK, 2, 128, 128)
    assert call["checkpoint_every_n_tokens"] == CHUNK
    assert call["checkpoint_cu_starts"].tolist() == [0, 0, 1, 2, 2]
    assert call["initial_state"].dtype == torch.float32
    assert torch.equal(call["initial_state"][:3, 0, 0, 0], torch.tensor([5.0, 9, 2]))
    assert out.shape == (1, BUCKET, 2, 128) and not out.any()
    expected = _slot_markers(ssm.shape)
    for slot, n in zip(MAPPING[1:], LENS):
        expected[slot] += n
    assert torch.equal(ssm, expected)  # real slots updated, no other slot touched
    q, k, v, alpha, beta = (call[n] for n in ("q", "k", "v", "g", "beta"))
    for t in (q, k, v, beta):
        assert torch.isfinite(t).all() and not t[real:].any()
    assert alpha.dtype == beta.dtype == torch.float32
    assert torch.equal(alpha[:real], a[:real].exp()) and (alpha[real:] == 1).all()
    assert torch.equal(beta[:real], b[:real])
    # The tracked chunk states come from the snapshots, one row per table row.
    assert launched["kda_track_ssm_state"]["h_track"].shape == (
        SLOTS_PER_GRAPH,
        2,
        128,
        128,
    )


def test_a_state_tracked_before_the_first_snapshot_fails_loudly(monkeypatch):
    """sglang's eager FlashInfer plan raises for a tracked state inside a row's
    first chunk; the captured extend asserts on the device (never copies another
    row's snapshot into the prefix cache)."""
    _stub_kernels_around_flashinfer(monkeypatch, {})
    meta, _ = _replayed_without_first_chunk_track(make_gdn(), track_row0=True)
    with pytest.raises(RuntimeError):
        _flashinfer_extend(meta, _RecordingFlashInferKernel())


def _stub_kernels_around_flashinfer(monkeypatch, launched):
    """The Triton kernels around the FlashInfer call, as CPU stand-ins: the conv,
    the gating and the q/k l2-norm pass their input through; the track copies
    record. The state-row copies run (their torch path off CUDA)."""
    monkeypatch.setattr(
        gdn_prefill_graph, "causal_conv1d_fn", lambda x, *a, **kw: x.clone()
    )
    monkeypatch.setattr(
        gdn_prefill_graph,
        "chunk_gated_delta_rule_on_tables",
        lambda *a: pytest.fail("ran the Triton chunk kernels"),
    )
    monkeypatch.setattr(gdn_prefill_graph, "fused_gdn_gating", lambda *a: (a[1], a[2]))
    monkeypatch.setattr(
        gdn_prefill_graph, "gdn_prefill_qkv_prepare_fwd", lambda q, k, v: (q, k, v)
    )
    monkeypatch.setattr(gdn_prefill_graph, "MAX_FUSED_QKV_SPLIT_DIM", 0)
    for name in ("_snapshot_conv_windows", "kda_track_ssm_state"):
        monkeypatch.setattr(
            gdn_prefill_graph, name, lambda *a, _n=name, **kw: launched.update({_n: kw})
        )


def _flashinfer_extend(meta, kernel):
    """gdn_extend_in_graph with ``kernel`` on a 1-key-head / 2-value-head layer;
    the rows past the batch of its inputs are NaN, as garbage would be."""
    hk, hv, d = 1, 2, 128
    layer = SimpleNamespace(
        conv_weights=None, bias=None, activation="silu", A_log=None, dt_bias=None,
        num_q_heads=hk, num_k_heads=hk, num_v_heads=hv,
        head_q_dim=d, head_k_dim=d, head_v_dim=d,
        q_dim=hk * d, k_dim=hk * d, v_dim=hv * d,
    )  # fmt: skip
    ssm = _slot_markers((16, hv, d, d))
    real = sum(LENS)
    mixed = torch.randn(BUCKET, (2 * hk + hv) * d)
    a, b = torch.randn(BUCKET, hv), torch.rand(BUCKET, hv)
    for t in (mixed, a, b):
        t[real:] = float("nan")
    conv = torch.zeros(16, (2 * hk + hv) * d, WINDOW)  # the conv is stubbed
    out = gdn_prefill_graph.gdn_extend_in_graph(
        layer=layer, meta=meta, conv_states=conv, ssm_states=ssm, mixed_qkv=mixed,
        a=a, b=b, extend_kernel=kernel,
    )  # fmt: skip
    return out, ssm, a, b, real


def _slot_markers(shape) -> torch.Tensor:
    """A state pool whose slot s holds s everywhere: slot 0, the reserved padding
    slot, holds zeros."""
    return (
        torch.arange(shape[0], dtype=torch.float32)
        .view(-1, 1, 1, 1)
        .expand(shape)
        .clone()
    )


@pytest.mark.parametrize(
    "bucket, end, zeroed",
    [(BUCKET, 16, CHUNK), (BUCKET, 250, 6), (BUCKET, BUCKET, 0), (16, 5, 11)],
)
def test_only_the_rows_flashinfer_reads_past_the_batch_are_zeroed(bucket, end, zeroed):
    """GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY's in-place zeroing: of the rows
    past a batch of ``end`` tokens, the 64 that FlashInfer's tiles can load
    (clamped to the bucket) become zero; the batch's rows and those beyond the
    kernel's reach are left as they were (a full bucket: none changes)."""
    meta = SimpleNamespace(num_logical_tokens=torch.tensor([end], dtype=torch.int32))
    x = torch.randn(bucket, 8)
    x[end:] = float("nan")
    before = x.clone()
    gdn_prefill_graph.zero_rows_in_kernel_reach(
        x, *gdn_prefill_graph.kernel_reach_rows(meta, bucket)
    )
    assert torch.equal(x[:end], before[:end])
    assert not x[end : end + zeroed].any()
    assert x[end + zeroed :].isnan().all()


def test_the_zeroed_reach_is_flashinfers_tile():
    """The rows zeroed past the batch are FlashInfer's GDN prefill tile, which
    its SM90 kernels load from each sequence's start."""
    from flashinfer.gdn_kernels.delta_rule_dsl import varlen_helper

    assert gdn_prefill_graph.FLASHINFER_GDN_TILE_ROWS == varlen_helper.BLK == CHUNK


def test_the_reach_only_zeroing_ships_on():
    """On since its GPU check (test/gpu/test_gdn_extend_kernel.py's
    flashinfer_reach, benchmark/results/gpu/gdn_extend_2026-12-07d/)."""
    assert capability.GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY is True


@pytest.mark.parametrize("reach_only", [True, False])
def test_the_flashinfer_kernel_reads_no_garbage_past_the_batch(monkeypatch, reach_only):
    """The captured extend, with GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY (the
    in-place zeroing of the rows its tiles reach) or without (the whole-output
    mask): the FlashInfer kernel's q/k/v are zero in the rows past the batch
    that its tiles load (here the bucket's last 9 rows, all of them within
    reach), from a conv output NaN there."""
    monkeypatch.setattr(
        capability, "GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY", reach_only
    )
    meta, _ = _replayed_without_first_chunk_track(make_gdn())
    kernel = _RecordingFlashInferKernel()
    _stub_kernels_around_flashinfer(monkeypatch, {})
    zeroed = []
    real_zero = gdn_prefill_graph.zero_rows_in_kernel_reach
    monkeypatch.setattr(
        gdn_prefill_graph,
        "zero_rows_in_kernel_reach",
        lambda x, *reach: (zeroed.append(x.shape), real_zero(x, *reach)),
    )
    _, _, _, _, real = _flashinfer_extend(meta, kernel)
    (call,) = kernel.calls
    assert zeroed == ([(BUCKET, 4 * 128)] if reach_only else [])
    assert BUCKET - real < CHUNK  # every row past the batch is within reach
    for t in (call["q"], call["k"], call["v"]):
        assert torch.isfinite(t).all() and not t[real : real + CHUNK].any()


# ---- GDN_TABLES_ONCE_PER_FORWARD: what the layers derive, built once a forward ----


class _MarkedCheckpointsKernel(_RecordingFlashInferKernel):
    """The recording kernel, whose chunk-boundary snapshot i holds i + 1: which
    snapshot a tracked row copies shows in its track state."""

    def _prefill(self, **kwargs):
        out, final = super()._prefill(**kwargs)
        checkpoints = kwargs["state_checkpoints"]
        if checkpoints is not None:
            checkpoints.copy_(_slot_markers(checkpoints.shape) + 1)
        return out, final


def _another_batch_view():
    """A replay of another batch on the bucket: 70, 64 and 110 tokens, row 0
    untracked, row 1 tracked at a chunk boundary, row 2 inside its second chunk
    (whose snapshot row moves with row 0's full chunk)."""
    live = live_batch()
    lens = [70, 64, 110]
    live.extend_seq_lens_cpu, live.extend_seq_lens = lens, torch.tensor(lens)
    live.extend_num_tokens = sum(lens)
    live.mamba_prefill_track_mask_cpu = [False, True, True]
    live.mamba_track_mask = torch.tensor(live.mamba_prefill_track_mask_cpu)
    view = replay_view(live)
    view.extend_seq_lens = torch.tensor([*lens, 0])
    return view


def _forwards_through_the_backend(monkeypatch, once_per_forward, num_layers=3):
    """The GDN backend's captured extend (sglang's forward_extend, under a full
    prefill graph) over ``num_layers`` layers, one forward per batch: the
    bucket's tables refilled for each batch, as before a replay. Per forward and
    layer, what the FlashInfer kernel and the track copy got; and how often the
    layers' derived tables were built. The GPU's SM is simulated (an H200)."""
    monkeypatch.setattr(capability, "GDN_TABLES_ONCE_PER_FORWARD", once_per_forward)
    monkeypatch.setattr(gdn_flashinfer, "mamba_cache_chunk_size", lambda: CHUNK)
    launched = {}
    _stub_kernels_around_flashinfer(monkeypatch, launched)
    builds = []
    real_build = gdn_prefill_graph.build_forward_tables
    monkeypatch.setattr(
        gdn_prefill_graph,
        "build_forward_tables",
        lambda *a, **kw: builds.append(1) or real_build(*a, **kw),
    )
    kernel = _MarkedCheckpointsKernel()
    backend = make_gdn(extend_kernel=kernel)
    hk, hv, d = 1, 2, 128
    caches = {
        i: SimpleNamespace(
            conv=[torch.zeros(16, (2 * hk + hv) * d, WINDOW)],
            temporal=_slot_markers((16, hv, d, d)),
        )
        for i in range(num_layers)
    }
    backend.req_to_token_pool.mamba2_layer_cache = caches.__getitem__
    with simulated_gpu("h200"):  # FlashInfer's GDN prefill captures on SM90
        ours.prepare_full_prefill_graph_tables(backend, capture_view(), in_capture=True)
    seen = []
    first = replay_view(live_batch_without_first_chunk_track())
    for view in (first, _another_batch_view()):
        ours.prepare_full_prefill_graph_tables(backend, view, in_capture=False)
        builds.clear()
        for i in range(num_layers):
            layer = SimpleNamespace(
                layer_id=i, conv_weights=None, bias=None, activation="silu",
                A_log=None, dt_bias=None, num_q_heads=hk, num_k_heads=hk,
                num_v_heads=hv, head_q_dim=d, head_k_dim=d, head_v_dim=d,
                q_dim=hk * d, k_dim=hk * d, v_dim=hv * d,
            )  # fmt: skip
            x = torch.randn(BUCKET, (2 * hk + hv) * d)
            a, b = torch.randn(BUCKET, hv), torch.rand(BUCKET, hv)
            with prefill_graph_scope(full_graph=True):
                backend.forward_extend(
                    layer=layer, forward_batch=view, mixed_qkv=x, a=a, b=b
                )
            call = kernel.calls[-1]
            seen.append(
                {
                    "cu_seqlens": call["cu_seqlens"].tolist(),
                    "checkpoint_starts": call["checkpoint_cu_starts"].tolist(),
                    "tracked": launched["kda_track_ssm_state"]["h_track"][:, 0, 0, 0],
                }
            )
        seen[-1]["builds"] = len(builds)
    return seen, backend


def test_the_layers_tables_built_once_per_forward_equal_each_layers_own(monkeypatch):
    """GDN_TABLES_ONCE_PER_FORWARD: over forwards on refilled tables (two
    batches), every layer's FlashInfer call and track copy get what each layer's
    own tables give (the second batch's, not the first's, in the second forward:
    a layer reading tables its forward's first layer did not rebuild would
    differ), and the tables are built once a forward instead of once a layer."""
    each, _ = _forwards_through_the_backend(monkeypatch, once_per_forward=False)
    with pytest.MonkeyPatch.context() as patch:
        once, backend = _forwards_through_the_backend(patch, once_per_forward=True)
    assert isinstance(
        backend.full_prefill_graph_forward_tables,
        gdn_prefill_graph.ForwardTablesMemo,
    )
    assert [s.get("builds") for s in each] == [None, None, 3, None, None, 3]
    assert [s.get("builds") for s in once] == [None, None, 1, None, None, 1]
    for mine, theirs in zip(once, each):
        assert mine["cu_seqlens"] == theirs["cu_seqlens"]
        assert mine["checkpoint_starts"] == theirs["checkpoint_starts"]
        assert torch.equal(mine["tracked"], theirs["tracked"])
    assert each[0]["cu_seqlens"] != each[3]["cu_seqlens"]  # the batches differ
    assert not torch.equal(each[0]["tracked"], each[3]["tracked"])


def test_the_memo_rebuilds_at_its_builder_and_keeps_each_tables_own():
    """ForwardTablesMemo: the layer that built a bucket's tables rebuilds them
    (its next forward), the others read them; another tables object has its
    own; the backend starts a fresh memo at every capture, not at a replay."""
    memo = gdn_prefill_graph.ForwardTablesMemo()
    a, b, spec = object(), object(), {"flashinfer": True}
    built = iter(range(100))
    assert memo.get(a, 0, spec, lambda: next(built)) == 0
    assert memo.get(a, 1, spec, lambda: next(built)) == 0  # read
    assert memo.get(b, 0, spec, lambda: next(built)) == 1  # other tables
    assert memo.get(a, 2, spec, lambda: next(built)) == 0
    assert memo.get(a, 0, spec, lambda: next(built)) == 2  # a's next forward
    assert memo.get(a, 1, spec, lambda: next(built)) == 2
    assert memo.get(b, 1, spec, lambda: next(built)) == 1
    backend = make_gdn()
    ours.prepare_full_prefill_graph_tables(backend, capture_view(), in_capture=True)
    first = backend.full_prefill_graph_forward_tables
    ours.prepare_full_prefill_graph_tables(
        backend, replay_view(live_batch()), in_capture=False
    )
    assert backend.full_prefill_graph_forward_tables is first  # a replay keeps it
    ours.prepare_full_prefill_graph_tables(backend, capture_view(), in_capture=True)
    assert backend.full_prefill_graph_forward_tables is not first


def test_the_memo_refuses_a_stale_read_and_tables_built_another_way():
    """A layer reading twice without the builder rebuilding in between (the
    forward's first GDN layer changed) and a layer asking for tables built
    another way raise instead of reading what the builder left."""
    memo = gdn_prefill_graph.ForwardTablesMemo()
    meta, spec = object(), {"flashinfer": True, "conv_window": 3}
    memo.get(meta, 0, spec, lambda: "tables")
    memo.get(meta, 1, spec, lambda: "rebuilt")
    with pytest.raises(RuntimeError, match="reads its forward's tables twice"):
        memo.get(meta, 1, spec, lambda: "rebuilt")
    with pytest.raises(RuntimeError, match="built them as"):
        memo.get(meta, 2, {**spec, "conv_window": 4}, lambda: "rebuilt")


def test_the_tables_once_per_forward_ship_off():
    """Off until a GPU runs it (GDN_TABLES_ONCE_PER_FORWARD's comment)."""
    assert capability.GDN_TABLES_ONCE_PER_FORWARD is False


def test_the_tables_every_layer_derived_are_31_ops_on_flashinfer_14_on_triton():
    """The device ops GDN_TABLES_ONCE_PER_FORWARD saves a layer (the figure its
    comment quotes): build_forward_tables' calls at torch's dispatcher, views
    left out, on a replayed tracking bucket."""
    from torch.utils._python_dispatch import TorchDispatchMode

    views = {"view", "unsqueeze", "slice", "select", "expand", "alias"}

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += func.overloadpacket.__name__ not in views
            return func(*args, **(kwargs or {}))

    counts = {}
    for flashinfer in (True, False):
        meta, _ = _replayed_without_first_chunk_track(make_gdn())
        with Count() as count:
            gdn_prefill_graph.build_forward_tables(
                meta, flashinfer=flashinfer, conv_window=WINDOW, device="cpu"
            )
        counts[flashinfer] = count.ops
    assert counts == {True: 31, False: 14}
