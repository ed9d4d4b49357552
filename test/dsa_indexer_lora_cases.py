"""DSA indexer weights_proj LoRA on CPU: what the DSA tests share (test/unit/srt/
layers/attention/dsa, test/unit/srt/lora, test/unit/srt/model_executor/
model_runner_components, test/unit/benchmark).

The real sglang 0.5.23 Indexer.forward_cuda, graph split op and head gate run with
sglang-graphfix applied. weights_proj is sglang's ReplicatedLinearWithLoRA on its
TritonLoRABackend (and on ChunkedSgmvLoRABackend, csgmv, sglang's default), whose
batch info comes from the backend's own prepare_lora_batch: three requests, two adapters of different ranks and scalings
and one request without an adapter, padded to the graph's token bucket. Only what
needs a GPU is replaced (cpu_stand_ins, an autouse fixture each test module
imports): the platform probes (is_cuda), pinned host memory, the
Triton kernels (act_quant, sglang's LoRA shrink/expand and sgl-kernel's fused
head-gate delta: torch references with the kernels' contracts, for csgmv's shrink
including the compile-cache key under which sglang reuses a compiled kernel; the
fused kernel itself runs in Triton's interpreter in test/unit/sgl_kernel), upstream's fp32 base GEMM (torch.mm with out_dtype has no CPU
kernel) and the Indexer steps that launch GPU kernels (q/k projection, k-cache
store, ragged top-k: recorders). Upstream is called through ``__wrapped__`` to
show what is fixed.
"""

import itertools
import re
from types import SimpleNamespace

import pytest
import torch
from lora_head_gate_cases import prepare as prepare_lora_batch

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
from sglang.srt.lora.layers import ReplicatedLinearWithLoRA
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
    set_tc_piecewise_forward_context,
)
from sglang.srt.runtime_context import get_parallel
from sglang.srt.utils.common import CachedKernel
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as ours
from sglang_graphfix_kernel.lora_head_gate import request_segments

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
FUSED_DELTA_TILES = []  # the tile overrides of each call, in order


def _fused_head_gate_delta(out, x, lora_a, lora_b, batch_info, **tiles):
    """sgl-kernel's add_lora_head_gate_delta_: per request (its
    request_segments view of the batch info), out[rows] += scaling · (x[rows] Aᵀ
    rounded to x's dtype) Bᵀ in fp32, in place; requests of rank-0 slots and
    every other row untouched. Counted."""
    FUSED_DELTA_CALLS.append(batch_info)
    FUSED_DELTA_TILES.append(tiles)
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
def cpu_stand_ins(monkeypatch):
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
    ours._RESERVED.clear()
    FUSED_DELTA_CALLS.clear()
    FUSED_DELTA_TILES.clear()
    FULL_GATE_CALLS.clear()
    MERGED_GEMM_CALLS.clear()
    for factory in ("tensor", "zeros", "empty", "arange"):
        monkeypatch.setattr(torch, factory, _unpinned(getattr(torch, factory)))
    # sglang's parallel context as a server without DP attention publishes it.
    with (
        torch.compiler.set_stance("force_eager"),
        get_parallel().override(attn_dp_enabled=False),
    ):
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
        return _indexer(layer)._get_logits_head_gate(
            x, _q_scale() if q_scale is None else q_scale
        )


# --------------------------------------------------------------------------- #
# sglang's LoRA manager and memory pool around one indexer.
# --------------------------------------------------------------------------- #


def _lora_server(monkeypatch, prefill="breakable", deterministic=False):
    """What sglang's LoRA memory pool and the merged gate read of a running
    server: the parallel layout (TP 1) and the published exec config (the
    prefill CUDA graph backend, --enable-deterministic-inference)."""
    from sglang.srt.lora import mem_pool as upstream_pool

    monkeypatch.setattr(
        upstream_pool,
        "get_parallel",
        lambda: SimpleNamespace(
            tp_size=1, tp_rank=0, attn_tp_size=1,
            moe_ep_size=1, moe_ep_rank=0, moe_tp_size=1, moe_tp_rank=0,
        ),
    )  # fmt: skip
    published = SimpleNamespace(is_config_namespace_published=lambda name: True)
    monkeypatch.setattr(ours, "get_context", lambda: published)
    exec_config = SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=deterministic),
        graph=SimpleNamespace(
            cuda_graph_config=SimpleNamespace(prefill=SimpleNamespace(backend=prefill))
        ),
    )
    monkeypatch.setattr(ours, "get_exec", lambda: exec_config)


def _lora_manager(layer):
    """sglang's LoRAManager (its __init__ needs a server: the attributes set
    here are what init_memory_pool and unload_lora_adapter read) for a
    one-layer DeepSeek-V3.2-shaped model whose indexer owns ``layer``, a
    LoRA-wrapped weights_proj, the only --lora-target-modules, with
    --max-loras-per-batch MAX_LORAS."""
    from sglang.srt.lora.lora_manager import LoRAManager

    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.model.layers[0].self_attn = torch.nn.Module()
    model.model.layers[0].self_attn.indexer = _indexer(layer)
    model.config = SimpleNamespace(
        architectures=["DeepseekV32ForCausalLM"],
        num_hidden_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        index_n_heads=N_HEADS,
        index_head_dim=HEAD_DIM,
        index_topk=TOPK,
    )
    # sglang's manager wraps the modules (init_lora_modules) before it sets up
    # the pool, and hands them the pool's buffers after (update_lora_info).
    layer.set_lora = False
    manager = LoRAManager.__new__(LoRAManager)
    manager.__dict__.update(
        base_model=model,
        base_hf_config=model.config,
        device=torch.device("cpu"),
        max_loras_per_batch=MAX_LORAS,
        dtype=torch.bfloat16,
        max_lora_rank=MAX_RANK,
        target_modules={"indexer.weights_proj"},
        eviction_policy="lru",
        lora_added_tokens_size=0,
        experts_shared_outer_loras=False,
        lora_strict_loading=False,
        enable_lora_overlap_loading=False,
        lora_modules=[{"self_attn.indexer.weights_proj": layer}],
        embed_tokens_module=None,
        lm_head_module=None,
        configs={},
        loras={},
        lora_refs={},
        num_pinned_loras=0,
        pending_lora_load_events={},
    )
    return manager


def _init_lora_pool(manager):
    """LoRAManager.init_state's last steps: sglang's init_memory_pool, then
    update_lora_info's set_lora_info on weights_proj, here with the
    adapters' buffers (_lora_buffers) instead of the new pool's empty ones."""
    from sglang.srt.lora.lora_manager import LoRAManager

    LoRAManager.init_memory_pool(manager)
    (modules,) = manager.lora_modules
    modules["self_attn.indexer.weights_proj"].set_lora_info(*_lora_buffers())


def _resident(pool, lora_id, slot):
    """The pool's records after it loaded adapter ``lora_id`` into ``slot``
    (LoRAMemoryPool.prepare_lora_batch); the weights themselves are the
    layer's own buffers (_lora_buffers)."""
    pool.eviction_policy.mark_used(lora_id)
    pool.uid_to_buffer_id[lora_id] = slot
    pool.buffer_id_to_uid[slot] = lora_id
