"""Indexer.forward_cuda with a LoRA-owned weights_proj under prefill/decode
graphs: the breakable split op dispatched, the other graph paths' refusals
reworded, and what a breakable replay runs for one layer.
"""

import types
from types import SimpleNamespace

import pytest
import torch
from dsa_indexer_lora_cases import (
    GRAPH_ERROR,
    HEAD_DIM,
    LAYER,
    N_HEADS,
    ROWS,
    TOKENS,
    TOPK,
    _act_quant,
    _assert_gate,
    _batch,
    _indexer,
    _inputs,
    _lora_indexer,
    _lora_weights_proj,
    _weights_proj,
    cpu_stand_ins,  # noqa: F401  (autouse)
)

from sglang.srt.layers.attention.dsa import dsa_indexer as upstream
from sglang.srt.layers.attention.dsa import dsa_prefill_cuda_graph as split_ops
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
from sglang.srt.layers.attention.dsa.dsa_prefill_cuda_graph import (
    GRAPH_WEIGHTS_PROJ_LORA_ERROR,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    enable_breakable_cuda_graph,
)
from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
    enable_tc_piecewise_cuda_graph,
    set_tc_piecewise_forward_context,
)
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as ours

# --------------------------------------------------------------------------- #
# Dispatch (Indexer.forward_cuda) under prefill/decode graphs.
# --------------------------------------------------------------------------- #


@pytest.fixture
def upstream_body_runs(monkeypatch):
    """Counts entries into upstream's forward_cuda body (its first graph-state
    probe), which the graphfix hook never calls itself."""
    entries = []
    real = upstream._is_in_piecewise_or_breakable_cuda_graph

    def probe():
        entries.append(1)
        return real()

    monkeypatch.setattr(upstream, "_is_in_piecewise_or_breakable_cuda_graph", probe)
    return entries


@pytest.fixture
def split_op_calls(monkeypatch):
    """Record the PCG/BCG indexer split ops instead of running them (their body
    launches GPU kernels); like the real op, fill the static buffer in place."""
    calls = []

    def recorder(kind):
        def split_op(**kwargs):
            topk = kwargs["topk_result"]
            calls.append(
                {"op": kind, "all_invalid_on_entry": bool((topk == -1).all()), **kwargs}
            )
            topk.fill_(7)

        return split_op

    monkeypatch.setattr(upstream, "pcg_dsa_indexer_prefill_split", recorder("pcg"))
    monkeypatch.setattr(upstream, "bcg_dsa_indexer_prefill_split", recorder("bcg"))
    return calls


def _q_k_bf16(query, key):
    def get_q_k_bf16(
        self, q_lora, x, positions, enable_dual_stream, forward_batch=None
    ):
        return query, key, None

    return get_q_k_bf16


def _with_q_k(indexer):
    """Stand in the q/k projection (wq_b, wk, rope, Hadamard: GPU kernels)."""
    g = torch.Generator().manual_seed(3)
    query = torch.randn(ROWS, N_HEADS, HEAD_DIM, generator=g).bfloat16()
    key = torch.randn(ROWS, HEAD_DIM, generator=g).bfloat16()
    indexer._get_q_k_bf16 = types.MethodType(_q_k_bf16(query, key), indexer)
    return query, key


def _describe(call):
    """What the split-op contract fixes: which op, the inputs by identity, and the
    static top-k buffer's shape, dtype and -1 fill."""
    topk = call["topk_result"]
    return {
        "op": call["op"],
        "layer_id": call["layer_id"],
        "inputs": tuple(id(call[k]) for k in ("x", "q_lora", "positions")),
        "x_s": id(call["x_s"]) if call["x_s"] is not None else None,
        "x_bf16": call["x_bf16"],
        "topk_result": (tuple(topk.shape), topk.dtype, call["all_invalid_on_entry"]),
    }


def test_upstream_refuses_weights_proj_lora_on_the_split_op_surface(split_op_calls):
    """The startup crash of the default breakable prefill graph (at capture),
    with advice that does not help."""
    indexer = _lora_indexer()
    x, q_lora, positions = _inputs()
    with enable_breakable_cuda_graph(), pytest.raises(RuntimeError, match=GRAPH_ERROR):
        Indexer.forward_cuda.__wrapped__(indexer, x, q_lora, positions, _batch(), LAYER)
    assert split_op_calls == []


@pytest.mark.parametrize("reference", ["no_lora", "fusion"])
@pytest.mark.parametrize("quantized_x", [False, True])
@pytest.mark.parametrize("return_indices", [True, False])
def test_breakable_lora_dispatches_the_split_op_as_upstream_does_without_lora(
    reference, quantized_x, return_indices, split_op_calls, upstream_body_runs
):
    x, q_lora, positions = _inputs()
    # ROCm's fused RMSNorm+quant hands (x, x_s) over; the op takes the parts.
    x_in = (x, torch.ones(ROWS, 1)) if quantized_x else x
    batch = _batch()

    with enable_breakable_cuda_graph():
        result = _lora_indexer().forward_cuda(
            x_in, q_lora, positions, batch, LAYER, return_indices=return_indices
        )
    assert upstream_body_runs == [], "the LoRA case fell through to upstream"
    assert len(split_op_calls) == 1
    ours_call = split_op_calls.pop()

    without = (
        _indexer(_weights_proj())
        if reference == "no_lora"
        else _indexer(_lora_weights_proj(_weights_proj()), fusion=True)
    )
    with enable_breakable_cuda_graph():
        upstream_result = without.forward_cuda(
            x_in, q_lora, positions, batch, LAYER, return_indices=return_indices
        )
    assert upstream_body_runs == [1], (
        "without a LoRA-owned weights_proj upstream dispatches"
    )
    assert len(split_op_calls) == 1
    upstream_call = split_op_calls.pop()

    assert _describe(ours_call) == _describe(upstream_call)
    assert _describe(ours_call)["op"] == "bcg"
    assert _describe(ours_call)["topk_result"] == (
        ((ROWS if return_indices else 0), TOPK),
        torch.int32,
        True,
    )
    if return_indices:
        # The static buffer the split op filled in place is the layer's result.
        assert result is ours_call["topk_result"] and bool((result == 7).all())
        assert upstream_result is upstream_call["topk_result"]
    else:
        assert result is None and upstream_result is None


def test_piecewise_lora_keeps_a_clear_error(split_op_calls, upstream_body_runs):
    """tc_piecewise is no config choice in 0.5.23: upstream keeps its refusal, with
    advice that names the flags that work."""
    x, q_lora, positions = _inputs()
    with enable_tc_piecewise_cuda_graph(), pytest.raises(RuntimeError) as raised:
        _lora_indexer().forward_cuda(x, q_lora, positions, _batch(), LAYER)
    assert str(raised.value) == ours.PIECEWISE_LORA_ERROR
    assert str(raised.value.__cause__) == GRAPH_WEIGHTS_PROJ_LORA_ERROR
    assert upstream_body_runs == [1] and split_op_calls == []

    with enable_tc_piecewise_cuda_graph():
        _indexer(_weights_proj()).forward_cuda(x, q_lora, positions, _batch(), LAYER)
    assert [call["op"] for call in split_op_calls] == ["pcg"], "no LoRA: upstream"


@pytest.mark.parametrize(
    "case, expected",
    [
        ("decode", ours.BREAKABLE_DECODE_LORA_ERROR.format(mode="DECODE")),
        (
            "target_verify",
            ours.BREAKABLE_DECODE_LORA_ERROR.format(mode="TARGET_VERIFY"),
        ),
        ("prefill_cp", ours.BREAKABLE_PREFILL_LORA_ERROR),
    ],
)
def test_breakable_paths_without_the_split_op_keep_a_clear_error(
    case, expected, split_op_calls, upstream_body_runs
):
    """Breakable graph paths that capture the gate in the graph (decode graph
    without the dual-stream branch, speculative verify, prefill CP) keep
    upstream's refusal, reworded."""
    indexer = _lora_indexer(prefill_cp=case == "prefill_cp")
    _with_q_k(indexer)
    mode = {
        "decode": ForwardMode.DECODE,
        "target_verify": ForwardMode.TARGET_VERIFY,
        "prefill_cp": ForwardMode.EXTEND,
    }[case]
    x, q_lora, positions = _inputs()

    with enable_breakable_cuda_graph(), pytest.raises(RuntimeError) as raised:
        indexer.forward_cuda(x, q_lora, positions, _batch(mode), LAYER)
    assert str(raised.value) == expected
    assert str(raised.value.__cause__) == GRAPH_WEIGHTS_PROJ_LORA_ERROR
    assert upstream_body_runs == [1] and split_op_calls == []


def test_other_errors_pass_through_unchanged():
    indexer = _lora_indexer()
    boom = RuntimeError("boom")

    def failing_q_k(*args, **kwargs):
        raise boom

    indexer._get_q_k_bf16 = failing_q_k
    x, q_lora, positions = _inputs()
    with enable_breakable_cuda_graph(), pytest.raises(RuntimeError) as raised:
        indexer.forward_cuda(x, q_lora, positions, _batch(ForwardMode.DECODE), LAYER)
    assert raised.value is boom


@pytest.mark.parametrize("prefill_cp", [False, True])
def test_lora_eager_forward_runs_upstream(prefill_cp, split_op_calls):
    """use_cuda_graph=False: the eager path (also what prefill CP's interleaved
    indexer uses inside the breakable graph), which applies LoRA itself."""
    indexer = _lora_indexer(prefill_cp=prefill_cp)
    x, q_lora, positions = _inputs()
    lookups = []

    def get_indexer_metadata(layer_id, forward_batch):
        lookups.append(layer_id)
        return None

    backend = SimpleNamespace(get_indexer_metadata=get_indexer_metadata)
    with (
        forward_context(ForwardContext(attn_backend=backend)),
        enable_breakable_cuda_graph(),
    ):
        result = indexer.forward_cuda(
            x, q_lora, positions, _batch(), LAYER, use_cuda_graph=False
        )
    # Upstream's eager path: it looks up the layer's indexer metadata and, with
    # none, returns before any projection.
    assert lookups == [LAYER] and result is None
    assert split_op_calls == []


def test_error_messages_name_the_path_and_the_flags():
    messages = {
        ours.PIECEWISE_LORA_ERROR: [
            "tc_piecewise",
            "--cuda-graph-backend-prefill breakable",
            "--cuda-graph-backend-prefill disabled",
        ],
        ours.BREAKABLE_DECODE_LORA_ERROR.format(mode="TARGET_VERIFY"): [
            "TARGET_VERIFY batches",
            "--cuda-graph-backend-decode breakable",
            "--cuda-graph-backend-decode full",
        ],
        ours.BREAKABLE_PREFILL_LORA_ERROR: [
            "context-parallel prefill",
            "--cuda-graph-backend-prefill disabled",
        ],
        ours.QUANTIZED_ACTIVATIONS_LORA_ERROR: [
            "quantized indexer activations",
            "--cuda-graph-backend-prefill disabled",
        ],
    }
    for message, names in messages.items():
        assert message.startswith(
            "DSA indexer LoRA on indexer.weights_proj is not supported"
        )
        for name in names + ["--lora-target-modules"]:
            assert name in message, (name, message)
        # Upstream's advice, which does not help with the default graph.
        assert "remove the explicit" not in message


# --------------------------------------------------------------------------- #
# End to end: what a breakable-graph replay runs for one layer.
# --------------------------------------------------------------------------- #


def test_breakable_replay_feeds_the_lora_gate_to_the_topk(monkeypatch):
    """forward_cuda under a breakable graph dispatches the split op, whose real
    eager body (what the replay runs at the graph break) builds the head gate
    through the patched _get_logits_head_gate, each request's adapter included
    and the other rows as without LoRA, and hands it to the ragged top-k."""
    # At a replay the breakable wrapper calls straight into the op's eager body.
    monkeypatch.setattr(
        upstream,
        "bcg_dsa_indexer_prefill_split",
        split_ops.pcg_dsa_indexer_prefill_split.__wrapped__,
    )
    indexer = _lora_indexer()
    x, q_lora, positions = _inputs()
    batch = _batch()  # TOKENS real tokens inside the padded bucket
    query, key = _with_q_k(indexer)
    stores, topks = [], []

    def store(self, *, forward_batch, layer_id, key, act_quant, out_cache_loc=None):
        stores.append(dict(layer_id=layer_id, key=key, out_cache_loc=out_cache_loc))

    def topk_ragged(
        self,
        enable_dual_stream,
        forward_batch,
        layer_id,
        q_fp8,
        weights,
        metadata,
        topk_result=None,
    ):
        topks.append(dict(q_rows=q_fp8.shape[0], weights=weights, metadata=metadata))
        topk_result[: q_fp8.shape[0]] = torch.arange(TOPK, dtype=torch.int32)
        return topk_result

    indexer._store_index_k_cache = types.MethodType(store, indexer)
    indexer._get_topk_ragged = types.MethodType(topk_ragged, indexer)
    metadata = object()
    backend = SimpleNamespace(
        get_indexer_metadata=lambda layer_id, forward_batch: metadata
    )
    graph_context = set_tc_piecewise_forward_context(
        forward_batch=batch,
        attention_layers=[],
        quant_config=None,
        moe_layers=[],
        moe_fusions=[],
        dsa_indexers=[indexer],
    )

    with (
        forward_context(ForwardContext(attn_backend=backend)),
        graph_context,
        enable_breakable_cuda_graph(),
    ):
        result = indexer.forward_cuda(x, q_lora, positions, batch, LAYER)
        with pytest.raises(RuntimeError, match=GRAPH_ERROR):
            Indexer.forward_cuda.__wrapped__(
                indexer, x, q_lora, positions, batch, LAYER
            )

    (topk,) = topks
    _, q_scale = _act_quant(query, indexer.block_size, indexer.scale_fmt)
    _assert_gate(topk["weights"], x, q_scale)
    assert topk["metadata"] is metadata and topk["q_rows"] == TOKENS
    (stored,) = stores
    assert stored["layer_id"] == LAYER
    assert torch.equal(stored["key"], key[:TOKENS])
    assert torch.equal(stored["out_cache_loc"], batch.out_cache_loc[:TOKENS])
    assert result.shape == (ROWS, TOPK) and result.dtype == torch.int32
    assert torch.equal(
        result[:TOKENS], torch.arange(TOPK, dtype=torch.int32).expand(TOKENS, TOPK)
    )
    assert bool((result[TOKENS:] == -1).all()), "padded rows must keep the -1 sentinel"
