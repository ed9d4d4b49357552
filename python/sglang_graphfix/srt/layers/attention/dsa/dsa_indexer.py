# SPDX-License-Identifier: Apache-2.0
"""DSA indexer ``weights_proj`` LoRA under the breakable prefill graph.

Fixes sglang/srt/layers/attention/dsa/dsa_indexer.py: under a breakable prefill
CUDA graph the indexer runs as one eager split op, whose head gate multiplies by
the bare ``weights_proj.weight`` and so would drop a LoRA delta. Upstream
therefore refuses (GRAPH_WEIGHTS_PROJ_LORA_ERROR), which with the default
breakable prefill graph means the server cannot start with such an adapter. The
split op is eager, so the adapter can simply be applied inside it. The graph
paths this does not cover keep upstream's refusal, reworded to name the path and
the flag that avoids it.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from sglang.srt.layers.attention.dsa import dsa_indexer
from sglang.srt.layers.attention.dsa.dsa_prefill_cuda_graph import (
    GRAPH_WEIGHTS_PROJ_LORA_ERROR,
)
from sglang.srt.layers.attention.dsa.utils import is_graph_dsa_split_op_surface
from sglang.srt.lora.backend.chunked_backend import ChunkedSgmvLoRABackend
from sglang.srt.lora.backend.triton_backend import TritonLoRABackend
from sglang.srt.lora.layers import BaseLayerWithLoRA
from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    is_in_breakable_cuda_graph,
)
from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
    get_tc_piecewise_forward_context,
    is_in_tc_piecewise_cuda_graph,
)
from sglang.srt.runtime_context import get_context, get_exec, get_parallel
from sglang.srt.utils.common import DynamicGradMode
from sglang_graphfix_kernel.lora_head_gate import (
    BATCH_INVARIANT_DELTA_TILES,
    MAX_RANK,
    add_lora_head_gate_delta_,
    lora_head_gate,
    request_segments,
)

_LORA = "DSA indexer LoRA on indexer.weights_proj"
_DROP = "or drop weights_proj from --lora-target-modules."

PIECEWISE_LORA_ERROR = (
    f"{_LORA} is not supported under the tc_piecewise (torch.compile piecewise) "
    "prefill CUDA graph, which sglang 0.5.23 no longer offers as a "
    "--cuda-graph-config choice and sglang-graphfix does not cover. Serve it "
    "under the breakable prefill graph (the default on CUDA: "
    "--cuda-graph-backend-prefill breakable) or without one "
    f"(--cuda-graph-backend-prefill disabled), {_DROP}"
)
BREAKABLE_DECODE_LORA_ERROR = (
    f"{_LORA} is not supported for {{mode}} batches under the breakable decode "
    "CUDA graph (--cuda-graph-backend-decode breakable): that path captures the "
    "indexer head gate from the base weight only; sglang-graphfix applies the "
    "adapter in the indexer split op, which serves non-speculative prefill. Use "
    f"--cuda-graph-backend-decode full (the default), {_DROP}"
)
BREAKABLE_PREFILL_LORA_ERROR = (
    f"{_LORA} is not supported for context-parallel prefill under the breakable "
    "prefill CUDA graph: that path computes the indexer head gate in the graph "
    "from the base weight only; sglang-graphfix applies the adapter in the "
    "indexer split op, which serves prefill without context parallelism. Use "
    f"--cuda-graph-backend-prefill disabled, {_DROP}"
)
QUANTIZED_ACTIVATIONS_LORA_ERROR = (
    f"{_LORA} is not supported with quantized indexer activations (ROCm fused "
    "RMSNorm + FP8 quant) under the breakable prefill CUDA graph: the indexer "
    "split op would need the bf16 activations for the adapter. Use "
    f"--cuda-graph-backend-prefill disabled, {_DROP}"
)


def weights_proj_has_lora(indexer) -> bool:
    """The upstream test: a LoRA adapter owns ``weights_proj`` (fusion folds it
    into ``wk_weights_proj``, and the LoRA manager rejects indexer LoRA then)."""
    return not indexer.use_dsa_indexer_fusion and getattr(
        indexer.weights_proj, "set_lora", False
    )


def fused_gate_lora_ids(indexer, x: torch.Tensor) -> list | None:
    """The split op's lora_ids when every request of the live batch is on an
    adapter and sgl-kernel's gates may serve it (CUDA, sglang's csgmv or triton
    backend, W in x's dtype, not under --enable-deterministic-inference, where
    a request's gate must not depend on what else is in its batch); else None."""
    layer = indexer.weights_proj
    if not (
        dsa_indexer._is_cuda
        and isinstance(layer.lora_backend, (ChunkedSgmvLoRABackend, TritonLoRABackend))
        and layer.weight.dtype == x.dtype
    ):
        return None
    lora_ids = split_op_lora_ids()
    if not lora_ids or None in lora_ids or deterministic_inference():
        return None
    return lora_ids


def lora_head_gate_logits(indexer, x: torch.Tensor, lora_ids) -> torch.Tensor:
    """``weights_proj(x)`` in fp32 with the live batch's adapters, for a batch
    not served by the merged weight; ``lora_ids``: fused_gate_lora_ids(indexer, x).

    - Every request on an adapter (``lora_ids``), several adapters (or one,
      while a graph is captured): one kernel computes base and delta from a
      single read of x (lora_head_gate).
    - Otherwise (a request without an adapter, or deterministic inference):
      upstream's fp32 base GEMM, then the delta for the rows of requests with
      one, so rows without one keep that GEMM bit for bit: one fused launch on
      sglang's dense LoRA backends (csgmv, triton; under deterministic inference
      with tiles that do not depend on the batch), elsewhere, and for pools of a
      rank above sgl-kernel's MAX_RANK, the backend's own kernels."""
    layer = indexer.weights_proj  # ReplicatedLinearWithLoRA
    if not dsa_indexer._is_cuda:
        # Off CUDA upstream's base projection is the module call itself, which
        # for a LoRA layer already adds the delta (as upstream's eager path).
        return layer(x)[0].float()
    backend = layer.lora_backend
    if (
        not isinstance(backend, (ChunkedSgmvLoRABackend, TritonLoRABackend))
        or layer.lora_a.shape[1] > MAX_RANK
    ):
        base = indexer._weights_proj_bf16_in_fp32_out(x)
        return add_delta_with_lora_backend(layer, x, base)
    batch_info = backend.get_batch_info()
    if lora_ids:
        return lora_head_gate(x, layer.weight, layer.lora_a, layer.lora_b, batch_info)
    base = indexer._weights_proj_bf16_in_fp32_out(x)
    tiles = BATCH_INVARIANT_DELTA_TILES if deterministic_inference() else {}
    return add_lora_head_gate_delta_(
        base, x, layer.lora_a, layer.lora_b, batch_info, **tiles
    )


@torch.compile(dynamic=True)
def scale_merged_head_gates(
    logits: torch.Tensor, q_scale: torch.Tensor, n_heads: int, softmax_scale: float
) -> torch.Tensor:
    """Indexer._scale_head_gates of the merged weight's gate: ``logits`` holds
    the two halves' logits side by side (tokens, 2N); their sum is scaled in
    the same fused kernel, so the merged gate launches what upstream's does
    (the GEMM, then one pointwise kernel)."""
    weights = (logits[:, :n_heads] + logits[:, n_heads:]) * n_heads**-0.5
    return weights.unsqueeze(-1) * q_scale * softmax_scale


def bf16_gemm_fp32_out(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x Wᵀ as upstream's Indexer._weights_proj_bf16_in_fp32_out on CUDA."""
    return torch.mm(x, weight.t(), out_dtype=torch.float32)


# weights_proj layer -> {adapter id: its merged weight}.
_MERGED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# weights_proj layer -> MergedWeightsReservation, made with the LoRA memory pool.
_RESERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class MergedWeightsReservation(NamedTuple):
    """One weights_proj's storage for merged weights, allocated with sglang's
    LoRA memory pool (reserve_merged_weights_proj): one (2N, K) pair of
    halves per pool slot, so sglang sizes the KV cache after it."""

    halves: torch.Tensor  # (pool slots, 2N, K), in W's dtype
    pool: weakref.ref  # the LoRAMemoryPool: adapter id -> slot


def merged_gate_reachable(indexer) -> bool:
    """Whether lora_aware_head_gate can take the merged-weight path for this
    indexer in this server: weights_proj wrapped for LoRA (as sglang's LoRA
    manager does before it sets up its memory pool; weights_proj_has_lora
    holds once the pool's buffers are set), on CUDA with sglang's csgmv or
    triton backend, the breakable prefill graph (whose split op calls the
    gate), no --enable-deterministic-inference and no DP attention (under which
    sglang's LoRA manager keeps the prefill eager, graph or not)."""
    return (
        dsa_indexer._is_cuda
        and not indexer.use_dsa_indexer_fusion
        and isinstance(indexer.weights_proj, BaseLayerWithLoRA)
        and isinstance(
            indexer.weights_proj.lora_backend,
            (ChunkedSgmvLoRABackend, TritonLoRABackend),
        )
        and breakable_prefill_graph()
        and not deterministic_inference()
        and not get_parallel().attn_dp_enabled
    )


def reserve_merged_weights_proj(pool, model) -> list:
    """Allocate, for every indexer of ``model`` whose gate can take the merged
    path, one merged weight per slot of the LoRA memory pool ``pool``; the
    reservations made (empty when no indexer needs one)."""
    reserved = []
    for module in model.modules():
        if isinstance(module, dsa_indexer.Indexer) and merged_gate_reachable(module):
            weight = module.weights_proj.weight
            halves = torch.empty(
                (pool.max_loras_per_batch, 2 * weight.shape[0], weight.shape[1]),
                dtype=weight.dtype,
                device=weight.device,
            )
            reservation = MergedWeightsReservation(halves, weakref.ref(pool))
            _RESERVED[module.weights_proj] = reservation
            reserved.append(reservation)
    return reserved


def merged_weights_proj(layer, lora_id: str, batch_info) -> torch.Tensor | None:
    """weights_proj with adapter ``lora_id`` (the batch's only one) merged in:
    W + s·B·A in fp32, as two stacked halves in W's dtype, (2N, K), whose sum
    holds it to about 16 bits (W in bf16, as DeepSeek-V3.2's). A single bf16
    weight (8 bits) would err by 17% of the move of an adapter that moves the
    gate by 1%, by 48% at 0.3% (benchmark/merged_gate_precision.py).

    Built from the adapter's pool slot, without a host sync, into the
    layer's reservation (reserve_merged_weights_proj) at that slot; None when
    the pool does not hold the adapter. Without a reservation (no LoRA memory
    pool: the gate driven directly, as the benchmarks do) the slot is read on
    the device (the first request's: lora_ids and the batch info's requests
    share the batch's order) and the weight allocated. Cached per layer and
    adapter until drop_merged_weights_proj or
    drop_adapter_merged_weights_proj."""
    merged = _MERGED.setdefault(layer, {})
    halves = merged.get(lora_id)
    if halves is not None:
        return halves
    reserved = _RESERVED.get(layer)
    if reserved is None:
        slot, out = request_segments(batch_info)[1][:1], None
    else:
        pool = reserved.pool()
        slot = None if pool is None else pool.uid_to_buffer_id.get(lora_id)
        if slot is None:
            return None
        out = reserved.halves[slot]
    halves = merged[lora_id] = _merge(layer, slot, batch_info, out)
    return halves


def _merge(layer, slot, batch_info, out) -> torch.Tensor:
    """The two halves of W + s·B·A for pool ``slot`` (an int, or a one-element
    index tensor on the device), into ``out`` (allocated when None)."""

    def at_slot(t):
        return t[slot] if isinstance(slot, int) else t.index_select(0, slot)[0]

    a = at_slot(layer.lora_a).float()  # (max rank, K)
    b = at_slot(layer.lora_b).float()  # (N, max rank)
    # A pool slot holds its adapter's rank; past it, whatever was there.
    in_rank = torch.arange(b.shape[1], device=b.device) < at_slot(batch_info.lora_ranks)
    a = torch.where(in_rank[:, None], a, 0.0)
    b = torch.where(in_rank[None, :], b, 0.0)
    weight = layer.weight.float() + at_slot(batch_info.scalings) * (b @ a)
    high = weight.to(layer.weight.dtype)
    low = (weight - high.float()).to(layer.weight.dtype)
    return torch.cat([high, low], out=out)


def drop_merged_weights_proj() -> None:
    """Forget every merged weights_proj: the LoRA memory pool is loading an
    adapter (it may rewrite a slot one came from; an adapter id can come back
    with other weights) or an online weight update (or update session)
    rewrites W. Reservations stay allocated for the next merge."""
    _MERGED.clear()


def drop_adapter_merged_weights_proj(lora_id: str) -> int:
    """Forget adapter ``lora_id``'s merged weights_proj (it is unloaded); how
    many layers held one. Reservations stay allocated for the next merge."""
    return sum(merged.pop(lora_id, None) is not None for merged in _MERGED.values())


def warm_up_merged_gate_scaling(model) -> int:
    """Compile scale_merged_head_gates (torch.compile, Inductor) for every
    indexer of ``model`` with a merged-weight reservation, as the gate calls
    it: its dtypes, constants, device and grad mode (the scheduler's
    DynamicGradMode; Dynamo guards on it), tokens dynamic (4096 as a size
    hint, a typical prefill bucket); how many distinct compilations ran.
    Outside stream capture, before any request."""
    seen = set()
    for module in model.modules():
        if not (
            isinstance(module, dsa_indexer.Indexer) and module.weights_proj in _RESERVED
        ):
            continue
        device = module.weights_proj.weight.device
        key = (module.n_heads, module.softmax_scale, module.head_dim, device)
        if key in seen:
            continue
        seen.add(key)
        with DynamicGradMode():
            tokens = 4096
            logits = torch.zeros(
                (tokens, 2 * module.n_heads), dtype=torch.float32, device=device
            )
            # act_quant's scales of the indexer query: one per head and block.
            q_scale = torch.ones(
                (tokens, module.n_heads, module.head_dim // module.block_size),
                dtype=torch.float32,
                device=device,
            )
            scale_merged_head_gates(
                logits, q_scale, module.n_heads, module.softmax_scale
            )
    return len(seen)


def breakable_prefill_graph() -> bool:
    """The prefill CUDA graph backend is breakable (sglang's default on CUDA;
    read as upstream's resolve_prefill_backend does); False where no server
    config is published."""
    if not get_context().is_config_namespace_published("exec"):
        return False
    config = get_exec().graph.cuda_graph_config
    backend = config.prefill.backend if config is not None else Backend.BREAKABLE
    return backend == Backend.BREAKABLE


def deterministic_inference() -> bool:
    """--enable-deterministic-inference; False where no server config is
    published (the gate driven directly, as in the benchmarks)."""
    return get_context().is_config_namespace_published("exec") and bool(
        get_exec().deterministic.enable_deterministic_inference
    )


def split_op_lora_ids() -> list | None:
    """The adapter of each request of the split op's live batch (None: the
    base model), host-side, from the prefill graph's forward context; None when
    there is no such context."""
    context = get_tc_piecewise_forward_context()
    return getattr(getattr(context, "forward_batch", None), "lora_ids", None)


def add_delta_with_lora_backend(layer, x: torch.Tensor, base: torch.Tensor):
    """The call ReplicatedLinearWithLoRA.forward makes, with ``base`` as the base
    output: the LoRA backend's own shrink and expand add the delta into it."""
    return layer.lora_backend.forward_with_base(
        layer,
        x,
        lambda: base,
        layer.lora_a,
        layer.lora_b,
        layer._output_offset,
        layer.lora_offsets,
    )


def batch_has_adapter(layer) -> bool:
    """Whether any request of the live batch uses an adapter (host-side flag the
    LoRA manager sets per batch). Always True while a CUDA graph is captured, so
    a captured gate never bakes in the no-adapter case."""
    return capturing() or layer.lora_backend.get_batch_info().has_active_lora


def capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# What:    Wraps Indexer._get_logits_head_gate: with a LoRA-wrapped weights_proj
#          the head gate includes the live batch's adapters.
# Why:     The graph split op (bcg_dsa_indexer_prefill_split) builds the gate
#          from weights_proj.weight alone, silently dropping the adapter.
# How:     Batches without an adapter run upstream's gate unchanged. One
#          adapter for all (fused_gate_lora_ids, not under stream capture: the
#          merged weight would be baked in): upstream's GEMM on the merged
#          weight's two halves (built into the LoRA pool's reservation, see
#          lora/mem_pool.py), added inside the scaling
#          (scale_merged_head_gates). Otherwise
#          lora_head_gate_logits (several: one launch for base + delta; a
#          request without one: the base GEMM + one fused delta launch), then
#          upstream's scaling (_scale_head_gates). Rows without an adapter
#          equal upstream's gate.
# Upstream: sglang/srt/layers/attention/dsa/dsa_indexer.py::Indexer._get_logits_head_gate
# Removal: once the upstream split op applies weights_proj LoRA.
def lora_aware_head_gate(original, self, x, q_scale):
    layer = self.weights_proj
    if not (
        weights_proj_has_lora(self) and layer.lora_active and batch_has_adapter(layer)
    ):
        return original(self, x, q_scale)
    if isinstance(x, tuple):
        raise RuntimeError(QUANTIZED_ACTIVATIONS_LORA_ERROR)
    lora_ids = fused_gate_lora_ids(self, x)
    if lora_ids and len(set(lora_ids)) == 1 and not capturing():
        batch_info = layer.lora_backend.get_batch_info()
        halves = merged_weights_proj(layer, lora_ids[0], batch_info)
        if halves is not None:
            return scale_merged_head_gates(
                bf16_gemm_fp32_out(x, halves), q_scale, self.n_heads, self.softmax_scale
            )
    return self._scale_head_gates(lora_head_gate_logits(self, x, lora_ids), q_scale)


def unsupported_graph_lora_error(forward_batch) -> str:
    """Why a prefill/decode graph path other than the breakable split op cannot
    serve weights_proj LoRA, and the flag that avoids it."""
    if is_in_tc_piecewise_cuda_graph():
        return PIECEWISE_LORA_ERROR
    mode = forward_batch.forward_mode
    if mode.is_extend_without_speculative() and not mode.is_cuda_graph():
        return BREAKABLE_PREFILL_LORA_ERROR
    return BREAKABLE_DECODE_LORA_ERROR.format(mode=mode.name)


# What:    Wraps Indexer.forward_cuda: under the breakable prefill graph, dispatch
#          the indexer split op even when weights_proj carries a LoRA adapter;
#          elsewhere reword upstream's refusal.
# Why:     Upstream raises GRAPH_WEIGHTS_PROJ_LORA_ERROR there, which the default
#          breakable prefill graph hits at startup; its advice ("remove the
#          explicit prefill cuda-graph backend override") does not help.
# How:     For that case (breakable graph, split-op surface, no prefill CP, LoRA
#          on weights_proj) allocate the padded top-k buffer and call the BCG
#          split op as upstream's branch does; lora_aware_head_gate applies the
#          delta inside it. Everything else runs upstream unchanged; its
#          GRAPH_WEIGHTS_PROJ_LORA_ERROR (tc_piecewise prefill, breakable decode
#          or CP prefill) is re-raised naming that path and the flag to use.
# Upstream: sglang/srt/layers/attention/dsa/dsa_indexer.py::Indexer.forward_cuda
# Removal: with lora_aware_head_gate.
def lora_aware_split_op_dispatch(
    original,
    self,
    x,
    q_lora,
    positions,
    forward_batch,
    layer_id,
    return_indices: bool = True,
    use_cuda_graph: bool = True,
):
    lora = use_cuda_graph and weights_proj_has_lora(self)
    if (
        lora
        and is_in_breakable_cuda_graph()
        and is_graph_dsa_split_op_surface(forward_batch)
        and not self.dsa_enable_prefill_cp
    ):
        return _dispatch_breakable_split_op(
            self, x, q_lora, positions, layer_id, return_indices
        )
    try:
        return original(
            self,
            x,
            q_lora,
            positions,
            forward_batch,
            layer_id,
            return_indices=return_indices,
            use_cuda_graph=use_cuda_graph,
        )
    except RuntimeError as exc:
        if lora and str(exc) == GRAPH_WEIGHTS_PROJ_LORA_ERROR:
            raise RuntimeError(unsupported_graph_lora_error(forward_batch)) from exc
        raise


def _dispatch_breakable_split_op(self, x, q_lora, positions, layer_id, return_indices):
    """Upstream's split-op branch of forward_cuda, for the breakable graph."""
    x_parts = x if isinstance(x, tuple) else (x,)
    rows = x_parts[0].shape[0] if return_indices else 0
    # Static padded buffer the split op fills in place; -1 marks no index.
    topk_result = torch.full(
        (rows, self.index_topk), -1, dtype=torch.int32, device=x_parts[0].device
    )
    dsa_indexer.bcg_dsa_indexer_prefill_split(
        layer_id=layer_id,
        x=x_parts[0],
        q_lora=q_lora,
        positions=positions,
        topk_result=topk_result,
        x_s=x_parts[1] if len(x_parts) > 1 else None,
        x_bf16=x_parts[2] if len(x_parts) > 2 else None,
    )
    result = dsa_indexer._broadcast_indexer_topk_from_rank0(
        topk_result if return_indices else None
    )
    return dsa_indexer.maybe_capture_indexer_topk(layer_id, result)
