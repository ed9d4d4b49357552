"""DSA indexer weights_proj LoRA under the breakable prefill graph, on CPU.

The real sglang 0.5.23 Indexer.forward_cuda, graph split op and head gate run with
sglang-graphfix applied. weights_proj is sglang's ReplicatedLinearWithLoRA on its
TritonLoRABackend (and on ChunkedSgmvLoRABackend, csgmv, sglang's default), whose
batch info comes from the backend's own prepare_lora_batch: three requests, two adapters of different ranks and scalings
and one request without an adapter, padded to the graph's token bucket. Only what
needs a GPU is replaced: the platform probes (is_cuda), pinned host memory, the
Triton kernels (act_quant, sglang's LoRA shrink/expand and sgl-kernel's fused
head-gate delta: torch references with the kernels' contracts, for csgmv's shrink
including the compile-cache key under which sglang reuses a compiled kernel; the
fused kernel itself runs in Triton's interpreter in test/unit/sgl_kernel), upstream's fp32 base GEMM (torch.mm with out_dtype has no CPU
kernel) and the Indexer steps that launch GPU kernels (q/k projection, k-cache
store, ragged top-k: recorders). Upstream is called through ``__wrapped__`` to
show what is fixed.
"""

import importlib.util
import inspect
import itertools
import re
import types
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import sglang.kernels.ops.quantization.act_quant_triton as act_quant_triton
from sglang.kernels.ops.lora.dense import chunked_sgmv_shrink
from sglang.srt.layers.attention.dsa import dsa_indexer as upstream
from sglang.srt.layers.attention.dsa import dsa_prefill_cuda_graph as split_ops
from sglang.srt.layers.attention.dsa import utils as dsa_utils
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
from sglang.srt.layers.attention.dsa.dsa_prefill_cuda_graph import (
    GRAPH_WEIGHTS_PROJ_LORA_ERROR,
)
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.lora.backend import chunked_backend, triton_backend
from sglang.srt.lora.backend.triton_backend import TritonLoRABackend
from sglang.srt.lora.layers import ReplicatedLinearWithLoRA
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    enable_breakable_cuda_graph,
)
from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
    enable_tc_piecewise_cuda_graph,
    set_tc_piecewise_forward_context,
)
from sglang.srt.utils.common import CachedKernel
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as ours
from sglang_graphfix.srt.lora import mem_pool
from sglang_graphfix.srt.model_executor.model_runner_components import weight_updater
from sglang_graphfix_kernel.lora_head_gate import request_segments
from lora_head_gate_cases import prepare as prepare_lora_batch

ROOT = Path(__file__).resolve().parents[6]

HIDDEN, Q_LORA, N_HEADS, HEAD_DIM, TOPK = 64, 32, 8, 128, 4
SOFTMAX_SCALE = HEAD_DIM**-0.5
MAX_RANK, MAX_LORAS = 8, 3
# LoRA memory-pool slots: slot 0 holds no adapter (rank 0), as sglang's pool
# does for requests without one.
ADAPTERS = {1: (4, 2.0), 2: (8, 0.5)}  # slot -> (rank, scaling)
REQUESTS = [(5, 1), (3, 0), (4, 2)]  # (tokens, slot), in batch order
TOKENS = sum(n for n, _ in REQUESTS)
ROWS = 16  # the graph's padded token bucket
LAYER = 0
GRAPH_ERROR = re.escape(GRAPH_WEIGHTS_PROJ_LORA_ERROR)


def _rows(slots):
    """Row indices of the requests whose slot is in ``slots`` (padding: None)."""
    rows, start = [], 0
    for n, slot in REQUESTS:
        if slot in slots:
            rows += range(start, start + n)
        start += n
    if None in slots:
        rows += range(TOKENS, ROWS)
    return torch.tensor(rows)


ADAPTER_ROWS = _rows({1, 2})
NO_ADAPTER_ROWS = _rows({0, None})  # the request without one and the padding


# --------------------------------------------------------------------------- #
# GPU-only pieces, as torch references.
# --------------------------------------------------------------------------- #


def _act_quant(x, block_size=128, scale_fmt=None):
    """Torch reference of the Triton act_quant: per-block fp8 e4m3 with an fp32
    scale (rounded up to a power of two for ue8m0)."""
    blocks = x.float().unflatten(-1, (-1, block_size))
    scale = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448.0
    if scale_fmt is not None:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return (blocks / scale).flatten(-2).to(torch.float8_e4m3fn), scale.squeeze(-1)


def _segments(batch_info):
    """The (rows, slot, rank, scaling) each kernel program works on; segments of
    rank-0 slots and empty segments are no-ops, as in the kernels."""
    for b in range(batch_info.bs):
        n, slot = int(batch_info.seg_lens[b]), int(batch_info.weight_indices[b])
        rank = int(batch_info.lora_ranks[slot])
        if n == 0 or rank == 0:
            continue
        rows = torch.arange(
            int(batch_info.seg_indptr[b]), int(batch_info.seg_indptr[b]) + n
        )
        if batch_info.permutation is not None:
            rows = batch_info.permutation[rows].long()
        yield rows, slot, rank, float(batch_info.scalings[slot])


def _sgemm_lora_a(x, weights, batch_info, stack_num=1):
    """sgemm_lora_a_fwd: out[rows, :rank] = x[rows] @ A[slot, :rank].T, in x's
    dtype; rows of segments without an adapter are left uninitialised (NaN)."""
    assert x.is_contiguous() and weights.is_contiguous()
    out = torch.full((x.shape[0], weights.shape[1]), float("nan"), dtype=x.dtype)
    for rows, slot, rank, _ in _segments(batch_info):
        n = min(weights.shape[1], rank * stack_num)
        out[rows, :n] = (x[rows].float() @ weights[slot, :n].float().t()).to(x.dtype)
    return out


def _sgemm_lora_b(x, weights, batch_info, base_output=None):
    """sgemm_lora_b_fwd: adds scaling * x[rows, :rank] @ B[slot, :, :rank].T,
    rounded to x's dtype, into base_output in place (zeros when None)."""
    assert x.is_contiguous() and weights.is_contiguous()
    out = base_output
    if out is None:
        out = torch.zeros((x.shape[0], weights.shape[1]), dtype=x.dtype)
    for rows, slot, rank, scaling in _segments(batch_info):
        delta = x[rows, :rank].float() @ weights[slot, :, :rank].float().t()
        out[rows] = ((delta * scaling).to(x.dtype) + out[rows]).to(out.dtype)
    return out


# sglang's compile-cache key of _chunked_lora_shrink_kernel (@cached_triton_kernel
# in chunked_sgmv_shrink.py, CachedKernel on CUDA). N (num_slices x the pool's max
# rank) is a constexpr of the kernel but not in the key: one compiled kernel serves
# every N with the same key, with the strides of the first N.
SHRINK_CACHE_KEY_SOURCE = (
    'lambda _, kwargs: (kwargs["K"], kwargs["NUM_SLICES"], kwargs["BLOCK_M"])'
)


def _shrink_cache_key(_, kwargs):
    return (kwargs["K"], kwargs["NUM_SLICES"], kwargs["BLOCK_M"])


def _csgmv_segments(batch_info):
    """The (rows, slot, rank, scaling) of each program of the chunked SGMV
    kernels: every segment slot of a graph's static buffers (the padded tail is
    empty), else num_segments; a program covers at most BLOCK_M (max_len) rows;
    empty segments and rank-0 slots are no-ops."""
    segments = (
        batch_info.weight_indices.shape[0]
        if batch_info.use_cuda_graph
        else batch_info.num_segments
    )
    for seg in range(segments):
        start = int(batch_info.seg_indptr[seg])
        end = min(int(batch_info.seg_indptr[seg + 1]), start + batch_info.max_len)
        slot = int(batch_info.weight_indices[seg])
        rank = int(batch_info.lora_ranks[slot])
        if start >= end or rank == 0:
            continue
        rows = batch_info.permutation[start:end].long()
        yield rows, slot, rank, float(batch_info.scalings[slot])


class _CompiledShrink:
    """_chunked_lora_shrink_kernel compiled for its constexprs: N fixes the
    strides of the weights (slot stride N·K) and of the output (row stride N).
    output[rows, :n] = x[rows] @ A[slot, :n]ᵀ in x's dtype, n = min(N, rank·slices)."""

    def __init__(self, n, k, num_slices, block_m):
        self.n, self.k, self.num_slices = n, k, num_slices

    def __call__(self, x, weights, output, batch_info):
        n_k, weights, output = self.n * self.k, weights.reshape(-1), output.view(-1)
        for rows, slot, rank, _ in _csgmv_segments(batch_info):
            n = min(self.n, rank * self.num_slices)
            a = weights[slot * n_k : slot * n_k + n * self.k].view(n, self.k)
            out = (x[rows].float() @ a.float().t()).to(x.dtype)
            output[(rows[:, None] * self.n + torch.arange(n)).flatten()] = out.flatten()


def _csgmv_shrink(x, weights, batch_info, num_slices, split_k=None):
    """chunked_sgmv_lora_shrink_forward: launches the compiled kernel cached under
    (K, NUM_SLICES, BLOCK_M) (compiling it for this N on a miss) into a new
    (s, N) tensor; what no program writes stays uninitialised (NaN). Split-K (an
    opt-in env for rank-32 shapes) is left out: same sums, other order."""
    assert x.is_contiguous() and weights.is_contiguous()
    n, k = weights.shape[1], weights.shape[2]
    key = _shrink_cache_key(
        None, {"K": k, "NUM_SLICES": num_slices, "BLOCK_M": batch_info.max_len}
    )
    cache = chunked_sgmv_shrink._chunked_lora_shrink_kernel.kernel_cache
    if key not in cache:
        cache[key] = _CompiledShrink(n, *key)
    output = torch.full((x.shape[0], n), float("nan"), dtype=x.dtype)
    cache[key](x, weights, output, batch_info)
    return output


def _csgmv_expand(
    x,
    weights,
    batch_info,
    slice_offsets,
    max_slice_size,
    base_output,
    slice_offsets_cpu=None,
):
    """chunked_sgmv_lora_expand_forward (compiled per MAX_RANK = weights.shape[2],
    which its cache key holds): for slice i, output[rows, lo:hi] += scaling ·
    x[rows, i·r:(i+1)·r] @ B[slot, lo:hi, :r]ᵀ rounded to x's dtype, r =
    min(MAX_RANK, rank), in place into base_output (zeros when None)."""
    assert x.is_contiguous() and weights.is_contiguous()
    max_rank, offsets = weights.shape[2], slice_offsets.tolist()
    assert x.shape[1] == (len(offsets) - 1) * max_rank
    out = base_output
    if out is None:
        out = torch.zeros((x.shape[0], weights.shape[1]), dtype=x.dtype)
    for rows, slot, rank, scaling in _csgmv_segments(batch_info):
        r = min(max_rank, rank)
        for i, (lo, hi) in enumerate(itertools.pairwise(offsets)):
            xa = x[rows, i * r : (i + 1) * r].float()
            delta = (xa @ weights[slot, lo:hi, :r].float().t() * scaling).to(x.dtype)
            out[rows, lo:hi] = (delta + out[rows, lo:hi]).to(out.dtype)
    return out


FUSED_DELTA_CALLS = []


def _fused_head_gate_delta(out, x, lora_a, lora_b, batch_info):
    """sgl-kernel's add_lora_head_gate_delta_: per request (its
    request_segments view of the batch info), out[rows] += scaling · (x[rows] Aᵀ
    rounded to x's dtype) Bᵀ in fp32, in place; requests of rank-0 slots and
    every other row untouched. Counted."""
    FUSED_DELTA_CALLS.append(batch_info)
    return _add_deltas(out, x, lora_a, lora_b, batch_info)


def _add_deltas(out, x, lora_a, lora_b, batch_info):
    seg_indptr, weight_indices, count, _ = request_segments(batch_info)
    for req in range(count):
        start, end = map(int, seg_indptr[req : req + 2])
        slot = int(weight_indices[req])
        rank = int(batch_info.lora_ranks[slot])
        if rank == 0 or end <= start:
            continue
        xa = (x[start:end].float() @ lora_a[slot, :rank].float().t()).to(x.dtype)
        delta = xa.float() @ lora_b[slot, :, :rank].float().t()
        out[start:end] += float(batch_info.scalings[slot]) * delta
    return out


FULL_GATE_CALLS = []


def _full_head_gate(x, weight, lora_a, lora_b, batch_info):
    """sgl-kernel's lora_head_gate: x Wᵀ in fp32 for every row, plus each
    request's delta (as _fused_head_gate_delta). Counted."""
    FULL_GATE_CALLS.append(batch_info)
    out = x.float() @ weight.float().t()
    return _add_deltas(out, x, lora_a, lora_b, batch_info)


def _cuda_fp32_gemm(self, x):
    """Indexer._weights_proj_bf16_in_fp32_out on CUDA: torch.mm(x, weight.t(),
    out_dtype=torch.float32), which has no CPU kernel: the bf16 products
    accumulated in fp32. Counted, so tests see upstream's base GEMM run."""
    self.fp32_gemm_calls = getattr(self, "fp32_gemm_calls", 0) + 1
    return x.float() @ self.weights_proj.weight.float().t()


MERGED_GEMM_CALLS = []


def _merged_gemm(x, weight):
    """ours.bf16_gemm_fp32_out (torch.mm with out_dtype, as _cuda_fp32_gemm).
    Counted."""
    MERGED_GEMM_CALLS.append(weight)
    return x.float() @ weight.float().t()


def _unpinned(factory):
    def unpinned(*args, pin_memory=False, **kwargs):
        return factory(*args, **kwargs)  # pinning needs a CUDA driver

    return unpinned


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    """Hardware probes as on a CUDA device, GPU kernels as torch references, and
    torch.compile'd Indexer helpers run eagerly (no inductor)."""
    torch.manual_seed(0)
    monkeypatch.setattr(upstream, "_is_cuda", True)
    monkeypatch.setattr(dsa_utils, "is_cuda", lambda: True)
    monkeypatch.setattr(split_ops, "_is_cuda", True)
    monkeypatch.setattr(act_quant_triton, "act_quant", _act_quant)
    monkeypatch.setattr(triton_backend, "sgemm_lora_a_fwd", _sgemm_lora_a)
    monkeypatch.setattr(triton_backend, "sgemm_lora_b_fwd", _sgemm_lora_b)
    monkeypatch.setattr(
        chunked_backend, "chunked_sgmv_lora_shrink_forward", _csgmv_shrink
    )
    monkeypatch.setattr(
        chunked_backend, "chunked_sgmv_lora_expand_forward", _csgmv_expand
    )
    # A fresh process: sglang's kernel cache (CachedKernel) of the csgmv shrink,
    # empty, which the stand-in above fills.
    monkeypatch.setattr(
        chunked_sgmv_shrink,
        "_chunked_lora_shrink_kernel",
        CachedKernel(
            chunked_sgmv_shrink._chunked_lora_shrink_kernel, _shrink_cache_key
        ),
    )
    # ChunkedSgmvLoRABackend.__init__ reads the published --max-lora-chunk-size.
    monkeypatch.setattr(
        chunked_backend, "get_lora", lambda: SimpleNamespace(max_lora_chunk_size=16)
    )
    monkeypatch.setattr(Indexer, "_weights_proj_bf16_in_fp32_out", _cuda_fp32_gemm)
    monkeypatch.setattr(ours, "add_lora_head_gate_delta_", _fused_head_gate_delta)
    monkeypatch.setattr(ours, "lora_head_gate", _full_head_gate)
    monkeypatch.setattr(ours, "bf16_gemm_fp32_out", _merged_gemm)
    ours.drop_merged_weights_proj()
    FUSED_DELTA_CALLS.clear()
    FULL_GATE_CALLS.clear()
    MERGED_GEMM_CALLS.clear()
    for factory in ("tensor", "zeros", "empty", "arange"):
        monkeypatch.setattr(torch, factory, _unpinned(getattr(torch, factory)))
    with torch.compiler.set_stance("force_eager"):
        yield


# --------------------------------------------------------------------------- #
# Real sglang objects: weights_proj, its LoRA layer and backend, the Indexer.
# --------------------------------------------------------------------------- #


def _weights_proj() -> ReplicatedLinear:
    """The indexer's weights_proj (bf16, no bias), at a trained model's scale."""
    layer = ReplicatedLinear(HIDDEN, N_HEADS, bias=False, params_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.weight.copy_(0.02 * torch.randn(N_HEADS, HIDDEN, generator=g))
    return layer


def _adapters(max_rank=MAX_RANK):
    """ADAPTERS for a pool of max_rank: the ranks scaled with it."""
    return {s: (r * max_rank // MAX_RANK, c) for s, (r, c) in ADAPTERS.items()}


def _lora_buffers(max_rank=MAX_RANK):
    """LoRA A/B memory-pool buffers (slot, rank rows zero-padded to max_rank).
    The deltas are large, as a trained adapter's may be."""
    g = torch.Generator().manual_seed(1)
    a = torch.zeros(MAX_LORAS, max_rank, HIDDEN, dtype=torch.bfloat16)
    b = torch.zeros(MAX_LORAS, N_HEADS, max_rank, dtype=torch.bfloat16)
    for slot, (rank, _) in _adapters(max_rank).items():
        a[slot, :rank] = torch.randn(rank, HIDDEN, generator=g) / HIDDEN**0.5
        b[slot, :, :rank] = torch.randn(N_HEADS, rank, generator=g)
    return a, b


def _lora_weights_proj(
    base, *, prefill_graph=True, backend="triton", max_rank=MAX_RANK, requests=REQUESTS
) -> ReplicatedLinearWithLoRA:
    """weights_proj wrapped by sglang's LoRA layer on the Triton or csgmv backend,
    its batch info prepared for ``requests`` as the LoRA manager does before a
    forward (lora_head_gate_cases.prepare): the static prefill-graph info
    (breakable replay) or the eager one, then the host-side has_active_lora."""
    backend = prepare_lora_batch(
        backend, prefill_graph, requests, _adapters(max_rank), rows=ROWS
    )
    layer = ReplicatedLinearWithLoRA(base, backend)
    layer.set_lora_info(*_lora_buffers(max_rank))
    assert layer.lora_active
    return layer


def _indexer(
    weights_proj, *, fusion: bool = False, prefill_cp: bool = False
) -> Indexer:
    """An Indexer with the attributes forward_cuda, the split op and the head gate
    read; __init__ itself needs a GPU (rope cache, SM count, DeepGEMM)."""
    indexer = Indexer.__new__(Indexer)
    torch.nn.Module.__init__(indexer)
    indexer.weights_proj = weights_proj
    indexer.use_dsa_indexer_fusion = fusion
    indexer.n_heads, indexer.head_dim = N_HEADS, HEAD_DIM
    indexer.softmax_scale = SOFTMAX_SCALE
    indexer.index_topk = TOPK
    indexer.block_size, indexer.scale_fmt = 128, "ue8m0"
    indexer.alt_stream = None
    indexer.dsa_enable_prefill_cp = prefill_cp
    indexer.use_gfx950_fused_indexer = False
    indexer.use_aiter_fused_fp8_writer = False
    indexer.fp32_gemm_calls = 0
    return indexer


def _lora_indexer(**kwargs) -> Indexer:
    return _indexer(_lora_weights_proj(_weights_proj()), **kwargs)


# --------------------------------------------------------------------------- #
# fp32 references.
# --------------------------------------------------------------------------- #


def _gate(logits, q_scale):
    return (logits * N_HEADS**-0.5).unsqueeze(-1) * q_scale * SOFTMAX_SCALE


def _reference_logits(x, max_rank=MAX_RANK, requests=REQUESTS):
    """x Wᵀ + s·(x Aᵀ) Bᵀ in fp32, each of ``requests`` with its own adapter
    (none for slot 0 and the padding)."""
    logits, start = _bare_logits(x), 0
    a, b = _lora_buffers(max_rank)
    adapters = _adapters(max_rank)
    for n, slot in requests:
        if slot in adapters:
            rank, scaling = adapters[slot]
            xa = x[start : start + n].float() @ a[slot, :rank].float().t()
            logits[start : start + n] += scaling * xa @ b[slot, :, :rank].float().t()
        start += n
    return logits


def _bare_logits(x):
    return x.float() @ _weights_proj().weight.float().t()


def _assert_gate(gate, x, q_scale, max_rank=MAX_RANK):
    """Adapter rows: the fp32 reference up to the kernels' bf16 intermediates
    (x Aᵀ and the delta are rounded to bf16). Other rows: bit-identical to the
    gate of the same weights_proj without LoRA."""
    reference = _gate(_reference_logits(x, max_rank), q_scale)
    torch.testing.assert_close(
        gate[ADAPTER_ROWS],
        reference[ADAPTER_ROWS],
        rtol=2e-2,
        atol=1e-2 * reference.abs().max().item(),
    )
    no_lora = _indexer(_weights_proj())._get_logits_head_gate(x, q_scale)
    assert torch.equal(gate[NO_ADAPTER_ROWS], no_lora[NO_ADAPTER_ROWS])
    bare = _gate(_bare_logits(x), q_scale)
    delta = (gate - bare)[ADAPTER_ROWS].abs().amax(dim=(1, 2))
    assert bool((delta > 3 * bare.abs().max()).all()), "an adapter row lost its delta"


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, HIDDEN, generator=g).bfloat16()
    q_lora = torch.randn(ROWS, Q_LORA, generator=g).bfloat16()
    return x, q_lora, torch.arange(ROWS)


def _q_scale(seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(ROWS, N_HEADS, 1, generator=g) + 0.5


def _lora_ids(requests=REQUESTS):
    """ForwardBatch.lora_ids: the adapter of each request, None for none."""
    return [None if slot == 0 else f"adapter{slot}" for _, slot in requests]


def _batch(mode=ForwardMode.EXTEND, num_tokens=TOKENS):
    return SimpleNamespace(
        forward_mode=mode,
        extend_num_tokens=num_tokens,
        seq_lens_cpu=torch.tensor([num_tokens]),
        out_cache_loc=torch.arange(100, 100 + ROWS),
        lora_ids=_lora_ids(),
    )


def _split_op_context(lora_ids):
    """The prefill graph's forward context the split op runs in (only the
    forward batch's lora_ids matter to the head gate)."""
    return set_tc_piecewise_forward_context(
        SimpleNamespace(lora_ids=lora_ids), [], None, [], []
    )


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


def test_split_op_lora_ids_reads_the_split_op_batch():
    assert ours.split_op_lora_ids() is None  # no prefill-graph context
    with _split_op_context(["a", None]):
        assert ours.split_op_lora_ids() == ["a", None]


# Every request on the adapter of slot 1, whose rank (4) is below the pool's.
ONE_ADAPTER_REQUESTS = [(5, 1), (3, 1), (4, 1)]


def _merged_reference(slot, loras=None):
    """weights_proj with the adapter of ``slot`` merged, W + s·B·A in fp32."""
    a, b = loras or _lora_buffers()
    rank, scaling = ADAPTERS[slot]
    delta = scaling * b[slot, :, :rank].float() @ a[slot, :rank].float()
    return _weights_proj().weight.float() + delta


def _one_adapter_gate(layer, x, q_scale=None):
    with _split_op_context(_lora_ids(ONE_ADAPTER_REQUESTS)):
        return _indexer(layer)._get_logits_head_gate(x, _q_scale() if q_scale is None else q_scale)


@pytest.mark.parametrize("backend", ["triton", "csgmv"])
def test_head_gate_with_one_adapter_for_every_request_is_a_merged_weight_gemm(
    backend,
):
    """A single-adapter batch: upstream's GEMM on W + s·B·A, no LoRA kernel at
    all, so the gate costs what it costs without LoRA. The merged weight (two
    bf16 halves) is built once per layer and adapter, from the adapter's rank
    only: whatever the pool slot holds past it stays out."""
    requests = ONE_ADAPTER_REQUESTS
    layer = _lora_weights_proj(_weights_proj(), backend=backend, requests=requests)
    rank = ADAPTERS[1][0]
    layer.lora_a[1, rank:] = float("nan")
    layer.lora_b[1, :, rank:] = float("nan")
    indexer = _indexer(layer)
    x, _, _ = _inputs()
    q_scale = _q_scale()

    with _split_op_context(_lora_ids(requests)):
        gate = indexer._get_logits_head_gate(x, q_scale)
        again = indexer._get_logits_head_gate(x, q_scale)

    assert not FULL_GATE_CALLS and not FUSED_DELTA_CALLS
    assert indexer.fp32_gemm_calls == 0
    first, second = MERGED_GEMM_CALLS
    assert second is first, "the merged weight was rebuilt"
    assert first.dtype == torch.bfloat16 and first.shape == (2 * N_HEADS, HIDDEN)
    high, low = first.float().chunk(2)
    merged = _merged_reference(1)
    assert torch.equal(high, merged.bfloat16().float())
    torch.testing.assert_close(high + low, merged, rtol=2**-15, atol=0)
    reference = _gate(_reference_logits(x, requests=requests), q_scale)[:TOKENS]
    # Graph padding rows get the adapter too: no request reads them.
    torch.testing.assert_close(
        gate[:TOKENS], reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item()
    )
    assert torch.equal(again, gate)
    bare = _gate(_bare_logits(x), q_scale)
    assert (gate - bare)[:TOKENS].abs().amax(dim=(1, 2)).min() > bare.abs().max()


def test_merged_weight_keeps_a_small_adapter():
    """An adapter that moves the gate by about 0.1%: one bf16 merged weight
    keeps 8 bits of W and rounds away most of that move; the gate on the two
    halves keeps it."""
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    layer.lora_b[1] *= 3e-5
    a, b = _lora_buffers()
    b[1] *= 3e-5
    merged = _merged_reference(1, (a, b))
    x, _, _ = _inputs()
    q_scale = _q_scale()
    bare = _gate(_bare_logits(x), q_scale)[:TOKENS]
    move = _gate(x.float() @ merged.t(), q_scale)[:TOKENS] - bare

    gate = _one_adapter_gate(layer, x, q_scale)[:TOKENS]
    one_bf16 = _gate(x.float() @ merged.bfloat16().float().t(), q_scale)[:TOKENS]

    assert (move.norm() / bare.norm()) < 0.01
    assert ((gate - bare - move).norm() / move.norm()) < 0.01
    assert ((one_bf16 - bare - move).norm() / move.norm()) > 0.3  # the control


def test_merged_weight_is_rebuilt_after_a_pool_load():
    """A load into the LoRA memory pool may rewrite the slot a merged weight
    came from (the same adapter id can come back with other weights): the
    pool-load hook drops every merged weight."""
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    x, _, _ = _inputs()
    before = _one_adapter_gate(layer, x)
    layer.lora_b[1].neg_()  # the slot rewritten, as a load does
    stale = _one_adapter_gate(layer, x)
    loads = []
    mem_pool.drop_merged_gates_on_pool_load(
        lambda pool, *args: loads.append(args), None, "uid", 1
    )
    after = _one_adapter_gate(layer, x)

    assert loads == [("uid", 1)]
    assert torch.equal(stale, before), "without the hook the cache stands"
    a, b = _lora_buffers()
    b[1].neg_()
    high, low = MERGED_GEMM_CALLS[-1].float().chunk(2)
    torch.testing.assert_close(high + low, _merged_reference(1, (a, b)), rtol=2**-15, atol=0)
    assert not torch.allclose(after, before)


@pytest.mark.parametrize("refused", [False, True], ids=["update", "refused"])
def test_merged_weight_is_rebuilt_after_an_online_weight_update(refused):
    """Every online weight update runs sglang's derived-cache check before it
    rewrites weights in place; one that goes ahead drops every merged weight,
    a refused one (the check's error) keeps them."""
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    x, _, _ = _inputs()
    before = _one_adapter_gate(layer, x)
    with torch.no_grad():
        layer.base_layer.weight.mul_(-1.0)  # the update's in-place write
    error = "refused" if refused else None

    assert weight_updater.drop_merged_gates_on_weight_update(lambda model: error, None) == error
    after = _one_adapter_gate(layer, x)

    assert torch.equal(after, before) == refused


def test_capture_never_caches_a_merged_weight(monkeypatch):
    """A merged weight built under stream capture would live in the graph's
    memory: under capture a single-adapter batch takes the whole-gate kernel."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    x, _, _ = _inputs()

    _one_adapter_gate(layer, x)

    assert len(FULL_GATE_CALLS) == 1 and not MERGED_GEMM_CALLS


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


def _benchmark():
    path = ROOT / "benchmark" / "dsa_head_gate.py"
    spec = importlib.util.spec_from_file_location("dsa_head_gate_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _benchmark_setup(bench, backend, ranks):
    """The benchmark's weights_proj, plain and LoRA Indexers, on CPU."""
    gen = torch.Generator().manual_seed(0)
    base = ReplicatedLinear(
        bench.HIDDEN, bench.N_HEADS, bias=False, params_dtype=torch.bfloat16
    )
    with torch.no_grad():
        base.weight.normal_(0.0, 0.02, generator=gen)
    plain, lora_indexer = bench._indexer(base), bench._indexer(base)
    for rank in ranks:
        lora_indexer.weights_proj = bench._lora_layer(
            base, backend, rank, torch.device("cpu"), gen
        )
        yield rank, plain, lora_indexer, gen


@pytest.mark.parametrize(
    "fresh_kernel", [True, False], ids=["as_is", "no_fresh_kernel"]
)
def test_benchmark_checks_csgmv_rank16_then_rank64(monkeypatch, fresh_kernel):
    """benchmark/dsa_head_gate.py's own setup and check (DeepSeek-V3.2 shapes,
    2048 tokens) for csgmv rank 16 then 64 in one process, as it runs them on the
    GPU: every check passes. Without its fresh shrink kernel per backend the
    rank-64 unfused reference (sglang's shrink) fails as it did on the H200; the
    fused gate does not use that kernel and passes either way."""
    bench = _benchmark()
    if not fresh_kernel:
        monkeypatch.setattr(bench, "_fresh_csgmv_shrink_kernel", lambda: None)
    passed = {}
    for rank, plain, lora_indexer, gen in _benchmark_setup(bench, "csgmv", bench.RANKS):
        check = bench._check(plain, lora_indexer, torch.device("cpu"), gen)
        assert check["rank"] == rank
        assert check["has_active_lora"] == {
            "mixed_batch": True,
            "no_adapter_batch": False,
        }
        assert check["lora_adapter"]["ok"]
        assert check["lora_adapter"]["launches"] == {"merged": 1, "delta": 0, "full": 0}
        assert check["lora_adapter_whole_gate"]["ok"]
        assert check["lora_adapter_whole_gate"]["launches"] == {
            "merged": 0, "delta": 0, "full": 1
        }  # fmt: skip
        assert check["mixed_batch"]["ok"]
        assert check["mixed_batch"]["launches"] == {"merged": 0, "delta": 1, "full": 0}
        assert check["lora_no_adapter"] == {
            "bit_identical_to_no_lora": True,
            "launches": {"merged": 0, "delta": 0, "full": 0},
        }
        assert check["unfused_reference"]["rows_without_adapter_bit_identical"]
        passed[rank] = check["pass"]

    assert passed == {16: True, 64: fresh_kernel}


def test_benchmark_checks_triton_backend():
    bench = _benchmark()
    for rank, plain, lora_indexer, gen in _benchmark_setup(bench, "triton", bench.RANKS):
        check = bench._check(plain, lora_indexer, torch.device("cpu"), gen)
        assert check["pass"], check


class _StateTimer:
    """Stands in for the benchmark's CUDA-event Timer: each "time" it reports is
    the state the call ran in: latency = launches of the delta kernel + 10 x
    launches of the whole-gate kernel + 100 x merged-weight GEMMs during the
    call, throughput = 1 + the batch's has_active_lora."""

    def __init__(self, layer):
        self.layer = layer

    @staticmethod
    def _launches():
        return (
            len(FUSED_DELTA_CALLS) + 10 * len(FULL_GATE_CALLS) + 100 * len(MERGED_GEMM_CALLS)
        )

    def _call(self, fn):
        launches = self._launches()
        fn()
        return self._launches() - launches

    def host_ms(self, fn):
        fn()
        return 0.0

    def latency(self, fn, n):
        return [float(self._call(fn)) for _ in range(n)]

    def throughput(self, fn, lead_ms):
        self._call(fn)
        return 1.0 + self.layer.lora_backend.batch_info.has_active_lora, False


@pytest.mark.parametrize("backend", ["csgmv", "triton"])
def test_benchmark_times_each_variant_in_its_batch_state(backend):
    """The benchmark's interleaved rounds prepare each variant's batch (what the
    LoRA manager sets, has_active_lora included) and the split op's lora_ids
    before timing it: the adapter gate runs the merged-weight GEMM, the same
    batch named as on two adapters the whole-gate kernel, on the mixed-batch
    path the delta kernel, the batch without adapters
    and the unfused reference neither; the split-op core runs the same gates."""
    bench = _benchmark()
    (rank, plain, lora_indexer, gen), = _benchmark_setup(bench, backend, [16])
    tokens, device = 32, torch.device("cpu")
    x = torch.randn(tokens, bench.HIDDEN, generator=gen).bfloat16()
    q_scale = torch.rand(tokens, bench.N_HEADS, 1, generator=gen) + 0.5
    core = bench.SplitOpCore(tokens, device, gen)
    variants = bench._variants(plain, lora_indexer, [16, 16], rank, x, q_scale, core)

    measured = bench._measure(
        _StateTimer(lora_indexer.weights_proj), variants, rounds=2, per_round=1, warmup=1
    )

    state = {key: (m["latency_ms"], m["throughput_ms"]) for key, m in measured.items()}
    for part in bench.PARTS:
        assert state[(part, "lora_adapter")] == (100.0, 2.0)
        assert state[(part, "lora_adapter_whole_gate")] == (10.0, 2.0)
        assert state[(part, "lora_adapter_gemm_plus_delta")] == (1.0, 2.0)
        assert state[(part, "lora_no_adapter")] == (0.0, 1.0)
        assert state[(part, "unfused_reference")] == (0.0, 2.0)
        assert state[(part, "no_lora")][0] == 0.0


def test_benchmark_goal_is_the_adapter_split_op_cores_gpu_bound_overhead():
    """meets_goal reads split_op_core throughput of lora_adapter only; the
    latency-based verdict and the gate alone are reported beside it."""
    bench = _benchmark()

    def part(throughput, latency):
        others = dict.fromkeys(
            (
                "lora_adapter_whole_gate",
                "lora_adapter_gemm_plus_delta",
                "lora_no_adapter",
                "unfused_reference",
            ),
            0.0,
        )
        return {
            "throughput_overhead_pct": {**others, "lora_adapter": throughput},
            "latency_overhead_pct": {**others, "lora_adapter": latency},
            "throughput_host_bound_rounds": {"no_lora": 1},
        }

    results = [
        {"gate": part(50.0, 80.0), "split_op_core": part(4.0, 12.0)},
        {"gate": part(1.0, 1.0), "split_op_core": part(-1.0, 1.0)},
    ]
    verdict = bench.summary(results, [{"pass": True}])
    assert verdict["meets_goal"] and not verdict["meets_goal_on_latency"]
    assert verdict["worst_split_op_core_latency_overhead_pct_lora_adapter"] == 12.0
    assert verdict["worst_gate_throughput_overhead_pct"]["lora_adapter"] == 50.0
    assert verdict["throughput_host_bound_rounds"] == 4
    assert verdict["checks_pass"]

    results[1]["split_op_core"] = part(6.0, 1.0)
    assert not bench.summary(results, [{"pass": False}])["meets_goal"]
    assert not bench.summary(results, [{"pass": False}])["checks_pass"]


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


def test_sglangs_pool_load_and_weight_updates_drop_merged_weights():
    """The hooks on sglang's own functions, as applied by register(): a pool
    load (here of the base model into slot 0, on a pool without buffers), an
    online update's derived-cache check and the end of a weight-update session
    each drop every merged weight."""
    from sglang.srt.lora.mem_pool import LoRAMemoryPool
    from sglang.srt.model_executor.model_runner_components import (
        weight_updater as upstream_updater,
    )

    layer = _lora_weights_proj(_weights_proj(), requests=ONE_ADAPTER_REQUESTS)
    buffers = ("A_buffer", "B_buffer", "embedding_A_buffer", "embedding_B_buffer")
    buffers += ("lm_head_A_buffer", "lm_head_B_buffer", "new_embeddings_buffer")
    pool = SimpleNamespace(**{name: {} for name in buffers})
    pool._clear_buffer_slot_for_base = partial(LoRAMemoryPool._clear_buffer_slot_for_base, pool)
    model = torch.nn.Linear(2, 2)
    updater = SimpleNamespace(get_model=lambda: model, device="cpu")
    drops = {
        "pool_load": lambda: LoRAMemoryPool.load_lora_weight_to_buffer(
            pool, None, 0, None, [], None, None
        ),
        "update_check": lambda: upstream_updater._unsupported_derived_weight_cache_error(model),
        "session_end": lambda: upstream_updater.WeightUpdater.end_weight_update(
            updater, run_post_load=False
        ),
    }
    for name, drop in drops.items():
        _one_adapter_gate(layer, _inputs()[0])
        assert layer in ours._MERGED, name
        drop()
        assert layer not in ours._MERGED, name
