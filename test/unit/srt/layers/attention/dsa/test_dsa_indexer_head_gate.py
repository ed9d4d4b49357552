"""Indexer._get_logits_head_gate with a LoRA-owned weights_proj, as the graph
split op calls it: the gate's paths other than the merged weight (see
test_dsa_indexer_merged_gate.py), and the csgmv shrink stand-in's own checks.
"""

import inspect
from types import SimpleNamespace

import pytest
import torch
from dsa_indexer_lora_cases import (
    ADAPTER_ROWS,
    FULL_GATE_CALLS,
    FUSED_DELTA_CALLS,
    FUSED_DELTA_TILES,
    MERGED_GEMM_CALLS,
    REQUESTS,
    ROWS,
    SHRINK_CACHE_KEY_SOURCE,
    TOKENS,
    _assert_gate,
    _bare_logits,
    _gate,
    _indexer,
    _inputs,
    _lora_ids,
    _lora_indexer,
    _lora_weights_proj,
    _q_scale,
    _reference_logits,
    _split_op_context,
    _weights_proj,
    cpu_stand_ins,  # noqa: F401  (autouse)
)

from sglang.kernels.ops.lora.dense import chunked_sgmv_shrink
from sglang.srt.layers.attention.dsa import dsa_indexer as upstream
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
from sglang.srt.lora.backend.triton_backend import TritonLoRABackend
from sglang.srt.lora.layers import ReplicatedLinearWithLoRA
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as ours
from sglang_graphfix_kernel.lora_head_gate import BATCH_INVARIANT_DELTA_TILES

# --------------------------------------------------------------------------- #
# Head gate (Indexer._get_logits_head_gate), as the graph split op calls it.
# --------------------------------------------------------------------------- #


def test_weights_proj_has_lora():
    base = _weights_proj()
    assert ours.weights_proj_has_lora(_indexer(_lora_weights_proj(base)))
    assert not ours.weights_proj_has_lora(_indexer(base))
    unset = ReplicatedLinearWithLoRA(base, TritonLoRABackend(1, torch.device("cpu")))
    assert not ours.weights_proj_has_lora(_indexer(unset))
    # Fusion folds weights_proj into wk_weights_proj: nothing for LoRA to own.
    assert not ours.weights_proj_has_lora(
        _indexer(_lora_weights_proj(base), fusion=True)
    )


@pytest.mark.parametrize(
    "prefill_graph", [True, False], ids=["graph_info", "eager_info"]
)
def test_head_gate_is_the_base_gemm_plus_each_requests_adapter(prefill_graph):
    indexer = _indexer(_lora_weights_proj(_weights_proj(), prefill_graph=prefill_graph))
    x, _, _ = _inputs()
    q_scale = _q_scale()

    gate = indexer._get_logits_head_gate(x, q_scale)

    _assert_gate(gate, x, q_scale)
    assert indexer.fp32_gemm_calls == 1, "upstream's fp32 base GEMM did not run"
    (batch_info,) = FUSED_DELTA_CALLS
    assert batch_info is indexer.weights_proj.lora_backend.batch_info


@pytest.mark.parametrize("max_rank", [16, 64], ids=["rank16", "rank64"])
@pytest.mark.parametrize(
    "prefill_graph", [True, False], ids=["graph_info", "eager_info"]
)
def test_head_gate_on_the_csgmv_backend(prefill_graph, max_rank):
    """sglang's default LoRA backend, each pool max rank in a fresh process (as a
    server has one): adapters of max_rank/2 and max_rank."""
    weights_proj = _lora_weights_proj(
        _weights_proj(), prefill_graph=prefill_graph, backend="csgmv", max_rank=max_rank
    )
    indexer = _indexer(weights_proj)
    x, _, _ = _inputs()
    q_scale = _q_scale()

    gate = indexer._get_logits_head_gate(x, q_scale)

    _assert_gate(gate, x, q_scale, max_rank)
    assert indexer.fp32_gemm_calls == 1
    (batch_info,) = FUSED_DELTA_CALLS
    assert batch_info.req_seg_indptr is not None  # csgmv's per-request view


ALL_ADAPTER_REQUESTS = [(5, 1), (3, 2), (4, 1)]


@pytest.mark.parametrize("backend", ["triton", "csgmv"])
def test_head_gate_with_several_adapters_is_one_kernel(backend):
    """No row keeps upstream's GEMM when every request has an adapter, not all
    the same one (the split op's forward batch says so, host-side): one launch
    of sgl-kernel's lora_head_gate computes base and delta from one read of x."""
    requests = ALL_ADAPTER_REQUESTS
    layer = _lora_weights_proj(_weights_proj(), backend=backend, requests=requests)
    indexer = _indexer(layer)
    x, _, _ = _inputs()
    q_scale = _q_scale()

    with _split_op_context(_lora_ids(requests)):
        gate = indexer._get_logits_head_gate(x, q_scale)

    (batch_info,) = FULL_GATE_CALLS
    assert batch_info is layer.lora_backend.batch_info
    assert indexer.fp32_gemm_calls == 0 and not FUSED_DELTA_CALLS
    reference = _gate(_reference_logits(x, requests=requests), q_scale)
    torch.testing.assert_close(
        gate, reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item()
    )
    bare = _gate(_bare_logits(x), q_scale)
    # Every row carries its adapter (larger than any row's bare gate).
    assert (gate - bare)[:TOKENS].abs().amax(dim=(1, 2)).min() > bare.abs().max()


@pytest.mark.parametrize(
    "lora_ids", [_lora_ids(), None, []], ids=["one_without", "no_lora_ids", "empty"]
)
def test_head_gate_with_a_request_without_adapter_keeps_upstreams_gemm(lora_ids):
    """A request without an adapter (or no forward batch to tell): upstream's
    GEMM for every row, the delta on top."""
    indexer = _lora_indexer()
    x, _, _ = _inputs()
    q_scale = _q_scale()

    with _split_op_context(lora_ids):
        gate = indexer._get_logits_head_gate(x, q_scale)

    assert not FULL_GATE_CALLS
    assert indexer.fp32_gemm_calls == 1 and len(FUSED_DELTA_CALLS) == 1
    assert FUSED_DELTA_TILES == [{}]  # the kernel's own tiles
    _assert_gate(gate, x, q_scale)


@pytest.mark.parametrize(
    "requests", [ALL_ADAPTER_REQUESTS, [(5, 1), (3, 1), (4, 1)]], ids=["several", "one"]
)
def test_deterministic_inference_keeps_upstreams_gemm(monkeypatch, requests):
    """--enable-deterministic-inference: a request's gate must not depend on its
    batch, so even a batch where every request has an adapter (several, or all
    the same one) takes upstream's GEMM + the delta (the path of a mixed batch)."""
    assert not ours.deterministic_inference()  # no server config published
    published = SimpleNamespace(is_config_namespace_published=lambda name: True)
    monkeypatch.setattr(ours, "get_context", lambda: published)
    monkeypatch.setattr(
        ours,
        "get_exec",
        lambda: SimpleNamespace(
            deterministic=SimpleNamespace(enable_deterministic_inference=True)
        ),
    )
    indexer = _indexer(_lora_weights_proj(_weights_proj(), requests=requests))
    x, _, _ = _inputs()

    with _split_op_context(_lora_ids(requests)):
        indexer._get_logits_head_gate(x, _q_scale())

    assert not FULL_GATE_CALLS and not MERGED_GEMM_CALLS
    assert indexer.fp32_gemm_calls == 1 and len(FUSED_DELTA_CALLS) == 1
    # ... with tiles that do not follow the batch's tokens
    # (test_lora_head_gate.py holds them bit-identical across batches).
    assert FUSED_DELTA_TILES == [BATCH_INVARIANT_DELTA_TILES]


def test_pools_above_the_kernels_rank_take_sglangs_lora_kernels(monkeypatch):
    """A LoRA pool of a rank above sgl-kernel's MAX_RANK (on an H200 a rank-256
    pool's tiles need more shared memory than there is): upstream's GEMM and
    sglang's own shrink and expand, whatever the batch; the gate is unchanged."""
    monkeypatch.setattr(ours, "MAX_RANK", 4)  # this pool's rank is 8
    for requests in (ALL_ADAPTER_REQUESTS, [(5, 1), (3, 0), (4, 2)]):
        layer = _lora_weights_proj(_weights_proj(), backend="csgmv", requests=requests)
        indexer = _indexer(layer)
        x, _, _ = _inputs()
        q_scale = _q_scale()
        with _split_op_context(_lora_ids(requests)):
            gate = indexer._get_logits_head_gate(x, q_scale)
        assert not FULL_GATE_CALLS and not FUSED_DELTA_CALLS
        assert indexer.fp32_gemm_calls == 1
        reference = _gate(_reference_logits(x, requests=requests), q_scale)
        torch.testing.assert_close(
            gate, reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item()
        )


def test_split_op_lora_ids_reads_the_split_op_batch():
    assert ours.split_op_lora_ids() is None  # no prefill-graph context
    with _split_op_context(["a", None]):
        assert ours.split_op_lora_ids() == ["a", None]


def test_csgmv_shrink_stand_in_has_upstreams_compile_cache_key():
    """The stand-in reuses a compiled shrink kernel exactly when sglang does: its
    cache key leaves out N. If upstream adds N, update _shrink_cache_key."""
    source = inspect.getsource(chunked_sgmv_shrink)
    assert f"@cached_triton_kernel(\n    {SHRINK_CACHE_KEY_SOURCE}\n)" in source


def test_csgmv_second_max_rank_in_one_process_runs_the_first_ranks_shrink():
    """What benchmark/dsa_head_gate.py hit on an H200 (csgmv rank 64 after rank 16,
    one process) with sglang's own shrink: the rank-64 pool ran the shrink
    compiled for rank 16, whose strides read slot 0 (no adapter). A server has one
    max rank, so this is a benchmark artefact, and the fused gate (its own
    kernel, specialised on the pool's rank) does not depend on that cache."""
    x, _, _ = _inputs()
    q_scale = _q_scale()

    def backend_gate(indexer):  # the unfused path: sglang's shrink and expand
        base = indexer._weights_proj_bf16_in_fp32_out(x)
        logits = ours.add_delta_with_lora_backend(indexer.weights_proj, x, base)
        return indexer._scale_head_gates(logits, q_scale)

    rank16 = _indexer(_lora_weights_proj(_weights_proj(), backend="csgmv", max_rank=16))
    _assert_gate(backend_gate(rank16), x, q_scale, 16)

    rank64 = _indexer(_lora_weights_proj(_weights_proj(), backend="csgmv", max_rank=64))
    with pytest.raises(AssertionError):
        _assert_gate(backend_gate(rank64), x, q_scale, 64)
    _assert_gate(rank64._get_logits_head_gate(x, q_scale), x, q_scale, 64)

    chunked_sgmv_shrink._chunked_lora_shrink_kernel._clear_cache()
    _assert_gate(backend_gate(rank64), x, q_scale, 64)


def test_upstream_head_gate_drops_the_lora_delta():
    """What the split op computed before the fix: the bare weight only."""
    indexer = _lora_indexer()
    x, _, _ = _inputs()
    q_scale = _q_scale()

    gate = Indexer._get_logits_head_gate.__wrapped__(indexer, x, q_scale)

    torch.testing.assert_close(gate, _gate(_bare_logits(x), q_scale))
    reference = _gate(_reference_logits(x), q_scale)
    assert not torch.allclose(gate[ADAPTER_ROWS], reference[ADAPTER_ROWS], rtol=0.1)


@pytest.mark.parametrize(
    "case", ["no_lora", "no_batch_info", "fusion", "no_adapter_in_batch"]
)
def test_head_gate_without_an_active_adapter_is_upstream(case):
    if case == "no_lora":
        indexer = _indexer(_weights_proj())
    elif case == "no_adapter_in_batch":
        # A LoRA server's base-model traffic: the layer is active (csgmv runs
        # its kernels for such batches) but no request has an adapter.
        requests = [(n, 0) for n, _ in REQUESTS]
        layer = _lora_weights_proj(_weights_proj(), backend="csgmv", requests=requests)
        assert layer.lora_active
        indexer = _indexer(layer)
    else:
        indexer = _indexer(_lora_weights_proj(_weights_proj()), fusion=case == "fusion")
        if case == "no_batch_info":
            # A DP-attention idle forward: the backend has no batch prepared.
            indexer.weights_proj.lora_backend.batch_info = None
    x, _, _ = _inputs()
    q_scale = _q_scale()

    gate = indexer._get_logits_head_gate(x, q_scale)

    no_lora = _indexer(_weights_proj())._get_logits_head_gate(x, q_scale)
    assert torch.equal(gate, no_lora)
    assert indexer.fp32_gemm_calls == 1
    assert not FUSED_DELTA_CALLS


def test_head_gate_under_capture_never_skips_the_adapter(monkeypatch):
    """A gate captured into a graph must not bake in 'no adapter' from the batch
    it was captured with."""
    requests = [(n, 0) for n, _ in REQUESTS]
    indexer = _indexer(_lora_weights_proj(_weights_proj(), requests=requests))
    assert not ours.batch_has_adapter(indexer.weights_proj)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert ours.batch_has_adapter(indexer.weights_proj)


def test_head_gate_off_cuda_is_the_lora_module(monkeypatch):
    """Off CUDA (ROCm) upstream's base projection is the module call, which for
    the LoRA layer already includes the adapter."""
    monkeypatch.setattr(upstream, "_is_cuda", False)
    indexer = _lora_indexer()
    x, _, _ = _inputs()
    q_scale = _q_scale()

    gate = indexer._get_logits_head_gate(x, q_scale)

    assert torch.equal(gate, _gate(indexer.weights_proj(x)[0].float(), q_scale))
    assert indexer.fp32_gemm_calls == 0
    torch.testing.assert_close(
        gate[ADAPTER_ROWS],
        _gate(_reference_logits(x), q_scale)[ADAPTER_ROWS],
        rtol=3e-2,
        atol=2e-2 * _gate(_reference_logits(x), q_scale).abs().max().item(),
    )


def test_head_gate_refuses_quantized_activations_with_lora():
    indexer = _lora_indexer()
    x, _, _ = _inputs()
    with pytest.raises(RuntimeError) as raised:
        indexer._get_logits_head_gate((x, torch.ones(ROWS, 1)), _q_scale())
    assert str(raised.value) == ours.QUANTIZED_ACTIVATIONS_LORA_ERROR
