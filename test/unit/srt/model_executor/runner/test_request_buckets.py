"""Request buckets of a Mamba2 full prefill graph, through sglang's own
PrefillCudaGraphRunner.capture_one_shape (FullCudaGraphBackend.capture_one
filing each graph) and PrefillCudaGraphRunner._shape_key: a token bucket up to
REQUEST_BUCKET_MAX_TOKENS captures a graph over all request slots and one per
request bucket below them, the linear side's tables of each over its own slots
(the full-attention side plans every slot), and a batch of fewer requests
replays, and refills the tables of, the smallest that holds it; and the
graphs over one request slot above that bound (Mamba2's, and GDN's on
FlashInfer's prefill, GDN_SINGLE_REQUEST_GRAPHS). Only the hardware is stood in
for: the capture batch (capture_prepare builds it on the
GPU), the model forward and torch's CUDA graph."""

import contextlib
import logging
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from mamba2_backend_cases import hybrid_of
from mamba2_prefill_graph_cases import (
    capture_batch,
    graph_runtime,
    live_batch,
    mamba2_backend,
    replay_view,
)

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
    PrefillCudaGraphRunner,
)
from sglang.srt.model_executor.runner.shape_key import ShapeKey
from sglang.srt.model_executor.runner_backend import full_cuda_graph_backend
from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import (
    FullCudaGraphBackend,
)
from sglang.srt.runtime_context import get_parallel
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention import hybrid_linear_attn_backend as ours
from sglang_graphfix.srt.model_executor.runner import (
    prefill_cuda_graph_runner as runner_hooks,
)

SLOTS, CHUNK = 8, 16


def _case(bucket, lens=(), track=False):
    """mamba2_prefill_graph_cases' batch description for a bucket of SLOTS."""
    n = len(lens)
    return SimpleNamespace(
        chunk=CHUNK, bucket=bucket, slots=SLOTS, lens=list(lens), prefix=[0] * n,
        rows=list(range(1, n + 1)), tracked=[False] * n if track else None,
        track_lens=list(lens), track_dst=[100 + r for r in range(n)],
        cache_chunk=2 * CHUNK,
    )  # fmt: skip


class _FullAttn:
    """The full-attention child: the request slots of every plan."""

    def __init__(self):
        self.planned = []

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        self.planned.append(forward_batch.batch_size)

    def on_after_cuda_graph_warmup(self):
        pass


class _Graph:
    """torch.cuda.CUDAGraph's stand-in (none without a GPU)."""


@pytest.fixture(autouse=True)
def no_dp_attention():
    """sglang's parallel context as a TP-only server publishes it (the runner's
    DP-attention checks read it)."""
    with get_parallel().override(attn_dp_enabled=False):
        yield


def _full_runner(hybrid, slots, capture_prepare, tables_slots):
    """sglang's PrefillCudaGraphRunner on its FullCudaGraphBackend, over ``hybrid``
    with ``slots`` request slots: ``capture_prepare(num_tokens)`` builds the
    capture batch, and each captured forward records ``tables_slots()`` (the
    request slots of the linear side's tables it would launch on) in
    ``runner.captured_slots``."""
    runner = PrefillCudaGraphRunner.__new__(PrefillCudaGraphRunner)
    runner._is_full_backend = True
    runner._capture_req_slots = slots
    runner._capture_chunked_prefix = runner._capture_lora = False
    runner.max_context_size = None
    runner.enable_cp_bcg_capture = False
    runner.model_runner = SimpleNamespace(
        attn_backend=hybrid,
        is_draft_worker=False,
        model=SimpleNamespace(),
        model_config=SimpleNamespace(context_len=4096),
    )
    runner.track = False
    runner.capture_prepare = lambda num_tokens: (capture_prepare(num_tokens), hybrid)
    runner.captured_slots = []

    def run_forward(forward_batch, num_tokens):
        runner.captured_slots.append(tables_slots())
        return torch.zeros(num_tokens, 4)

    runner._run_forward = run_forward
    backend = FullCudaGraphBackend.__new__(FullCudaGraphBackend)
    backend._graphs, backend._outputs = {}, {}
    backend._pool = backend._capture_stream = backend._memory_saver_adapter = None
    backend._cuda_graph_runner = runner
    backend._device_module = SimpleNamespace(
        synchronize=lambda: None, graph=lambda **kw: contextlib.nullcontext()
    )
    backend._tp_group = SimpleNamespace(barrier=lambda: None)
    backend._precarve = full_cuda_graph_backend.GraphPoolPrecarve()
    backend._precarve.minted = True
    backend._reuse_output_buffer = False
    runner.backend = backend
    return runner


@pytest.fixture
def runner(monkeypatch):
    """A full prefill runner of a Mamba2 hybrid with SLOTS request slots, on
    sglang's FullCudaGraphBackend."""
    with contextlib.ExitStack() as stack:
        for patch in graph_runtime(_case(64)):
            stack.enter_context(patch)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
        linear = mamba2_backend(CHUNK)
        hybrid = hybrid_of(linear, _FullAttn())

        def capture_prepare(num_tokens):
            batch = capture_batch(_case(num_tokens), runner.track)
            # As sglang's: requests of at most the model's context length.
            context = runner.model_runner.model_config.context_len
            lens = [min(context, num_tokens - s) for s in range(0, num_tokens, context)]
            lens += [0] * (SLOTS - len(lens))
            batch.extend_seq_lens = torch.tensor(lens)
            batch.extend_seq_lens_cpu = lens
            batch.lora_ids = batch.global_num_tokens_gpu = None
            return batch

        runner = _full_runner(
            hybrid,
            SLOTS,
            capture_prepare,
            lambda: linear.forward_metadata.tables.max_requests,
        )
        yield runner


def _variant(slots):
    return None if slots is None else f"request_slots:{slots}"


def test_a_bucket_captures_a_graph_per_request_bucket(runner, caplog):
    caplog.set_level(logging.INFO, logger=runner_hooks.__name__)
    PrefillCudaGraphRunner.capture_one_shape(runner, 64)
    assert set(runner.backend._graphs) == {
        ShapeKey(size=64, attention_variant=_variant(r)) for r in (None, 1, 2, 4)
    }
    # Each graph's linear tables over its own request slots; the full-attention
    # side plans every slot for each of them.
    assert runner.captured_slots == [SLOTS] * 3 + [r for r in (1, 2, 4) for _ in "123"]
    hybrid = runner.model_runner.attn_backend
    assert hybrid.full_attn_backend.planned == [SLOTS] * 4
    assert getattr(hybrid, ours.REQUEST_BUCKETS) == {64: (1, 2, 4)}
    assert getattr(hybrid, ours.CAPTURE_REQUEST_SLOTS) is None
    PrefillCudaGraphRunner.capture_one_shape(runner, 16)  # the next, smaller bucket
    assert getattr(hybrid, ours.REQUEST_BUCKETS) == {64: (1, 2, 4), 16: (1, 2, 4)}
    logged = [
        r.getMessage() for r in caplog.records if "request buckets" in r.getMessage()
    ]
    assert logged == [
        "Full prefill CUDA graph request buckets: token buckets up to 64 tokens "
        "also capture graphs over 1/2/4 request slots; a batch of fewer requests "
        "than the graph's 8 replays the smallest that holds it."
    ]


def _replayed(runner, case):
    """sglang's replay preparation for the live batch of ``case``: the runner's
    key (PrefillCudaGraphRunner._shape_key) and the metadata refill on its
    slot-padded view (PrefillCudaGraphRunner._prepare_forward_metadata_for_replay,
    after load_batch's static-buffer fill, done here as load_batch does it)."""
    live = live_batch(case)
    live.seq_lens_cpu = live.seq_lens.clone()
    live.extend_seq_lens_cpu = list(case.lens)
    bs, R = len(case.lens), SLOTS
    static = {name: torch.zeros(R, dtype=torch.int64) for name in (
        "seq_lens", "extend_seq_lens", "extend_prefix_lens", "req_pool_indices")}  # fmt: skip
    for name in static:
        static[name][:bs] = getattr(live, name)
    runner._prefill_static_buffers = static
    runner._full_cg_seq_lens_cpu = torch.zeros(R, dtype=torch.int64)
    static_batch = SimpleNamespace(
        input_ids=torch.zeros(case.bucket, dtype=torch.int64), max_seq_len_override=None
    )
    live.extend_prefix_lens_cpu = list(case.prefix)
    live.dp_prefill_cuda_graph_max_prefix_len = 0
    key = runner._shape_key(case.bucket, live)
    hybrid = runner.model_runner.attn_backend
    hybrid.resolve_prefill_shared_read_ends = lambda *a, **k: None
    runner._prepare_forward_metadata_for_replay(live, static_batch, key)
    return key, hybrid.linear_attn_backend.forward_metadata


@pytest.mark.parametrize(
    "requests, slots", [(1, 1), (2, 2), (3, 4), (4, 4), (5, None), (SLOTS, None)]
)
@pytest.mark.parametrize("track", [False, True])
def test_a_batch_replays_the_smallest_request_bucket_that_holds_it(
    runner, requests, slots, track
):
    runner.track = track
    PrefillCudaGraphRunner.capture_one_shape(runner, 128)
    case = _case(128, lens=[5] * (requests - 1) + [40], track=track)
    if track:  # the last request extends a whole cache chunk: tracked
        case.tracked[-1] = True
    key, meta = _replayed(runner, case)
    assert key == ShapeKey(size=128, attention_variant=_variant(slots))
    assert key in runner.backend._graphs
    # The linear side refilled the tables of that graph; the full-attention
    # side planned every slot.
    linear = runner.model_runner.attn_backend.linear_attn_backend
    assert meta is linear.mamba2_full_prefill_graph_metadata[128, slots or SLOTS]
    assert runner.model_runner.attn_backend.full_attn_backend.planned[-1] == SLOTS
    if track:
        assert meta.track.src[0] == requests - 1  # the tracked request, packed first


def test_track_tables_follow_the_request_bucket(runner):
    """With the mamba extra buffer, a bucket's track rows are counted over its
    graph's request slots (track_rows: at most one per request)."""
    runner.track = True
    PrefillCudaGraphRunner.capture_one_shape(runner, 128)  # 4 cache chunks
    linear = runner.model_runner.attn_backend.linear_attn_backend
    rows = {
        slots: meta.track.num_rows
        for (_, slots), meta in linear.mamba2_full_prefill_graph_metadata.items()
    }
    assert rows == {SLOTS: 4, 1: 1, 2: 2, 4: 4}


def _one_request():
    return SimpleNamespace(
        batch_size=1,
        extend_seq_lens_cpu=[5],
        extend_prefix_lens_cpu=[0],
        dp_prefill_cuda_graph_max_prefix_len=0,
    )


@pytest.mark.parametrize(
    "setting",
    [
        {"max_context_size": 256},  # a fixed context size
        {"attn_dp_enabled": True},  # DP attention (sglang's parallel context)
        {"_capture_chunked_prefix": True},
    ],
)
def test_no_request_buckets_where_not_checked(runner, setting):
    for name, value in setting.items():
        if name != "attn_dp_enabled":
            setattr(runner, name, value)
    with get_parallel().override(attn_dp_enabled="attn_dp_enabled" in setting):
        PrefillCudaGraphRunner.capture_one_shape(runner, 64)
    assert set(runner.backend._graphs) == {ShapeKey(size=64)}
    hybrid = runner.model_runner.attn_backend
    assert not hasattr(hybrid, ours.REQUEST_BUCKETS)
    assert runner._shape_key(64, _one_request()) == ShapeKey(size=64)


def test_breakable_graphs_keep_upstreams_keys(runner):
    PrefillCudaGraphRunner.capture_one_shape(runner, 64)  # as full: buckets recorded
    runner._is_full_backend = False
    assert runner._shape_key(64, _one_request()) == ShapeKey(size=64)


def test_request_buckets_hold_the_capture_batchs_requests(runner):
    """A context shorter than the bucket: sglang's capture batch holds two
    requests, so the bucket has no graph over one slot."""
    runner.model_runner.model_config.context_len = 40
    PrefillCudaGraphRunner.capture_one_shape(runner, 64)
    assert set(runner.backend._graphs) == {
        ShapeKey(size=64, attention_variant=_variant(r)) for r in (None, 2, 4)
    }


def test_buckets_above_the_token_bound_capture_one_graph(runner):
    # Without the one-slot graphs (MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS: 0).
    bound = capability.REQUEST_BUCKET_MAX_TOKENS
    with mock.patch.object(capability, "MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS", 0):
        PrefillCudaGraphRunner.capture_one_shape(runner, 2 * bound)
    assert set(runner.backend._graphs) == {ShapeKey(size=2 * bound)}
    assert runner._shape_key(2 * bound, _one_request()) == ShapeKey(size=2 * bound)


def test_single_request_graphs_above_the_bound(runner, caplog):
    """MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS: a token bucket above
    REQUEST_BUCKET_MAX_TOKENS, up to it, also captures a graph over one request
    slot (its linear tables, and so its track rows, over that slot); a batch of
    one long request replays it, two requests the graph over all slots. Each
    tier is logged once; a bucket above the setting captures one graph."""
    caplog.set_level(logging.INFO, logger=runner_hooks.__name__)
    bound = capability.REQUEST_BUCKET_MAX_TOKENS
    runner.track = True
    with (
        mock.patch.object(
            capability, "MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS", 4 * bound
        ),
        mock.patch.object(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", None),
    ):
        PrefillCudaGraphRunner.capture_one_shape(runner, 8 * bound)  # above it
        PrefillCudaGraphRunner.capture_one_shape(runner, 4 * bound)
        PrefillCudaGraphRunner.capture_one_shape(runner, 2 * bound)
        PrefillCudaGraphRunner.capture_one_shape(runner, 64)
        assert set(runner.backend._graphs) == {
            ShapeKey(size=8 * bound),
            *(ShapeKey(size=b, attention_variant=_variant(r))
              for b in (4 * bound, 2 * bound) for r in (None, 1)),
            *(ShapeKey(size=64, attention_variant=_variant(r)) for r in (None, 1, 2, 4)),
        }  # fmt: skip
        linear = runner.model_runner.attn_backend.linear_attn_backend
        meta = linear.mamba2_full_prefill_graph_metadata
        assert meta[2 * bound, 1].track.num_rows == 1
        assert meta[2 * bound, SLOTS].track.num_rows == SLOTS
        one = _case(2 * bound, lens=[2 * bound - 24])
        key, replayed = _replayed(runner, one)
        assert key == ShapeKey(size=2 * bound, attention_variant=_variant(1))
        assert replayed is meta[2 * bound, 1]
        two = _case(2 * bound, lens=[bound, bound - 24])
        assert _replayed(runner, two)[0] == ShapeKey(size=2 * bound)
    logged = [
        r.getMessage() for r in caplog.records if "request buckets" in r.getMessage()
    ]
    assert logged == [
        f"Full prefill CUDA graph request buckets: token buckets above {bound} up "
        f"to {4 * bound} tokens also capture a graph over 1 request slot "
        "(MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS); a batch of one request replays it.",
        "Full prefill CUDA graph request buckets: token buckets up to 64 tokens "
        "also capture graphs over 1/2/4 request slots; a batch of fewer requests "
        "than the graph's 8 replays the smallest that holds it.",
    ]


def test_single_request_graphs_stop_where_one_request_runs_eager(runner):
    """Not above MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST (a batch of one request of
    more tokens runs eager: such a graph would never replay), nor with one
    request slot (the graph over all slots is that graph)."""
    bound = capability.REQUEST_BUCKET_MAX_TOKENS
    with (
        mock.patch.object(
            capability, "MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS", 8 * bound
        ),
        mock.patch.object(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", 2 * bound),
    ):
        for size in (4 * bound, 2 * bound):
            PrefillCudaGraphRunner.capture_one_shape(runner, size)
        assert set(runner.backend._graphs) == {
            ShapeKey(size=4 * bound),
            ShapeKey(size=2 * bound),
            ShapeKey(size=2 * bound, attention_variant=_variant(1)),
        }
        runner.backend._graphs.clear()
        runner._capture_req_slots = 1
        PrefillCudaGraphRunner.capture_one_shape(runner, 2 * bound)
        assert set(runner.backend._graphs) == {ShapeKey(size=2 * bound)}


def test_single_request_graphs_ship_up_to_the_length_bound():
    """On since a tiny engine's graph vs eager with them passed and a served
    one-slot graph beat breakable up to 1536 tokens (the setting's comment): as
    far as MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST, above which a batch of one
    request runs eager and such a graph would never replay."""
    assert capability.MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS == 1536
    assert capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST == 1536


def test_request_buckets_ship_on():
    """On since an H200 served them (MAMBA2_REQUEST_BUCKETS_CAPTURED's comment)."""
    assert capability.MAMBA2_REQUEST_BUCKETS_CAPTURED is True


def test_switched_off_a_bucket_captures_one_graph(runner):
    # mock.patch, as the fixture's graph_runtime: restored in order.
    with mock.patch.object(capability, "MAMBA2_REQUEST_BUCKETS_CAPTURED", False):
        PrefillCudaGraphRunner.capture_one_shape(runner, 64)
        assert set(runner.backend._graphs) == {ShapeKey(size=64)}
        assert runner._shape_key(64, _one_request()) == ShapeKey(size=64)


def test_a_replay_on_other_request_slots_than_captured_fails_clearly(runner):
    """The per-graph stores are keyed by (tokens, request slots): a batch padded
    to other slots than any graph of its bucket finds no tables."""
    PrefillCudaGraphRunner.capture_one_shape(runner, 64)
    case = _case(64, lens=[5] * 6)
    case.slots = 6  # captured: 8 (and the request buckets 1, 2, 4)
    with pytest.raises(RuntimeError, match="64-token bucket with 6 request slots"):
        runner.model_runner.attn_backend.init_forward_metadata_out_graph(
            replay_view(case, live_batch(case)), in_capture=False
        )


def test_request_buckets_stay_below_the_slots_and_the_tokens():
    linear = mamba2_backend(CHUNK)
    with mock.patch.object(capability, "MAMBA2_REQUEST_BUCKETS_CAPTURED", True):
        assert ours.capture_request_buckets(linear, 4, 16) == (1, 2)
        assert ours.capture_request_buckets(linear, 64, 16) == (1, 2, 4, 8)
        assert ours.capture_request_buckets(linear, 64, 2) == (1,)
        with mock.patch.object(capability, "MAMBA2_REQUEST_BUCKETS", ()):
            assert ours.capture_request_buckets(linear, 64, 16) == ()


def test_other_families_capture_one_graph_per_bucket():
    from gdn_stub import make_gdn
    from kda_stub import make_kda

    from sglang.srt.layers.attention.linear.short_conv_backend import (
        ShortConvAttnBackend,
    )

    short_conv = ShortConvAttnBackend.__new__(ShortConvAttnBackend)
    with mock.patch.object(capability, "MAMBA2_REQUEST_BUCKETS_CAPTURED", True):
        assert ours.capture_request_buckets(mamba2_backend(CHUNK), 64, 16)
        for linear in (make_gdn(), make_kda(), short_conv):
            assert ours.capture_request_buckets(linear, 64, 16) == ()


def test_a_capture_batch_beyond_the_request_bucket_fails_clearly(runner):
    hybrid = runner.model_runner.attn_backend
    setattr(hybrid, ours.CAPTURE_REQUEST_SLOTS, 1)
    batch = capture_batch(_case(64), False)
    batch.extend_seq_lens_cpu = [32, 32] + [0] * (SLOTS - 2)
    with pytest.raises(RuntimeError, match="holds 2 requests, more than the 1"):
        hybrid.init_forward_metadata_out_graph(batch, in_capture=True)
    assert batch.forward_mode == ForwardMode.EXTEND


def _gdn_capture_view(num_tokens):
    """gdn_stub's capture batch for a bucket of ``num_tokens``: one request over
    it, zero-length request slots after it."""
    from gdn_stub import SLOTS_PER_GRAPH, capture_view

    batch = capture_view()
    lens = [num_tokens] + [0] * (SLOTS_PER_GRAPH - 1)
    batch.input_ids = torch.zeros(num_tokens, dtype=torch.int64)
    batch.extend_seq_lens, batch.extend_seq_lens_cpu = torch.tensor(lens), lens
    batch.logical_forward_mode, batch.spec_info = ForwardMode.EXTEND, None
    batch.lora_ids = batch.global_num_tokens_gpu = None
    return batch


@pytest.fixture
def gdn_runner(monkeypatch, request):
    """A full prefill runner of a GDN hybrid (gdn_stub's backend, 4 request
    slots) whose prefill kernel is FlashInfer's (``kernel``: its class), on
    sglang's FullCudaGraphBackend."""
    from gdn_stub import CHUNK as CHUNK_GDN
    from gdn_stub import SLOTS_PER_GRAPH, make_gdn

    from sglang.srt.layers.attention.linear.kernels.gdn_flashinfer import (
        FlashInferGDNKernel,
    )
    from sglang_graphfix.srt.layers.attention.linear import (
        kda_prefill_graph as linear_tables,
    )

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    # The runtime context a scheduler publishes, as the Mamba2 runner's.
    for patch in graph_runtime(_case(64)):
        patch.start()
        request.addfinalizer(patch.stop)
    monkeypatch.setattr(linear_tables, "mamba_cache_chunk_size", lambda: CHUNK_GDN)

    def build(kernel=FlashInferGDNKernel):
        linear = make_gdn(extend_kernel=kernel.__new__(kernel))
        hybrid = hybrid_of(linear, _FullAttn())
        return _full_runner(
            hybrid,
            SLOTS_PER_GRAPH,
            _gdn_capture_view,
            lambda: linear.full_prefill_graph_capture.max_seqs,
        )

    return build


def _gdn_one_request_view(bucket, n):
    """_prepare_forward_metadata_for_replay's slot-padded view of one request of
    ``n`` tokens (pool row 1, no prefix) in the ``bucket``."""
    batch = _gdn_capture_view(bucket)
    lens = [n, 0, 0, 0]
    batch.extend_seq_lens, batch.extend_seq_lens_cpu = torch.tensor(lens), lens
    batch.extend_prefix_lens_cpu = [0, 0, 0, 0]
    batch.req_pool_indices = torch.tensor([1, 0, 0, 0])
    batch.mamba_track_mask = None
    return batch


def test_gdn_on_flashinfer_captures_one_slot_graphs_above_the_bound(gdn_runner, caplog):
    """GDN_SINGLE_REQUEST_GRAPHS: on FlashInfer's GDN prefill, a token bucket
    above REQUEST_BUCKET_MAX_TOKENS also captures a graph over one request slot
    (its GDN tables over that slot, so FlashInfer gets one sequence and picks its
    algorithm as for one eager prompt); a batch of one request replays it and
    refills those tables, two requests the graph over all slots. Smaller
    buckets capture one graph; the log names the setting."""
    caplog.set_level(logging.INFO, logger=runner_hooks.__name__)
    bound = capability.REQUEST_BUCKET_MAX_TOKENS
    runner = gdn_runner()
    with mock.patch.object(capability, "GDN_SINGLE_REQUEST_GRAPHS", True):
        PrefillCudaGraphRunner.capture_one_shape(runner, 2 * bound)
        PrefillCudaGraphRunner.capture_one_shape(runner, 64)
    assert set(runner.backend._graphs) == {
        ShapeKey(size=2 * bound),
        ShapeKey(size=2 * bound, attention_variant=_variant(1)),
        ShapeKey(size=64),
    }
    assert sorted(set(runner.captured_slots)) == [1, 4]
    hybrid = runner.model_runner.attn_backend
    linear = hybrid.linear_attn_backend
    assert set(linear.full_prefill_graph_tables) == {
        (2 * bound, 4), (2 * bound, 1), (64, 4)
    }  # fmt: skip
    one = _gdn_one_request_view(2 * bound, 2 * bound - 24)
    assert runner._shape_key(2 * bound, one) == ShapeKey(
        size=2 * bound, attention_variant=_variant(1)
    )
    hybrid.init_forward_metadata_out_graph(one, in_capture=False)
    meta = linear.full_prefill_graph_tables[2 * bound, 1]
    assert meta.cu_seqlens.tolist() == [0, 2 * bound - 24]
    two = _gdn_one_request_view(2 * bound, bound)
    two.extend_seq_lens_cpu = [bound, bound - 24, 0, 0]
    assert runner._shape_key(2 * bound, two) == ShapeKey(size=2 * bound)
    logged = [
        r.getMessage() for r in caplog.records if "request buckets" in r.getMessage()
    ]
    assert logged == [
        f"Full prefill CUDA graph request buckets: token buckets above {bound} up "
        f"to {2 * bound} tokens also capture a graph over 1 request slot "
        "(GDN_SINGLE_REQUEST_GRAPHS); a batch of one request replays it."
    ]


@pytest.mark.parametrize("kernel", ["flashinfer switched off", "triton"])
def test_gdn_captures_one_graph_per_bucket_otherwise(gdn_runner, kernel):
    """Switched off (as shipped), or on sglang's Triton GDN prefill (whose
    launches do not depend on the sequences it is handed): one graph a bucket."""
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel

    bound = capability.REQUEST_BUCKET_MAX_TOKENS
    triton = kernel == "triton"
    runner = gdn_runner(TritonGDNKernel) if triton else gdn_runner()
    with mock.patch.object(capability, "GDN_SINGLE_REQUEST_GRAPHS", triton):
        PrefillCudaGraphRunner.capture_one_shape(runner, 2 * bound)
    assert set(runner.backend._graphs) == {ShapeKey(size=2 * bound)}
    one = _gdn_one_request_view(2 * bound, 2 * bound - 24)
    assert runner._shape_key(2 * bound, one) == ShapeKey(size=2 * bound)


def test_gdn_single_request_graphs_ship_off():
    """Off until a served full graph with them is not slower than without
    (GDN_SINGLE_REQUEST_GRAPHS' comment)."""
    assert capability.GDN_SINGLE_REQUEST_GRAPHS is False
    with mock.patch.object(capability, "GDN_SINGLE_REQUEST_GRAPHS", True):
        assert capability.gdn_request_buckets(1024, 16) == (1,)
        assert capability.gdn_request_buckets(512, 16) == ()  # the bound
        assert capability.gdn_request_buckets(1024, 1) == ()  # already one slot
        assert capability.gdn_request_buckets(1024, 16, 512) == ()  # 2 requests
