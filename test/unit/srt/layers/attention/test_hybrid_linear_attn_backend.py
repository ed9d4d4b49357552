"""HybridLinearAttnBackend and MambaAttnBackendBase under full prefill graphs:
the metadata call the full prefill runner makes before capture and before every
replay, the linear backends' CUDA-graph state (allocated once, guarded on
replay), and the wrapper's chunked-prefix capability."""

import contextlib
import random
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from gdn_stub import BUCKET, SLOTS_PER_GRAPH, capture_view, make_gdn
from kda_stub import make_kda, with_graph_lists
from mamba2_prefill_graph_cases import (
    SLOT_OF_ROW,
    capture_batch,
    graph_runtime,
    mamba2_backend,
    mismatches,
    random_case,
    recompute_segment_errors,
    replay_view,
    track_mismatches,
)
from mamba2_prefill_graph_cases import eager_metadata as mamba2_eager_metadata
from mamba2_prefill_graph_cases import live_batch as mamba2_live_batch
from mamba2_prefill_graph_cases import make_case as make_mamba2_case

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
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph import (
    TRACK_FINAL_STATE,
    TRACK_GRID_STATE,
    TRACK_RECOMPUTE_STATE,
    Mamba2FullGraphMetadata,
    track_rows,
)


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
    assert (
        gdn.full_prefill_graph_capture
        is gdn.full_prefill_graph_tables[BUCKET, SLOTS_PER_GRAPH]
    )


def test_plain_extend_on_kda_plans_full_attention_and_fills_kda_tables():
    kda = make_kda()
    hybrid = _hybrid(kda)
    hybrid.init_forward_metadata_out_graph(capture_view(), in_capture=True)
    assert hybrid.full_attn_backend.calls == [(ForwardMode.EXTEND, True)]
    # upstream's forward_extend runs kda_extend_in_graph on this
    assert (
        kda.prefill_graph_metadata
        is kda.full_prefill_graph_tables[BUCKET, SLOTS_PER_GRAPH]
    )


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
        # Mamba2 with its switch off: upstream path, as every other family
        (Mamba2AttnBackend, ForwardMode.EXTEND),
        (None, ForwardMode.DECODE),  # GDN decode graphs: upstream path
        (None, ForwardMode.TARGET_VERIFY),
        (KDAAttnBackend, ForwardMode.DECODE),  # KDA decode graphs: upstream path
    ],
)
def test_every_other_call_takes_the_upstream_path(monkeypatch, linear_cls, mode):
    monkeypatch.setattr(capability, "MAMBA2_FULL_PREFILL_GRAPH", False)
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


# --- Mamba2 under MAMBA2_FULL_PREFILL_GRAPH ----------------------------------
# The kernels run in test/unit/srt/layers/attention/mamba/test_mamba2_prefill_graph.py
# (Triton's interpreter, in a fresh process); here the metadata and the snapshot
# copies, in process.


@contextlib.contextmanager
def _mamba2_graph_runtime(case):
    with contextlib.ExitStack() as stack:
        for patch in graph_runtime(case):
            stack.enter_context(patch)
        yield


def _mamba2_captured_and_replayed(case, track):
    backend = mamba2_backend(case.chunk)
    hybrid = _hybrid(backend)
    hybrid.init_forward_metadata_out_graph(capture_batch(case, track), in_capture=True)
    captured = backend.forward_metadata
    backend.forward_metadata = None  # eager forwards in between replace it
    hybrid.init_forward_metadata_out_graph(
        replay_view(case, mamba2_live_batch(case)), in_capture=False
    )
    assert hybrid.full_attn_backend.calls == [
        (ForwardMode.EXTEND, True),
        (ForwardMode.EXTEND, False),
    ]
    return backend, captured


def test_mamba2_switch_ships_on():
    assert capability.MAMBA2_FULL_PREFILL_GRAPH is True


@pytest.mark.parametrize("conv_block_table", [False, True])
def test_plain_extend_on_mamba2_runs_on_the_buckets_static_metadata(
    conv_block_table, monkeypatch
):
    """Switch on: the runner's capture and replay calls give the Mamba2 backend
    one Mamba2FullGraphMetadata per bucket (the same object, refilled), which
    describes the replayed batch as sglang's eager Mamba2Metadata does (tables
    and snapshot plan checked against upstream's own builders) and has the
    fixed shapes MambaMixer2.forward launches over: R + 1 sequences, the whole
    bucket, no decodes, always initial states; with MAMBA2_CONV_BLOCK_TABLE,
    the conv's block table too (against upstream's KDA table fill)."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    monkeypatch.setattr(capability, "MAMBA2_CONV_BLOCK_TABLE", conv_block_table)
    rng = random.Random(7)
    cases = [random_case(rng) for _ in range(40)]
    assert any(c.tracked for c in cases) and any(not c.tracked for c in cases)
    K = [track_rows(c.bucket, c.slots, c.cache_chunk) for c in cases if c.tracked]
    assert 0 in K and any(0 < k < c.slots for k, c in zip(K, cases))
    for case in cases:
        with _mamba2_graph_runtime(case):
            backend, meta = _mamba2_captured_and_replayed(case, bool(case.tracked))
        assert backend.forward_metadata is meta
        assert (
            meta is backend.mamba2_full_prefill_graph_metadata[case.bucket, case.slots]
        )
        assert isinstance(meta, Mamba2FullGraphMetadata)
        assert not mismatches(case, meta.tables), vars(case)
        assert (meta.tables.conv_block_table is not None) is conv_block_table
        R, T = case.slots, case.bucket
        assert (meta.num_prefills, meta.num_prefill_tokens, meta.num_decodes) == (
            R + 1,
            T,
            0,
        )
        mixed = meta.mixed_metadata
        assert mixed.prep_initial_states and mixed.extend_seq_lens_cpu == [T] * (R + 1)
        assert meta.query_start_loc is meta.tables.query_start_loc
        assert meta.mamba_cache_indices is meta.tables.cache_indices
        K = track_rows(T, R, case.cache_chunk)
        if case.tracked and K:
            assert not track_mismatches(case, meta.track), vars(case)
            assert not recompute_segment_errors(meta.tables, meta.track), vars(case)
            assert meta.track.num_rows == K
            assert meta.has_mamba_track_mask
            assert meta.track_conv_indices is meta.track.conv_window
            assert meta.conv_states_mask_indices is meta.track.dst
            assert meta.track_ssm_seq_idx is meta.track.src
        else:
            assert meta.track is None and not meta.has_mamba_track_mask


def test_mamba2_replay_without_its_capture_fails_clearly():
    case = make_mamba2_case(4)
    with _mamba2_graph_runtime(case):
        backend = mamba2_backend(case.chunk)
        with pytest.raises(RuntimeError, match="no tables were captured"):
            _hybrid(backend).init_forward_metadata_out_graph(
                replay_view(case, mamba2_live_batch(case)), in_capture=False
            )


def _tracking_case(bucket, lens, tracked, cache_chunk=16):
    return SimpleNamespace(
        chunk=8, bucket=bucket, slots=4, lens=lens, prefix=[0] * len(lens),
        rows=list(range(1, len(lens) + 1)), tracked=tracked,
        track_lens=list(lens), track_dst=[100 + r for r in range(len(lens))],
        cache_chunk=cache_chunk,
    )  # fmt: skip


@pytest.mark.parametrize(
    "bucket, lens, tracked, capture_track, rows",
    [
        (40, [16, 16, 8], [True, True, False], True, 2),  # K = 40 // 16
        (12, [4, 8], [False, False], True, 0),  # under a cache chunk: none
        (40, [16, 16], [False, False], False, 0),  # captured without the buffer
    ],
)
def test_mamba2_replay_tracks_at_most_the_buckets_rows(
    bucket, lens, tracked, capture_track, rows
):
    """A bucket has track_rows snapshot rows (none under one cache chunk, none
    captured without a track mask); a replay that tracks more requests than
    that -- which sglang's scheduler never builds -- or whose count is not on
    the host is refused, naming the setting to change."""
    case = _tracking_case(bucket, lens, tracked)
    with _mamba2_graph_runtime(case):
        backend = mamba2_backend(case.chunk)
        hybrid = _hybrid(backend)
        hybrid.init_forward_metadata_out_graph(
            capture_batch(case, capture_track), in_capture=True
        )
        meta = backend.forward_metadata
        assert (meta.track.num_rows if meta.track else 0) == rows
        replay = replay_view(case, mamba2_live_batch(case))
        hybrid.init_forward_metadata_out_graph(replay, in_capture=False)
        over = [True] * (rows + 1) + [False] * (len(lens) - rows - 1)
        for mask_cpu in (over, None):
            replay.mamba_track_mask = torch.tensor(over)
            replay.mamba_prefill_track_mask_cpu = mask_cpu
            with pytest.raises(RuntimeError, match="prefill breakable"):
                hybrid.init_forward_metadata_out_graph(replay, in_capture=False)


def test_track_rows_cover_every_batch_sglangs_scheduler_tracks():
    """ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend (sglang's own
    code, with and without DCP) tracks a request only when its extend holds at
    least one mamba cache chunk, so a batch of T tokens tracks at most
    track_rows(T, R, cache chunk) requests."""
    from sglang.srt import runtime_context
    from sglang.srt.managers import schedule_batch

    rng = random.Random(3)
    seen = set()
    for dcp in (False, True):
        for _ in range(400):
            cache_chunk = rng.choice([64, 128, 256])
            page = rng.choice([1, 16, 64, cache_chunk, 2 * cache_chunk])
            prefix = rng.choice([0, rng.randint(0, 4 * cache_chunk)])
            extend = rng.randint(1, 3 * cache_chunk)
            req = SimpleNamespace(
                prefix_len=prefix, extend_len=extend, extend_end=prefix + extend,
                mamba_branching_seqlen=None,
                kv=SimpleNamespace(mamba_next_track_idx=5),
            )  # fmt: skip
            batch = SimpleNamespace(
                model_config=SimpleNamespace(
                    hf_text_config=SimpleNamespace(mamba_chunk_size=64)
                ),
                tree_cache=SimpleNamespace(page_size=page),
                req_to_token_pool=SimpleNamespace(
                    get_mamba_ping_pong_other_idx=lambda i: i + 1
                ),
            )
            exec_ctx = SimpleNamespace(
                mamba=SimpleNamespace(enable_mamba_extra_buffer_lazy=False)
            )
            with (
                mock.patch.object(
                    schedule_batch, "mamba_cache_chunk_size", lambda: cache_chunk
                ),
                mock.patch.object(
                    runtime_context, "mamba_cache_chunk_size", lambda: cache_chunk
                ),
                mock.patch.object(
                    schedule_batch,
                    "get_parallel",
                    lambda: SimpleNamespace(dcp_enabled=dcp),
                ),
                mock.patch.object(schedule_batch, "get_exec", lambda: exec_ctx),
            ):
                entry = schedule_batch.ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend(
                    batch, req
                )
            seen.add((dcp, entry.track_mask))
            if entry.track_mask:
                assert extend >= cache_chunk, (dcp, cache_chunk, page, prefix, extend)
                assert track_rows(extend, 1, cache_chunk) == 1
    assert seen == {(d, t) for d in (False, True) for t in (False, True)}


def _snapshot_inputs(case, seed):
    gen = torch.Generator().manual_seed(seed)
    chunks = -(-case.bucket // case.chunk)
    h = torch.randn(1, chunks, 2, 4, 4, generator=gen)
    # The SSD's recomputed state per sequence: the request slots, then the tail.
    track_states = torch.randn(1, case.slots + 1, 2, 4, 4, generator=gen)
    ssm = torch.randn(len(SLOT_OF_ROW) + 128, 2, 4, 4, generator=gen)
    return h, track_states, ssm


def test_mamba2_snapshots_on_graph_tables_equal_upstreams_track_copies():
    """Through Mamba2AttnBackend.forward (a layer whose MambaMixer2.forward
    returns given chunk states and the track rows' recomputed states): the snapshot
    copies on the graph metadata write every track slot as upstream's
    _track_mamba_state_extend does on the eager metadata of the same batch
    (the recomputed states of its recompute rows), and nothing else but the
    padding slot 0."""
    rng = random.Random(11)
    cases = [c for c in (random_case(rng) for _ in range(120)) if c.tracked]
    modes = set()
    for i, case in enumerate(cases):
        with _mamba2_graph_runtime(case):
            backend, meta = _mamba2_captured_and_replayed(case, track=True)
            h, track_states, ssm = _snapshot_inputs(case, i)
            eager_meta = mamba2_eager_metadata(case)
            eager = ssm.clone()
            if eager_meta.has_mamba_track_mask:
                rows = eager_meta.track_ssm_seq_idx
                backend._track_mamba_state_extend(
                    mamba2_live_batch(case), h, eager, eager_meta,
                    track_states=track_states[:, rows] if rows is not None else None,
                )  # fmt: skip
            graph = ssm.clone()
            # The SSD recomputes the track rows' sequences (the tail for fillers).
            graph_track = track_states[:, meta.track.src] if meta.track else None
            layer = SimpleNamespace(
                forward=lambda **kw: (kw["hidden_states"], h, graph_track)
            )
            backend.req_to_token_pool.mamba2_layer_cache = lambda layer_id: (
                SimpleNamespace(conv=[None], temporal=graph)
            )
            backend.forward(
                layer, torch.zeros(case.bucket, 4), None, layer_id=0,
                forward_batch=capture_batch(case, track=True),
            )  # fmt: skip
        if meta.track is not None:
            modes.update(meta.track.mode.tolist())
        assert torch.equal(graph[1:], eager[1:]), vars(case)
    assert {TRACK_FINAL_STATE, TRACK_GRID_STATE, TRACK_RECOMPUTE_STATE} <= modes


_TRACK_FIELDS = ("mamba_track_mask", "mamba_track_indices", "mamba_track_seqlens")


class _LaunchKeys:
    """Stands in for the table-fill kernel's Triton launch (grid[...](...)) and
    records what Triton compiles a kernel per: every tensor argument's dtype
    and the constexpr keywords."""

    def __init__(self):
        self.keys = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.keys.append(
                (
                    tuple(a.dtype for a in args if isinstance(a, torch.Tensor)),
                    tuple(sorted(kwargs.items())),
                )
            )

        return launch


def test_mamba2_replays_launch_the_table_fill_kernel_compiled_at_capture(
    monkeypatch,
):
    """A bucket's capture (its track inputs in sglang's own capture slots,
    build_prefill_registry: the tracked lengths int32) and its replays (the
    scheduler's batches: lengths int64, or nothing tracked) launch the
    table-fill kernel with one set of argument dtypes and constexprs, so no
    replay compiles it again after the server is ready (a served Nemotron-H
    full graph did, 2.92 s after it was ready, before the track inputs were
    given one dtype). The batch fields other than the track inputs are this
    module's stand-ins, not sglang's: a regression test for the track
    inputs' dtypes, not a model of the runner's buffers."""
    from sglang.srt.model_executor.cuda_graph_buffer_registry import (
        build_prefill_registry,
    )
    from sglang_graphfix.srt.layers.attention.mamba import mamba2_prefill_graph
    from sglang_graphfix_kernel import mamba2_prefill_tables

    launches = _LaunchKeys()
    monkeypatch.setattr(mamba2_prefill_tables, "_fill_mamba2_prefill_tables", launches)
    monkeypatch.setattr(mamba2_prefill_graph, "fills_on_device", lambda tables: True)
    case = _tracking_case(40, [16, 16, 8], [True, True, False])
    registry = build_prefill_registry(
        device=torch.device("cpu"),
        max_bs=case.slots,
        max_num_token=case.bucket,
        cache_loc_dtype=torch.int64,
        enable_mamba_track=True,
        share_pool=False,
    )
    capture = capture_batch(case, track=True)
    for name in _TRACK_FIELDS:
        setattr(
            capture, name, registry.get_slot(name).slice_for(case.slots, case.bucket)
        )
    assert capture.mamba_track_seqlens.dtype == torch.int32  # sglang's slot
    tracked = replay_view(case, mamba2_live_batch(case))
    assert tracked.mamba_track_seqlens.dtype == torch.int64  # as the scheduler's
    untracked = replay_view(case, mamba2_live_batch(case))
    for name in _TRACK_FIELDS:
        setattr(untracked, name, None)
    untracked.mamba_prefill_track_mask_cpu = None
    with _mamba2_graph_runtime(case):
        hybrid = _hybrid(mamba2_backend(case.chunk))
        hybrid.init_forward_metadata_out_graph(capture, in_capture=True)
        assert hybrid.linear_attn_backend.forward_metadata.track.num_rows == 2
        captured = set(launches.keys)
        for replay in (tracked, untracked):
            launches.keys.clear()
            hybrid.init_forward_metadata_out_graph(replay, in_capture=False)
            assert len(launches.keys) == 1
            assert set(launches.keys) <= captured, (launches.keys, captured)
