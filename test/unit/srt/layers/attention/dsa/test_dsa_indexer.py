"""DSA indexer weights_proj LoRA under piecewise/breakable prefill graphs, on CPU.

The real sglang 0.5.23 Indexer.forward_cuda, graph split op and head gate run with
sglang-graphfix applied. Only what needs a GPU is replaced: the platform probes
(is_cuda), the Triton act_quant kernel (a torch reference), the Indexer steps
that launch GPU kernels (q/k projection, k-cache store, ragged top-k: recorders),
and the LoRA-wrapped weights_proj (a module with ReplicatedLinearWithLoRA's call
contract). Upstream is called through ``__wrapped__`` to show what is fixed.
"""

import re
import types
from types import SimpleNamespace

import pytest
import torch

import sglang.kernels.ops.quantization.act_quant_triton as act_quant_triton
from sglang.srt.layers.attention.dsa import dsa_indexer as upstream
from sglang.srt.layers.attention.dsa import dsa_prefill_cuda_graph as split_ops
from sglang.srt.layers.attention.dsa import utils as dsa_utils
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

HIDDEN, Q_LORA, N_HEADS, HEAD_DIM, TOPK, RANK = 64, 32, 8, 128, 4, 4
ROWS = 8  # the graph's padded token bucket
LAYER = 0
GRAPH_ERROR = re.escape(GRAPH_WEIGHTS_PROJ_LORA_ERROR)


class _LoRAWeightsProj(torch.nn.Module):
    """weights_proj as sglang's ReplicatedLinearWithLoRA presents it: ``weight`` is
    the base weight, ``set_lora`` marks an attached adapter, and calling it returns
    ``(base + LoRA delta, None)``. The delta is large, as a trained adapter's may be."""

    def __init__(self, set_lora: bool):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(
            (0.02 * torch.randn(N_HEADS, HIDDEN, generator=g)).bfloat16(),
            requires_grad=False,
        )
        self.lora_a = (torch.randn(RANK, HIDDEN, generator=g) / HIDDEN**0.5).bfloat16()
        self.lora_b = torch.randn(N_HEADS, RANK, generator=g).bfloat16()
        self.set_lora = set_lora
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = x @ self.weight.t()
        if self.set_lora:
            out = out + (x @ self.lora_a.t()) @ self.lora_b.t()
        return out, None


def _indexer(
    *, lora: bool = True, fusion: bool = False, prefill_cp: bool = False
) -> Indexer:
    """An Indexer with the attributes forward_cuda, the split op and the head gate
    read; __init__ itself needs a GPU (rope cache, SM count, DeepGEMM)."""
    indexer = Indexer.__new__(Indexer)
    torch.nn.Module.__init__(indexer)
    indexer.weights_proj = _LoRAWeightsProj(set_lora=lora)
    indexer.use_dsa_indexer_fusion = fusion
    indexer.n_heads, indexer.head_dim = N_HEADS, HEAD_DIM
    indexer.softmax_scale = HEAD_DIM**-0.5
    indexer.index_topk = TOPK
    indexer.block_size, indexer.scale_fmt = 128, "ue8m0"
    indexer.alt_stream = None
    indexer.dsa_enable_prefill_cp = prefill_cp
    indexer.use_gfx950_fused_indexer = False
    indexer.use_aiter_fused_fp8_writer = False
    # On CUDA, Indexer._weights_proj_bf16_in_fp32_out multiplies by the bare
    # weights_proj.weight (torch.mm with out_dtype, which has no CPU kernel).
    # Same math, counted, so tests see whether upstream's gate ran.
    indexer.bare_gemm_calls = 0

    def cuda_weights_proj_bf16_in_fp32_out(self, x):
        self.bare_gemm_calls += 1
        return x.float() @ self.weights_proj.weight.float().t()

    indexer._weights_proj_bf16_in_fp32_out = types.MethodType(
        cuda_weights_proj_bf16_in_fp32_out, indexer
    )
    return indexer


def _act_quant(x, block_size=128, scale_fmt=None):
    """Torch reference of the Triton act_quant: per-block fp8 e4m3 with an fp32
    scale (rounded up to a power of two for ue8m0)."""
    blocks = x.float().unflatten(-1, (-1, block_size))
    scale = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448.0
    if scale_fmt is not None:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return (blocks / scale).flatten(-2).to(torch.float8_e4m3fn), scale.squeeze(-1)


def _lora_gate(indexer, x, q_scale):
    weights = indexer.weights_proj(x)[0].float() * indexer.n_heads**-0.5
    return weights.unsqueeze(-1) * q_scale * indexer.softmax_scale


def _bare_gate(indexer, x, q_scale):
    weights = (
        x.float() @ indexer.weights_proj.weight.float().t()
    ) * indexer.n_heads**-0.5
    return weights.unsqueeze(-1) * q_scale * indexer.softmax_scale


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, HIDDEN, generator=g).bfloat16()
    q_lora = torch.randn(ROWS, Q_LORA, generator=g).bfloat16()
    return x, q_lora, torch.arange(ROWS)


def _batch(mode=ForwardMode.EXTEND, num_tokens=ROWS - 2):
    return SimpleNamespace(
        forward_mode=mode,
        extend_num_tokens=num_tokens,
        seq_lens_cpu=torch.tensor([num_tokens]),
        out_cache_loc=torch.arange(100, 100 + ROWS),
    )


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    """Hardware probes as on a CUDA device, the Triton act_quant as a torch
    reference, and torch.compile'd Indexer helpers run eagerly (no inductor)."""
    torch.manual_seed(0)
    monkeypatch.setattr(dsa_utils, "is_cuda", lambda: True)
    monkeypatch.setattr(split_ops, "_is_cuda", True)
    monkeypatch.setattr(act_quant_triton, "act_quant", _act_quant)
    with torch.compiler.set_stance("force_eager"):
        yield


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


# --------------------------------------------------------------------------- #
# Head gate (Indexer._get_logits_head_gate), used by the graph split op.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "fusion, set_lora, expected",
    [(False, True, True), (False, False, False), (True, True, False)],
)
def test_weights_proj_has_lora(fusion, set_lora, expected):
    indexer = _indexer(lora=set_lora, fusion=fusion)
    assert bool(ours.weights_proj_has_lora(indexer)) is expected


def test_head_gate_applies_the_lora_delta():
    indexer = _indexer(lora=True)
    x, _, _ = _inputs()
    q_scale = torch.rand(ROWS, N_HEADS, 1) + 0.5

    gate = indexer._get_logits_head_gate(x, q_scale)

    torch.testing.assert_close(gate, _lora_gate(indexer, x, q_scale))
    assert indexer.bare_gemm_calls == 0, "upstream's bare-weight gate ran"
    bare = _bare_gate(indexer, x, q_scale)
    assert (gate - bare).abs().max() > 3 * bare.abs().max(), (
        "the delta is not in the gate"
    )


def test_upstream_head_gate_drops_the_lora_delta():
    """What the split op computed before the fix: the bare weight only."""
    indexer = _indexer(lora=True)
    x, _, _ = _inputs()
    q_scale = torch.rand(ROWS, N_HEADS, 1) + 0.5

    gate = Indexer._get_logits_head_gate.__wrapped__(indexer, x, q_scale)

    torch.testing.assert_close(gate, _bare_gate(indexer, x, q_scale))
    assert not torch.allclose(gate, _lora_gate(indexer, x, q_scale))


@pytest.mark.parametrize("fusion", [False, True])
def test_head_gate_without_lora_is_upstream(fusion):
    # With fusion there is no separate weights_proj for LoRA to own (set_lora is moot).
    indexer = _indexer(lora=fusion, fusion=fusion)
    x, _, _ = _inputs()
    q_scale = torch.rand(ROWS, N_HEADS, 1) + 0.5

    gate = indexer._get_logits_head_gate(x, q_scale)

    assert indexer.bare_gemm_calls == 1, "upstream's gate did not run"
    assert indexer.weights_proj.calls == 0
    torch.testing.assert_close(gate, _bare_gate(indexer, x, q_scale))


def test_head_gate_refuses_quantized_activations_with_lora():
    indexer = _indexer(lora=True)
    x, _, _ = _inputs()
    with pytest.raises(RuntimeError, match=GRAPH_ERROR):
        indexer._get_logits_head_gate(
            (x, torch.ones(ROWS, 1)), torch.ones(ROWS, N_HEADS, 1)
        )


# --------------------------------------------------------------------------- #
# Dispatch (Indexer.forward_cuda) on the graph split-op surface.
# --------------------------------------------------------------------------- #


def test_upstream_refuses_weights_proj_lora_on_the_split_op_surface(split_op_calls):
    """The startup crash of the default breakable prefill graph (at capture)."""
    indexer = _indexer(lora=True)
    x, q_lora, positions = _inputs()
    with enable_breakable_cuda_graph(), pytest.raises(RuntimeError, match=GRAPH_ERROR):
        Indexer.forward_cuda.__wrapped__(indexer, x, q_lora, positions, _batch(), LAYER)
    assert split_op_calls == []


_GRAPHS = {
    "breakable": (enable_breakable_cuda_graph, "bcg"),
    "piecewise": (enable_tc_piecewise_cuda_graph, "pcg"),
}


@pytest.mark.parametrize("graph", sorted(_GRAPHS))
@pytest.mark.parametrize("quantized_x", [False, True])
@pytest.mark.parametrize("return_indices", [True, False])
def test_lora_dispatches_the_split_op_like_upstream_does_without_lora(
    graph, quantized_x, return_indices, split_op_calls, upstream_body_runs
):
    enter_graph, op = _GRAPHS[graph]
    x, q_lora, positions = _inputs()
    # ROCm's fused RMSNorm+quant hands (x, x_s) over; the op takes the parts.
    x_in = (x, torch.ones(ROWS, 1)) if quantized_x else x
    batch = _batch()

    with enter_graph():
        result = _indexer(lora=True).forward_cuda(
            x_in, q_lora, positions, batch, LAYER, return_indices=return_indices
        )
    assert upstream_body_runs == [], "the LoRA case fell through to upstream"
    assert len(split_op_calls) == 1
    ours_call = split_op_calls.pop()

    with enter_graph():
        reference = _indexer(lora=False).forward_cuda(
            x_in, q_lora, positions, batch, LAYER, return_indices=return_indices
        )
    assert upstream_body_runs == [1], "without LoRA upstream must dispatch"
    assert len(split_op_calls) == 1
    upstream_call = split_op_calls.pop()

    assert _describe(ours_call)["op"] == op
    assert _describe(ours_call) == _describe(upstream_call)
    assert _describe(ours_call)["topk_result"] == (
        ((ROWS if return_indices else 0), TOPK),
        torch.int32,
        True,
    )
    assert (
        ours_call["x"] is x
        and ours_call["q_lora"] is q_lora
        and ours_call["positions"] is positions
    )
    if return_indices:
        # The static buffer the split op filled in place is the layer's result.
        assert result is ours_call["topk_result"] and bool((result == 7).all())
        assert reference is upstream_call["topk_result"]
    else:
        assert result is None and reference is None


@pytest.mark.parametrize(
    "case",
    ["decode", "prefill_cp"],
)
def test_lora_off_the_split_op_surface_runs_upstream(
    case, split_op_calls, upstream_body_runs
):
    """Graph paths with no split op keep upstream's behaviour, its refusal included."""
    indexer = _indexer(lora=True, prefill_cp=case == "prefill_cp")
    query = torch.randn(ROWS, N_HEADS, HEAD_DIM).bfloat16()
    indexer._get_q_k_bf16 = types.MethodType(
        _q_k_bf16(query, torch.randn(ROWS, HEAD_DIM)), indexer
    )
    mode = ForwardMode.DECODE if case == "decode" else ForwardMode.EXTEND
    x, q_lora, positions = _inputs()

    with enable_breakable_cuda_graph(), pytest.raises(RuntimeError, match=GRAPH_ERROR):
        indexer.forward_cuda(x, q_lora, positions, _batch(mode), LAYER)
    assert upstream_body_runs == [1]
    assert split_op_calls == []


def test_lora_eager_forward_runs_upstream(split_op_calls):
    indexer = _indexer(lora=True)
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


# --------------------------------------------------------------------------- #
# End to end: what a breakable-graph replay runs for one layer.
# --------------------------------------------------------------------------- #


def test_breakable_replay_feeds_the_lora_gate_to_the_topk(monkeypatch):
    """forward_cuda under a breakable graph dispatches the split op, whose real
    eager body (what the replay runs at the graph break) builds the head gate
    through the patched _get_logits_head_gate, LoRA delta included, and hands it
    to the ragged top-k."""
    # At a replay the breakable wrapper calls straight into the op's eager body.
    monkeypatch.setattr(
        upstream,
        "bcg_dsa_indexer_prefill_split",
        split_ops.pcg_dsa_indexer_prefill_split.__wrapped__,
    )
    indexer = _indexer(lora=True)
    x, q_lora, positions = _inputs()
    batch = _batch(num_tokens=ROWS - 2)  # real tokens inside the padded bucket
    n = batch.extend_num_tokens
    g = torch.Generator().manual_seed(2)
    query = torch.randn(ROWS, N_HEADS, HEAD_DIM, generator=g).bfloat16()
    key = torch.randn(ROWS, HEAD_DIM, generator=g).bfloat16()
    indexer._get_q_k_bf16 = types.MethodType(_q_k_bf16(query, key), indexer)
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
    torch.testing.assert_close(topk["weights"], _lora_gate(indexer, x, q_scale))
    bare = _bare_gate(indexer, x, q_scale)
    assert (topk["weights"] - bare).abs().max() > 3 * bare.abs().max()
    assert indexer.bare_gemm_calls == 0
    assert topk["metadata"] is metadata and topk["q_rows"] == n
    (stored,) = stores
    assert stored["layer_id"] == LAYER
    assert torch.equal(stored["key"], key[:n]) and torch.equal(
        stored["out_cache_loc"], batch.out_cache_loc[:n]
    )
    assert result.shape == (ROWS, TOPK) and result.dtype == torch.int32
    assert torch.equal(
        result[:n], torch.arange(TOPK, dtype=torch.int32).expand(n, TOPK)
    )
    assert bool((result[n:] == -1).all()), "padded rows must keep the -1 sentinel"
