"""PrefillCudaGraphRunner.capture on a hybrid linear-attention model: before a
full prefill graph captures, the linear backends are checked and their
CUDA-graph state is allocated once (sized for the decode runner too, without
the full-attention child); the decode runner's later call keeps it."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

# The attention tests' CPU stand-ins (test/).
from gdn_stub import make_gdn
from kda_stub import make_kda, with_graph_lists

from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
    Mamba2AttnBackend,
    MambaAttnBackendBase,
)
from sglang.srt.layers.attention.linear.inkling_sconv_backend import (
    InklingShortConvAttnBackend,
)
from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
    PrefillCudaGraphRunner,
)
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.model_executor.runner import prefill_cuda_graph_runner as ours

SLOTS = 4


class _FullAttn:
    """The full-attention child: records init_cuda_graph_state (FlashInfer's would
    size max_num_tokens x context_len index buffers from the prefill bounds)."""

    def __init__(self):
        self.graph_state_calls = []

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self.graph_state_calls.append((max_bs, max_num_tokens))


@pytest.fixture(autouse=True)
def runtime(monkeypatch):
    """The resolved decode graph config and spec settings the runner reads, and
    the memory layout GDN's capture check reads."""
    config = CudaGraphConfig(
        decode=PhaseConfig(backend="full", bs=[1, 2, 4, 8, 16], max_bs=16),
        prefill=PhaseConfig(
            backend="full", bs=[16, 64, 256], full_prefill_max_req=SLOTS
        ),
    )
    monkeypatch.setattr(
        ours,
        "get_exec",
        lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=config)),
    )
    monkeypatch.setattr(
        ours, "get_spec", lambda: SimpleNamespace(speculative_num_draft_tokens=None)
    )
    monkeypatch.setattr(
        "sglang_graphfix.srt.full_prefill_graph_capability.get_memory",
        lambda: SimpleNamespace(enable_page_major_kv_layout=False),
    )
    return config


def _runner(linear, *, full_backend=True, draft=False):
    hybrid = HybridLinearAttnBackend.__new__(HybridLinearAttnBackend)
    hybrid.full_attn_backend = _FullAttn()
    hybrid.linear_attn_backend = linear
    hybrid.attn_backend_list = [hybrid.full_attn_backend, linear]
    runner = PrefillCudaGraphRunner.__new__(PrefillCudaGraphRunner)
    runner._is_full_backend = full_backend
    runner._capture_req_slots = SLOTS
    runner.max_bs, runner.max_num_tokens = 48, 256  # request pool, largest bucket
    runner.capture_num_tokens = [16, 64, 256]
    runner.model_runner = SimpleNamespace(
        attn_backend=hybrid,
        is_draft_worker=draft,
        decode_num_tokens_per_req=lambda num_draft_tokens=None: 1,
    )
    return runner


def _capture(runner, record=None):
    """sglang's PrefillCudaGraphRunner.capture (as patched) on the runner, with its
    CUDA-only body (_capture: warm-up and graph capture) replaced by a stand-in
    that records what it found allocated."""
    seen = []
    linear = runner.model_runner.attn_backend.linear_attn_backend
    runner.model_context = contextlib.nullcontext
    runner._capture = record or (
        lambda: seen.append(len(getattr(linear, "state_indices_list", [])))
    )
    PrefillCudaGraphRunner.capture(runner)
    return seen


def test_the_hook_wraps_upstreams_capture():
    current = PrefillCudaGraphRunner.capture
    assert current.__wrapped__.__qualname__ == "PrefillCudaGraphRunner.capture"


@pytest.mark.parametrize("make", [make_gdn, make_kda])
def test_state_is_allocated_before_capture_for_both_graph_phases(make):
    linear = with_graph_lists(make())
    runner = _runner(linear)
    assert _capture(runner) == [16]  # allocated before capture ran
    # max(prefill slots 4, decode max bs 16), one token per request
    assert linear.graph_state_bounds == (16, 1)
    assert runner.model_runner.attn_backend.full_attn_backend.graph_state_calls == []


def test_prefill_slots_beyond_the_decode_batch_sizes_size_the_state(runtime):
    runtime.decode.bs, runtime.decode.max_bs = [1, 2], 2
    linear = with_graph_lists(make_gdn())
    _capture(_runner(linear))
    assert linear.graph_state_bounds == (SLOTS, 1)


def test_no_spurious_divisibility_assert():
    """Upstream's call with the runner's own bounds (request pool, largest
    bucket) trips init_cuda_graph_state's assert; the hook's does not."""
    linear = with_graph_lists(make_gdn())
    runner = _runner(linear)
    with pytest.raises(AssertionError, match="must be divisible"):
        MambaAttnBackendBase.init_cuda_graph_state.__wrapped__(
            linear, runner.max_bs, runner.max_num_tokens
        )
    linear = with_graph_lists(make_gdn())
    _capture(_runner(linear))
    assert len(linear.state_indices_list) == 16


def test_the_decode_runners_later_call_keeps_the_allocation():
    linear = with_graph_lists(make_gdn())
    runner = _runner(linear)
    _capture(runner)
    kept = [id(t) for t in linear.state_indices_list] + [
        id(linear.mamba_track_indices_buf)
    ]
    hybrid = runner.model_runner.attn_backend
    hybrid.init_cuda_graph_state(16, 16)  # DecodeCudaGraphRunner.__init__
    assert [id(t) for t in linear.state_indices_list] + [
        id(linear.mamba_track_indices_buf)
    ] == kept
    assert len(linear.state_indices_list) == 16  # not doubled
    assert hybrid.full_attn_backend.graph_state_calls == [(16, 16)]  # decode's own


def test_decode_replay_finds_state_after_the_prefill_capture():
    linear = with_graph_lists(make_gdn())
    args = (torch.tensor([1, 2]), ForwardMode.DECODE, None, torch.tensor([5, 6]))
    with pytest.raises(RuntimeError, match="no CUDA-graph state for batch size 2"):
        linear._replay_metadata(2, *args)
    _capture(_runner(linear))
    assert linear._replay_metadata(2, *args).mamba_cache_indices.tolist() == [5, 9]


DISABLED = "--cuda-graph-backend-prefill disabled"


@pytest.fixture
def mamba2_switch_off(monkeypatch):
    """The Mamba2 family refused as a whole (MAMBA2_FULL_PREFILL_GRAPH off; with
    it on, what a Mamba2 backend can capture is judged on its model config, in
    test_full_prefill_graph_capability)."""
    monkeypatch.setattr(capability, "MAMBA2_FULL_PREFILL_GRAPH", False)


@pytest.mark.parametrize(
    "linear, flag",
    [
        (Mamba2AttnBackend.__new__(Mamba2AttnBackend), "has no capturable extend"),
        (make_kda(extend_kernel=object()), "--linear-attn-prefill-backend triton"),
        (make_gdn(extend_kernel=object()), "--linear-attn-prefill-backend triton"),
    ],
)  # fmt: skip
def test_uncapturable_linear_extend_fails_before_capture(
    mamba2_switch_off, linear, flag
):
    linear = with_graph_lists(linear)
    called = []
    with pytest.raises(ValueError, match=flag) as err:
        _capture(_runner(linear), record=lambda: called.append(True))
    assert called == [] and linear.state_indices_list == []
    assert DISABLED in str(err.value)


def test_mamba2_error_names_the_backend(mamba2_switch_off):
    with pytest.raises(
        ValueError,
        match=r"cannot capture this Mamba2/short-conv extend \(Mamba2AttnBackend\)",
    ):
        _capture(
            _runner(with_graph_lists(Mamba2AttnBackend.__new__(Mamba2AttnBackend)))
        )


@pytest.mark.parametrize("runner_kwargs", [{"full_backend": False}, {"draft": True}])
def test_breakable_graphs_and_draft_workers_allocate_nothing(runner_kwargs):
    linear = with_graph_lists(make_gdn())
    assert _capture(_runner(linear, **runner_kwargs)) == [0]
    assert linear.state_indices_list == []


def test_breakable_graphs_skip_the_capture_check():
    linear = with_graph_lists(Mamba2AttnBackend.__new__(Mamba2AttnBackend))
    assert _capture(_runner(linear, full_backend=False)) == [0]


def test_inklings_sidecar_keeps_its_upstream_path():
    sidecar = with_graph_lists(
        InklingShortConvAttnBackend.__new__(InklingShortConvAttnBackend)
    )
    assert _capture(_runner(sidecar)) == [0]
