"""The DSA indexer's weights_proj LoRA under tensor parallelism (tp_size=2), on
CPU: sglang's own LoRA memory pool sizes and fills each rank's buffers (the TP
rank and size mocked at the pool's parallel-state getter, as a scheduler process
of rank 0 or 1 sees them), and the head gate runs through the patched
Indexer._get_logits_head_gate on those buffers.

sglang 0.5.23 builds weights_proj as a ReplicatedLinear (every rank holds the
whole (index_n_heads, hidden) weight), ReplicatedLinearWithLoRA slices neither
A nor B, and the pool sizes indexer.weights_proj as replicated
(REPLICATED_LINEAR_LORA_NAMES). So every rank must merge the whole adapter into
the whole weight; a rank that merged a per-rank shard would differ from the
other rank and from the reference. The top-k the split op returns is the one
upstream broadcasts from attention-TP rank 0 (SGLANG_DSA_TOPK_BROADCAST).
"""

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from lora_head_gate_cases import prepare as prepare_lora_batch
from transformers import PretrainedConfig

from sglang.srt.layers.attention.dsa import dsa_indexer as upstream
from sglang.srt.layers.attention.dsa import dsa_prefill_cuda_graph as split_ops
from sglang.srt.layers.attention.dsa import utils as dsa_utils
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.lora import mem_pool as upstream_pool
from sglang.srt.lora.layers import ReplicatedLinearWithLoRA
from sglang.srt.lora.mem_pool import LoRAMemoryPool
from sglang.srt.lora.utils import LoRAType
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    enable_breakable_cuda_graph,
)
from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
    set_tc_piecewise_forward_context,
)
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as ours

TP_SIZE = 2
HIDDEN, N_HEADS, HEAD_DIM, TOPK = 64, 8, 128, 4
MAX_RANK, MAX_LORAS = 8, 3
ADAPTERS = {1: (4, 2.0), 2: (8, 0.5)}  # pool slot -> (rank, scaling)
ROWS = 12
WEIGHTS_PROJ = "model.layers.0.self_attn.indexer.weights_proj"
# A DeepSeek-V3.2 config small enough for CPU: the pool reads the indexer's
# head count (index_n_heads) and the MLA dims of q_b_proj (the control).
CONFIG = PretrainedConfig(
    architectures=["DeepseekV32ForCausalLM"],
    num_hidden_layers=1,
    hidden_size=HIDDEN,
    index_n_heads=N_HEADS,
    index_head_dim=HEAD_DIM,
    index_topk=TOPK,
    q_lora_rank=32,
    kv_lora_rank=16,
    num_attention_heads=4,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
)


def _parallel(rank):
    """get_parallel() as the scheduler process of TP rank ``rank`` sees it
    (no attention DP, no expert parallelism)."""
    return SimpleNamespace(
        tp_size=TP_SIZE,
        tp_rank=rank,
        attn_tp_size=TP_SIZE,
        moe_tp_size=TP_SIZE,
        moe_tp_rank=rank,
        moe_ep_size=1,
        moe_ep_rank=0,
    )


class _BaseModel(torch.nn.Module):
    """What LoRAMemoryPool reads of the base model: its config and a device."""

    def __init__(self):
        super().__init__()
        self.config = CONFIG
        self.anchor = torch.nn.Parameter(torch.zeros(1))


def _adapter_weights(slot):
    """The adapter's full checkpoint tensors (every rank reads the same file)."""
    rank, _ = ADAPTERS[slot]
    g = torch.Generator().manual_seed(slot)
    a = (torch.randn(rank, HIDDEN, generator=g) / HIDDEN**0.5).bfloat16()
    b = torch.randn(N_HEADS, rank, generator=g).bfloat16()
    return a, b


def _adapter(slot):
    """A loaded LoRAAdapter as the pool reads it (config.r, per-layer weights)."""
    a, b = _adapter_weights(slot)
    weights = {f"{WEIGHTS_PROJ}.lora_A.weight": a, f"{WEIGHTS_PROJ}.lora_B.weight": b}
    return SimpleNamespace(
        config=SimpleNamespace(r=ADAPTERS[slot][0]),
        layers=[SimpleNamespace(weights=weights, pinned_weights={})],
        embedding_layers={},
        added_tokens_embeddings={},
    )


def _weights_proj():
    """The indexer's weights_proj: the same replicated bf16 weight on every rank."""
    layer = ReplicatedLinear(HIDDEN, N_HEADS, bias=False, params_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.weight.copy_(0.02 * torch.randn(N_HEADS, HIDDEN, generator=g))
    return layer


def _pool(rank):
    """sglang's LoRA memory pool of TP rank ``rank``, both adapters loaded."""
    with mock.patch.object(upstream_pool, "get_parallel", lambda: _parallel(rank)):
        pool = LoRAMemoryPool(
            CONFIG,
            MAX_LORAS,
            torch.bfloat16,
            MAX_RANK,
            {"indexer.weights_proj", "q_b_proj"},
            _BaseModel(),
            "lru",
            0,
        )
        module = ReplicatedLinearWithLoRA(_weights_proj(), None)
        for slot in ADAPTERS:
            pool.load_lora_weight_to_buffer(
                f"adapter{slot}",
                slot,
                _adapter(slot),
                [{WEIGHTS_PROJ: module}],
                None,
                None,
            )
    return pool


def _rank_layer(rank, requests):
    """weights_proj of TP rank ``rank`` with its LoRA layer on that rank's pool
    buffers (as LoRAManager.update_lora_info sets them), batch info prepared for
    ``requests`` [(tokens, slot)] as the breakable prefill graph's replay."""
    pool = _pool(rank)
    backend = prepare_lora_batch("triton", True, requests, ADAPTERS, rows=ROWS)
    layer = ReplicatedLinearWithLoRA(_weights_proj(), backend)
    layer.set_lora_info(
        pool.get_tensor("indexer.weights_proj", 0, LoRAType.LORA_A),
        pool.get_tensor("indexer.weights_proj", 0, LoRAType.LORA_B),
    )
    return layer


def _indexer(weights_proj):
    """An Indexer with what the head gate and forward_cuda read (its __init__
    needs a GPU)."""
    indexer = Indexer.__new__(Indexer)
    torch.nn.Module.__init__(indexer)
    indexer.weights_proj = weights_proj
    indexer.use_dsa_indexer_fusion = False
    indexer.n_heads, indexer.head_dim = N_HEADS, HEAD_DIM
    indexer.softmax_scale = HEAD_DIM**-0.5
    indexer.index_topk = TOPK
    indexer.dsa_enable_prefill_cp = False
    return indexer


def _lora_ids(requests):
    return [None if slot == 0 else f"adapter{slot}" for _, slot in requests]


def _full_reference(x, requests):
    """x Wᵀ + s·(x Aᵀ) Bᵀ in fp32 from the adapters' FULL checkpoint tensors."""
    logits, start = x.float() @ _weights_proj().weight.float().t(), 0
    for n, slot in requests:
        if slot:
            a, b = _adapter_weights(slot)
            scaling = ADAPTERS[slot][1]
            logits[start : start + n] += (
                scaling * (x[start : start + n].float() @ a.float().t()) @ b.float().t()
            )
        start += n
    return logits


GEMMS, WHOLE_GATES = [], []


def _merged_gemm(x, weight):
    """ours.bf16_gemm_fp32_out without CUDA's torch.mm(out_dtype=fp32)."""
    GEMMS.append(weight)
    return x.float() @ weight.float().t()


def _whole_gate(x, weight, lora_a, lora_b, batch_info):
    """sgl-kernel's lora_head_gate (a Triton kernel) as a torch reference, with
    its shape preconditions: one weight row and one B row per head."""
    assert weight.shape == (N_HEADS, x.shape[1])
    WHOLE_GATES.append((weight, lora_a, lora_b))
    return _add_delta(x.float() @ weight.float().t(), x, lora_a, lora_b, batch_info)


def _add_delta(out, x, lora_a, lora_b, batch_info):
    """sgl-kernel's add_lora_head_gate_delta_ as a torch reference, with its
    shape preconditions (the base gate's heads are B's rows)."""
    assert lora_a.shape[-1] == x.shape[1] and lora_b.shape[1] == out.shape[1]
    seg_indptr, weight_indices, count, _ = ours.request_segments(batch_info)
    for req in range(count):
        start, end = map(int, seg_indptr[req : req + 2])
        slot = int(weight_indices[req])
        rank = int(batch_info.lora_ranks[slot])
        if rank and end > start:
            xa = (x[start:end].float() @ lora_a[slot, :rank].float().t()).to(x.dtype)
            out[start:end] += float(batch_info.scalings[slot]) * (
                xa.float() @ lora_b[slot, :, :rank].float().t()
            )
    return out


def _unpinned(factory):
    def unpinned(*args, pin_memory=False, **kwargs):
        return factory(*args, **kwargs)  # pinning needs a CUDA driver

    return unpinned


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    """CUDA probes on, GPU kernels as torch references, compiled helpers eager."""
    monkeypatch.setattr(upstream, "_is_cuda", True)
    monkeypatch.setattr(dsa_utils, "is_cuda", lambda: True)
    monkeypatch.setattr(split_ops, "_is_cuda", True)
    monkeypatch.setattr(ours, "bf16_gemm_fp32_out", _merged_gemm)
    monkeypatch.setattr(ours, "lora_head_gate", _whole_gate)
    monkeypatch.setattr(ours, "add_lora_head_gate_delta_", _add_delta)
    for factory in ("tensor", "zeros", "empty", "arange"):
        monkeypatch.setattr(torch, factory, _unpinned(getattr(torch, factory)))
    ours.drop_merged_weights_proj()
    GEMMS.clear()
    WHOLE_GATES.clear()
    with torch.compiler.set_stance("force_eager"):
        yield


def _inputs():
    """The indexer's input: the same hidden states on every rank (after the
    all-reduce)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, HIDDEN, generator=g).bfloat16()
    return x, torch.rand(ROWS, N_HEADS, 1, generator=g) + 0.5


def _gate_on_rank(rank, requests):
    layer = _rank_layer(rank, requests)
    x, q_scale = _inputs()
    ctx = set_tc_piecewise_forward_context(
        SimpleNamespace(lora_ids=_lora_ids(requests)), [], None, [], []
    )
    with ctx:
        return _indexer(layer)._get_logits_head_gate(x, q_scale), layer


def test_pool_sizes_weights_proj_lora_whole_on_every_rank():
    """Each rank's pool holds the whole A (rank, hidden) and B (index_n_heads,
    rank) of weights_proj, loaded unsliced; the control: q_b_proj's B (column
    parallel on the attention-TP group) is a half per rank, so the TP mock is
    what the pool sizes by."""
    q_b_full = CONFIG.num_attention_heads * (
        CONFIG.qk_nope_head_dim + CONFIG.qk_rope_head_dim
    )
    for rank in range(TP_SIZE):
        pool = _pool(rank)
        a = pool.get_tensor("indexer.weights_proj", 0, LoRAType.LORA_A)
        b = pool.get_tensor("indexer.weights_proj", 0, LoRAType.LORA_B)
        assert a.shape == (MAX_LORAS, MAX_RANK, HIDDEN)
        assert b.shape == (MAX_LORAS, N_HEADS, MAX_RANK)
        q_b = pool.get_tensor("q_b_proj", 0, LoRAType.LORA_B)
        assert q_b.shape == (MAX_LORAS, q_b_full // TP_SIZE, MAX_RANK)
        for slot, (r, _) in ADAPTERS.items():
            full_a, full_b = _adapter_weights(slot)
            assert torch.equal(a[slot, :r], full_a)
            assert torch.equal(b[slot, :, :r], full_b)


@pytest.mark.parametrize("rank", range(TP_SIZE))
def test_each_rank_merges_the_whole_adapter_into_the_whole_weight(rank):
    """A single-adapter batch on TP rank 0 and rank 1: the merged weight is
    W + s·B·A of the full checkpoint tensors, (2·index_n_heads, hidden); a
    merge from a per-rank half of B or A would neither have this shape nor
    these values."""
    requests = [(5, 1), (7, 1)]
    gate, _ = _gate_on_rank(rank, requests)

    (halves,) = GEMMS
    assert halves.shape == (2 * N_HEADS, HIDDEN)
    a, b = _adapter_weights(1)
    merged = _weights_proj().weight.float() + ADAPTERS[1][1] * b.float() @ a.float()
    high, low = halves.float().chunk(2)
    torch.testing.assert_close(high + low, merged, rtol=2**-15, atol=0)
    x, q_scale = _inputs()
    reference = (_full_reference(x, requests) * N_HEADS**-0.5).unsqueeze(-1)
    reference = reference * q_scale * HEAD_DIM**-0.5
    torch.testing.assert_close(
        gate, reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item()
    )


@pytest.mark.parametrize(
    "requests",
    [[(5, 1), (7, 1)], [(5, 1), (4, 2), (3, 1)], [(5, 0), (7, 2)]],
    ids=["one-adapter", "two-adapters", "with-base-request"],
)
def test_every_rank_computes_the_same_gate(requests, monkeypatch):
    """Without SGLANG_DSA_TOPK_BROADCAST each rank keeps the top-k of its own
    gate: rank 0 and rank 1 take the same path and produce bit-identical gates
    on the same batch (no rank-dependent input to the path choice)."""
    monkeypatch.setattr(
        Indexer,
        "_weights_proj_bf16_in_fp32_out",
        lambda self, x: x.float() @ self.weights_proj.weight.float().t(),
    )
    gates, calls = [], []
    for rank in range(TP_SIZE):
        GEMMS.clear()
        WHOLE_GATES.clear()
        ours.drop_merged_weights_proj()
        gate, _ = _gate_on_rank(rank, requests)
        gates.append(gate)
        calls.append((len(GEMMS), len(WHOLE_GATES)))
    assert calls[0] == calls[1]
    assert torch.equal(gates[0], gates[1])
    x, q_scale = _inputs()
    tokens = sum(n for n, _ in requests)
    reference = (_full_reference(x, requests) * N_HEADS**-0.5).unsqueeze(-1)
    reference = (reference * q_scale * HEAD_DIM**-0.5)[:tokens]
    torch.testing.assert_close(
        gates[0][:tokens],
        reference,
        rtol=2e-2,
        atol=1e-2 * reference.abs().max().item(),
    )


class _AttnTPGroup:
    """attn_tp_group of a two-rank scheduler: records its broadcasts."""

    world_size = TP_SIZE
    pynccl_comm = None

    def __init__(self):
        self.broadcasts = []

    def broadcast(self, tensor, src):
        self.broadcasts.append((tensor, src))


def test_split_op_with_lora_broadcasts_the_topk_from_rank_0(monkeypatch):
    """With SGLANG_DSA_TOPK_BROADCAST=1 and two attention-TP ranks, the
    breakable split op serving the LoRA gate returns the top-k buffer that
    upstream broadcasts from rank 0, as it does without LoRA."""
    monkeypatch.setenv("SGLANG_DSA_TOPK_BROADCAST", "1")
    group = _AttnTPGroup()
    monkeypatch.setattr(
        upstream, "get_parallel", lambda: SimpleNamespace(attn_tp_group=group)
    )
    filled = []

    def split_op(**kwargs):
        kwargs["topk_result"].fill_(3)
        filled.append(kwargs["topk_result"])

    monkeypatch.setattr(upstream, "bcg_dsa_indexer_prefill_split", split_op)
    requests = [(5, 1), (7, 2)]
    indexer = _indexer(_rank_layer(1, requests))
    x, _ = _inputs()
    q_lora = torch.zeros(ROWS, CONFIG.q_lora_rank).bfloat16()
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        extend_num_tokens=ROWS,
        seq_lens_cpu=torch.tensor([ROWS]),
        out_cache_loc=torch.arange(ROWS),
        lora_ids=_lora_ids(requests),
    )

    with enable_breakable_cuda_graph():
        topk = indexer.forward_cuda(x, q_lora, torch.arange(ROWS), batch, 0)

    (buffer,) = filled
    assert topk is buffer
    assert group.broadcasts == [(buffer, 0)]
