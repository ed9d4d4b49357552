"""Full prefill graph routing: sglang's own PrefillCudaGraphRunner.can_run_graph
decides graph or eager for each prefill batch and the engine counts the path
(PREFILL_PATHS, logged); once the graph has captured, the eager batches of a GDN
model run sglang's default prefill kernel (FlashInfer on SM90/SM100, chosen by
sglang's own GDNKernelDispatcher) while the captured graphs keep the Triton
tables path, and the routing rule is logged once."""

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch
from gdn_stub import make_gdn  # noqa: E402

from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
    Mamba2AttnBackend,
)
from sglang.srt.layers.attention.linear import gdn_backend as upstream_gdn
from sglang.srt.layers.attention.linear.kernels import gdn_flashinfer
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.layers.attention.linear.utils import (
    LinearAttnBackends,
    LinearAttnKernelBackend,
)
from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardMode,
)
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
    PrefillCudaGraphRunner,
)
from sglang.srt.runtime_context import get_parallel
from sglang_graphfix.srt.layers.attention.linear.gdn_backend import (
    EAGER_GDN_PREFILL_DEFAULT,
)
from sglang_graphfix.srt.model_executor.runner import prefill_cuda_graph_runner as ours

SLOTS, BUCKETS = 2, [16, 64, 256, 512]


def _runner(linear=None):
    """A full prefill runner after capture (the fields can_run_graph reads)."""
    runner = PrefillCudaGraphRunner.__new__(PrefillCudaGraphRunner)
    runner._is_full_backend = True
    runner.prefill_backend_name = Backend.FULL
    runner._capture_req_slots = SLOTS
    runner.capture_num_tokens = BUCKETS
    runner.max_num_tokens = max(BUCKETS)
    runner.max_context_size = runner.max_seq_len = None
    runner._captured_attn_metadata_max_bs = None
    runner.enable_lora = False
    runner.has_mha_companion_layers = False
    runner._capture_chunked_prefix = False
    runner.capture_hidden_mode = CaptureHiddenMode.NULL
    runner.enable_cp_bcg_capture = False
    hybrid = HybridLinearAttnBackend.__new__(HybridLinearAttnBackend)
    hybrid.linear_attn_backend = linear or make_gdn()
    runner.model_runner = SimpleNamespace(attn_backend=hybrid)
    return runner


def _batch(lens):
    return SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        global_forward_mode=ForwardMode.EXTEND,
        batch_size=len(lens),
        input_ids=torch.zeros(sum(lens), dtype=torch.int64),
        global_num_tokens_cpu=None,
        input_embeds=None,
        replace_embeds=None,
        extend_prefix_lens_cpu=[0] * len(lens),
        capture_hidden_mode=CaptureHiddenMode.NULL,
        return_logprob=False,
        contains_mm_inputs=lambda: False,
    )


@pytest.fixture(autouse=True)
def no_dp_attention():
    """sglang's parallel context as a TP-only server publishes it (the runner's
    DP-attention checks read it)."""
    with get_parallel().override(attn_dp_enabled=False):
        yield


@pytest.fixture(autouse=True)
def fresh_counter():
    ours.PREFILL_PATHS.reset()
    yield ours.PREFILL_PATHS


def test_the_hooks_wrap_upstreams_methods():
    assert PrefillCudaGraphRunner.can_run_graph.__wrapped__.__qualname__ == (
        "PrefillCudaGraphRunner.can_run_graph"
    )
    from sglang_graphfix import patches

    (routing,) = [
        p for p in patches.PATCHES if p.hook is ours.route_full_prefill_fallback
    ]
    assert routing.target.endswith("PrefillCudaGraphRunner.capture")
    assert patches.patch_applied(routing)


def test_each_prefill_batch_counts_its_path(caplog, fresh_counter):
    runner = _runner()
    caplog.set_level(logging.INFO, logger=ours.__name__)
    verdicts = [
        runner.can_run_graph(_batch(lens))
        for lens in ([16], [30, 30], [8, 8, 8], [600], [100, 100], [5] * 9, [20])
    ]
    assert verdicts == [True, True, False, False, True, False, False]
    assert fresh_counter.graph == 3
    assert fresh_counter.eager == {
        f"more than {SLOTS} requests": 2,
        "more than 512 tokens": 1,
        # sglang's padding limit: 20 tokens would pad to the 64-token bucket
        "under 1/2 of the smallest bucket that fits (64 tokens)": 1,
    }
    # One INFO line on the first eager batch of each reason, with the summary.
    first = [r.getMessage() for r in caplog.records if "first eager" in r.getMessage()]
    assert len(first) == 3
    assert "more than 2 requests" in first[0] and "2 full graph, 1 eager" in first[0]
    # A speculative verify batch that reaches the prefill runner (sglang's
    # forward sends it there above the decode graph's sizes) is no prefill.
    verify = _batch([5] * 9)
    verify.forward_mode = verify.global_forward_mode = ForwardMode.TARGET_VERIFY
    assert not runner.can_run_graph(verify)
    assert fresh_counter.total == 7


def test_a_batch_below_the_smallest_bucket_replays_it_on_hybrid_models(fresh_counter):
    """sglang's padding limit sent every batch under half the smallest bucket
    eager: with its default buckets (4, 8, ...) each one-token prefill
    (/health_generate, a prompt cached but for its last token). Under a hybrid
    model's full graph it replays the smallest bucket (one of at most
    SMALL_BATCH_REPLAY_MAX_BUCKET tokens); models without linear attention and
    breakable graphs keep sglang's rule."""
    runner = _runner()
    assert [runner.can_run_graph(_batch(lens)) for lens in ([1], [7], [3, 4])] == [
        True,
        True,
        True,
    ]
    assert (fresh_counter.graph, fresh_counter.eager) == (3, {})
    # The other conditions still hold, and name themselves: too many requests
    # for the slots, input embeddings.
    assert not runner.can_run_graph(_batch([1, 1, 1]))
    embeds = _batch([1])
    embeds.input_embeds = torch.zeros(1, 8)
    assert not runner.can_run_graph(embeds)
    assert fresh_counter.eager == {
        f"more than {SLOTS} requests": 1,
        "other replay condition": 1,
    }
    fresh_counter.reset()

    # A smallest bucket above SMALL_BATCH_REPLAY_MAX_BUCKET keeps sglang's rule.
    large = _runner()
    large.capture_num_tokens = [32, 64, 256, 512]
    assert ours.capability.SMALL_BATCH_REPLAY_MAX_BUCKET < 32
    assert not large.can_run_graph(_batch([15]))
    assert large.can_run_graph(_batch([16]))

    attention_only = _runner()
    attention_only.model_runner = SimpleNamespace(attn_backend=SimpleNamespace())
    assert not attention_only.can_run_graph(_batch([7]))
    assert fresh_counter.eager == {
        "under 1/2 of the smallest bucket that fits (32 tokens)": 1,
        "under 1/2 of the smallest bucket that fits (16 tokens)": 1,
    }

    breakable = _runner()
    breakable._is_full_backend = False
    breakable.prefill_backend_name = Backend.BREAKABLE
    assert not breakable.can_run_graph(_batch([7]))
    assert breakable.can_run_graph(_batch([9]))


def _mamba2_runner():
    return _runner(Mamba2AttnBackend.__new__(Mamba2AttnBackend))


def test_long_prefills_per_request_run_eager_under_a_mamba2_full_graph(
    monkeypatch, fresh_counter
):
    """MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST (1536 as shipped; None: every batch
    the buckets hold replays) sends a Mamba2 full graph's batch of more new
    tokens per request eager, through sglang's own can_run_graph; GDN full
    graphs and breakable graphs keep sglang's rule."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    assert capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST == 1536
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", None)
    runner = _mamba2_runner()
    assert runner.can_run_graph(_batch([500]))
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", 200)
    verdicts = [
        runner.can_run_graph(_batch(lens))
        for lens in ([200], [201], [150, 250], [220, 200], [1], [600])
    ]
    assert verdicts == [True, False, True, False, True, False]
    assert fresh_counter.eager == {
        "more than 200 new tokens per request on average": 2,
        "more than 512 tokens": 1,  # sglang's largest bucket comes first
    }
    assert fresh_counter.graph == 4  # the one before the limit was set, and 3
    assert not runner.can_replay_locally(**_replay_args(batch_size=1, num_tokens=201))
    assert runner.can_replay_locally(**_replay_args(batch_size=2, num_tokens=400))
    # Unknown counts go to upstream's judgement.
    assert runner.can_replay_locally(**_replay_args(batch_size=0, num_tokens=201))
    assert runner.can_replay_locally(**_replay_args(batch_size=1, num_tokens=None))
    # The limit judges the batch's own tokens, before
    # replay_small_batches_in_smallest_bucket pads a tiny batch to the smallest
    # bucket (16 tokens here): one token under a limit of 8 replays.
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", 8)
    assert runner.can_run_graph(_batch([1]))
    assert not runner.can_run_graph(_batch([9]))
    # Under DP attention a rank votes on its own tokens and replays on the
    # tokens padded across ranks: the limit is not applied there.
    dp = _mamba2_runner()
    # sglang all-gathers no MLP input with --moe-dense-tp-size 1
    # --enable-dp-lm-head and an a2a backend, but the forward's tokens are
    # still padded across the DP ranks.
    dp.require_mlp_tp_gather = False
    with get_parallel().override(attn_dp_enabled=True):
        assert dp.can_replay_locally(**_replay_args(batch_size=1, num_tokens=201))

    assert _runner().can_run_graph(_batch([500]))  # GDN
    breakable = _mamba2_runner()
    breakable._is_full_backend = False
    breakable.prefill_backend_name = Backend.BREAKABLE
    assert breakable.can_run_graph(_batch([500]))


def _replay_args(batch_size, num_tokens):
    return dict(
        batch_size=batch_size,
        num_tokens=num_tokens,
        input_embeds=None,
        replace_embeds=None,
        prefix_lens=[0] * batch_size,
        is_target_verify=False,
        capture_hidden_mode=None,
        return_logprob=False,
    )


def test_breakable_graphs_count_nothing(fresh_counter):
    runner = _runner()
    runner._is_full_backend = False
    runner.prefill_backend_name = Backend.BREAKABLE
    runner.can_run_graph(_batch([16]))
    assert fresh_counter.total == 0


def test_summary_every_n_batches(caplog, fresh_counter, monkeypatch):
    monkeypatch.setattr(ours.PrefillPathCounter, "SUMMARY_EVERY", 4)
    caplog.set_level(logging.INFO, logger=ours.__name__)
    runner = _runner()
    for _ in range(8):
        runner.can_run_graph(_batch([16]))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "Prefill paths: 4 full graph, 0 eager",
        "Prefill paths: 8 full graph, 0 eager",
    ]


# --- after capture: sglang's default eager GDN kernel, warmed; the rule logged


class _FlashInferGDNKernel:
    """sglang's FlashInferGDNKernel on CPU: records the warm-up extend."""

    supports_target_verify = True
    uses_state_checkpoints = True
    calls = []

    def extend(
        self,
        q,
        k,
        v,
        g,
        beta,
        *,
        ssm_states,
        cache_indices,
        query_start_loc,
        state_checkpoint_cu_starts=None,
        num_state_checkpoints=0,
        state_checkpoint_every_n_tokens=0,
    ):
        self.calls.append(
            (
                q.shape,
                k.shape,
                v.shape,
                g.shape,
                ssm_states.shape,
                query_start_loc.tolist(),
                None
                if state_checkpoint_cu_starts is None
                else state_checkpoint_cu_starts.tolist(),
                num_state_checkpoints,
                state_checkpoint_every_n_tokens,
            )
        )
        return None


@pytest.fixture
def flashinfer_on_cpu(monkeypatch):
    monkeypatch.setattr(upstream_gdn, "is_cuda", lambda: True)
    monkeypatch.setattr(gdn_flashinfer, "FlashInferGDNKernel", _FlashInferGDNKernel)
    _FlashInferGDNKernel.calls = []
    return _FlashInferGDNKernel


def _gdn_after_triton_default():
    """A GDN backend as sglang builds it when the full graph kept Triton."""
    gdn = make_gdn()
    gdn.linear_attn_backends = LinearAttnBackends(
        decode=LinearAttnKernelBackend.TRITON,
        prefill=LinearAttnKernelBackend.TRITON,
        verify=LinearAttnKernelBackend.TRITON,
    )
    # This rank: 4 value heads of 128 x 128 state, 2 key heads of 128
    # (conv channels 2*2*128 + 4*128).
    gdn.conv_states_shape = (16, 1024, 3)
    temporal = torch.zeros(3, 16, 4, 128, 128)
    gdn.req_to_token_pool.mamba_pool = SimpleNamespace(
        mamba_cache=SimpleNamespace(temporal=temporal)
    )
    return gdn


def _after_capture(runner, model_runner, monkeypatch):
    """sglang's PrefillCudaGraphRunner.capture (as patched) on the runner, with its
    CUDA-only body (_capture: warm-up and graph capture) replaced by a stand-in;
    the capture check and state allocation before it (tested in
    test_prefill_cuda_graph_runner.py) pass through."""
    monkeypatch.setattr(ours, "require_capturable_full_prefill_graph", lambda *a: None)
    monkeypatch.setattr(ours, "init_linear_graph_state_for_prefill", lambda *a: None)
    model_runner.is_draft_worker = False
    runner.model_runner = model_runner
    runner.model_context = contextlib.nullcontext
    runner._capture = lambda: None
    PrefillCudaGraphRunner.capture(runner)


def test_eager_gdn_prefill_returns_to_sglangs_default_after_capture(
    flashinfer_on_cpu, caplog, monkeypatch
):
    gdn = _gdn_after_triton_default()
    runner = _runner(gdn)
    model_runner = runner.model_runner
    model_runner.linear_attn_backends = gdn.linear_attn_backends
    setattr(model_runner, EAGER_GDN_PREFILL_DEFAULT, "flashinfer")
    caplog.set_level(logging.INFO, logger=ours.__name__)
    _after_capture(runner, model_runner, monkeypatch)
    dispatcher = gdn.kernel_dispatcher
    assert isinstance(dispatcher.extend_kernel, _FlashInferGDNKernel)
    assert isinstance(dispatcher.decode_kernel, TritonGDNKernel)  # decode as before
    assert isinstance(dispatcher.verify_kernel, TritonGDNKernel)
    assert gdn.linear_attn_backends.prefill.is_flashinfer()
    assert model_runner.linear_attn_backends is gdn.linear_attn_backends
    # warmed at startup, on this rank's heads and a scratch state: one request
    # and (no CUDA device to ask flashinfer's rule) 64, both without and with
    # prefix-cache snapshots every 64 tokens (the 70-token request has one)
    few = ((1, 70, 2, 128), (1, 70, 2, 128), (1, 70, 4, 128), (1, 70, 4))
    few += ((1, 4, 128, 128), [0, 70])
    many_tokens = 63 * 3 + 70
    many = tuple((1, many_tokens, *s) for s in ((2, 128), (2, 128), (4, 128), (4,)))
    many += ((64, 4, 128, 128), [3 * i for i in range(64)] + [many_tokens])
    assert flashinfer_on_cpu.calls == [
        (*few, None, 0, 0),
        (*few, [0, 1], 1, 64),
        (*many, None, 0, 0),
        (*many, [0] * 64 + [1], 1, 64),
    ]
    rule = [r.getMessage() for r in caplog.records if "routing" in r.getMessage()]
    assert len(rule) == 1
    assert "up to 2 request(s) and 512 token(s)" in rule[0]
    assert "GDN prefill: flashinfer" in rule[0] and "full_prefill_max_req" in rule[0]


def test_without_a_flashinfer_default_the_kernels_stay(
    flashinfer_on_cpu, caplog, monkeypatch
):
    gdn = _gdn_after_triton_default()
    kept = gdn.kernel_dispatcher
    runner = _runner(gdn)
    caplog.set_level(logging.INFO, logger=ours.__name__)
    _after_capture(runner, runner.model_runner, monkeypatch)
    assert gdn.kernel_dispatcher is kept and flashinfer_on_cpu.calls == []
    assert "sglang's default kernels." in caplog.text


def test_on_sm90_the_flashinfer_kernel_stays_and_is_warmed(
    flashinfer_on_cpu, caplog, monkeypatch
):
    """sglang's FlashInfer default kept for the whole process (the graph captured
    it): no dispatcher swap, but the eager variant is warmed and named."""
    gdn = _gdn_after_triton_default()
    gdn.linear_attn_backends = LinearAttnBackends(
        decode=LinearAttnKernelBackend.TRITON,
        prefill=LinearAttnKernelBackend.FLASHINFER,
        verify=LinearAttnKernelBackend.TRITON,
    )
    gdn.kernel_dispatcher = SimpleNamespace(extend_kernel=_FlashInferGDNKernel())
    kept = gdn.kernel_dispatcher
    runner = _runner(gdn)
    caplog.set_level(logging.INFO, logger=ours.__name__)
    _after_capture(runner, runner.model_runner, monkeypatch)
    assert gdn.kernel_dispatcher is kept and len(flashinfer_on_cpu.calls) == 4
    assert "GDN prefill: flashinfer" in caplog.text


def test_a_failed_warm_up_warns_and_serves(flashinfer_on_cpu, caplog, monkeypatch):
    gdn = _gdn_after_triton_default()
    runner = _runner(gdn)
    setattr(runner.model_runner, EAGER_GDN_PREFILL_DEFAULT, "flashinfer")
    monkeypatch.setattr(
        _FlashInferGDNKernel,
        "extend",
        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("jit")),
    )
    _after_capture(runner, runner.model_runner, monkeypatch)
    assert "Could not warm the flashinfer GDN prefill kernel" in caplog.text
    assert isinstance(gdn.kernel_dispatcher.extend_kernel, _FlashInferGDNKernel)


def test_breakable_runner_is_untouched(flashinfer_on_cpu, monkeypatch):
    gdn = _gdn_after_triton_default()
    kept = gdn.kernel_dispatcher
    runner = _runner(gdn)
    runner._is_full_backend = False
    setattr(runner.model_runner, EAGER_GDN_PREFILL_DEFAULT, "flashinfer")
    _after_capture(runner, runner.model_runner, monkeypatch)
    assert gdn.kernel_dispatcher is kept


def _recording_dummy_runs(runner, calls, fail=False):
    """sglang's BaseRunner dummy-forward pair on the runner, recording (the
    forward itself needs a GPU model)."""

    def alloc(max_bs, *, num_tokens_per_req=1, allocate_logits_buffer=True):
        calls.append(("alloc", max_bs, num_tokens_per_req, allocate_logits_buffer))
        if fail:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return "buffers"

    def dummy_run(batch_size, run_ctx=None, forward_mode_override=None, **kwargs):
        calls.append(("run", batch_size, forward_mode_override, kwargs))

    runner._alloc_dummy_decode_buffers = alloc
    runner._dummy_run = dummy_run


def test_the_routing_line_names_the_long_prefill_limit(caplog, monkeypatch):
    """With MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST below the largest bucket, the
    capture ends with eager dummy prefills just over it (sglang's own _dummy_run,
    EXTEND) and the routing line names the bound; unset, or at least the largest
    bucket (no prefill batch can exceed it: 512, against these buckets of up
    to 512 tokens), neither; a failed warm-up warns and the
    server starts; under tensor parallelism it does not run."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    caplog.set_level(logging.INFO, logger=ours.__name__)
    # sglang's parallel state, as one GPU publishes it (not published on CPU).
    monkeypatch.setattr(
        ours, "get_parallel", lambda: SimpleNamespace(tp_size=1, attn_dp_enabled=False)
    )
    calls = []
    for bound in (None, 512):
        monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", bound)
        runner = _mamba2_runner()  # buckets up to 512 tokens
        _recording_dummy_runs(runner, calls)
        _after_capture(runner, runner.model_runner, monkeypatch)
        assert "new tokens per request" not in caplog.text
        assert calls == []
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", 300)
    runner = _mamba2_runner()
    _recording_dummy_runs(runner, calls)
    _after_capture(runner, runner.model_runner, monkeypatch)
    # One just over the bound, and one in Triton's other integer class (a
    # multiple of 16).
    assert calls == [
        ("alloc", 1, 301, False),
        ("run", 1, ForwardMode.EXTEND, {"buffers": "buffers", "extend_num_tokens_per_req": 301}),
        ("alloc", 1, 304, False),
        ("run", 1, ForwardMode.EXTEND, {"buffers": "buffers", "extend_num_tokens_per_req": 304}),
    ]  # fmt: skip
    assert "Could not warm" not in caplog.text
    calls.clear()
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", 255)
    runner = _mamba2_runner()
    _recording_dummy_runs(runner, calls)
    _after_capture(runner, runner.model_runner, monkeypatch)
    assert [c[2] for c in calls if c[0] == "alloc"] == [256, 257]
    # A failure warns; the allocator's cache is emptied either way.
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    failing = _mamba2_runner()
    _recording_dummy_runs(failing, calls, fail=True)
    _after_capture(failing, failing.model_runner, monkeypatch)
    assert "Could not warm sglang's eager Mamba2 prefill" in caplog.text
    assert "OutOfMemoryError" in caplog.text
    assert emptied == [1]
    # Under tensor parallelism nothing runs (a rank that failed would leave the
    # others in the forward's collectives), and the log says so.
    monkeypatch.setattr(
        ours, "get_parallel", lambda: SimpleNamespace(tp_size=2, attn_dp_enabled=False)
    )
    calls.clear()
    runner = _mamba2_runner()
    _recording_dummy_runs(runner, calls, fail=True)
    _after_capture(runner, runner.model_runner, monkeypatch)
    assert calls == []
    assert "Not warming sglang's eager Mamba2 prefill under tensor parallelism" in (
        caplog.text
    )
    caplog.clear()
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", 400)
    runner = _mamba2_runner()
    _recording_dummy_runs(runner, calls)
    _after_capture(runner, runner.model_runner, monkeypatch)
    rule = [r.getMessage() for r in caplog.records if "routing" in r.getMessage()]
    assert len(rule) == 2
    assert "more than 400 new tokens per request on average also runs" in rule[1]
    assert "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST" in rule[1]
