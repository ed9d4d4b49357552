# SPDX-License-Identifier: Apache-2.0
"""PrefillCudaGraphRunner and hybrid linear attention under a full prefill graph.

Fixes sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py: only the
decode runner initialises the linear-attention backends' CUDA-graph state, and
sglang captures the prefill graph first (cuda_graph_setup.capture_cuda_graphs),
so a full prefill capture finds no per-batch-size state; nor does anything stop a
linear backend that cannot capture an extend from reaching the capture.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
)
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.layers.attention.linear.inkling_sconv_backend import (
    InklingShortConvAttnBackend,
)
from sglang.srt.layers.attention.linear.kernels.gdn_flashinfer import (
    FlashInferGDNKernel,
)
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
    _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR,
)
from sglang.srt.runtime_context import get_exec, get_spec
from sglang_graphfix.srt.full_prefill_graph_capability import (
    require_capturable_full_prefill_graph,
)
from sglang_graphfix.srt.layers.attention.linear.gdn_backend import (
    EAGER_GDN_PREFILL_DEFAULT,
)
from sglang_graphfix.srt.layers.attention.linear.gdn_prefill_graph import (
    flashinfer_picks_context_parallel,
    gdn_rank_heads,
    use_default_eager_gdn_prefill,
    warm_eager_gdn_prefill,
)

logger = logging.getLogger(__name__)


# What:    Wraps PrefillCudaGraphRunner.capture: before a full prefill graph
#          captures anything, check that every linear-attention backend can
#          capture an extend, then allocate its CUDA-graph state once for both
#          graph phases.
# Why:     The prefill graph captures before the decode runner calls
#          init_cuda_graph_state, so a linear backend reached through
#          _replay_metadata finds no per-batch-size state ("IndexError: list
#          index out of range"); a backend that cannot capture an extend at all
#          (Mamba2, short-conv, Lightning) should fail with the flag to use
#          instead, not inside the capture.
# How:     the capability model asserts on each linear backend and the prefill
#          attention backend (require_capturable_full_prefill_graph); then
#          init_linear_graph_state_for_prefill: only the linear child (the
#          full-attention child, FlashInfer for one, would size its decode
#          buffers by the prefill bounds), sized for the decode runner's later
#          call, which init_linear_graph_state_once then answers without
#          reallocating. Breakable/disabled prefill graphs, and draft workers,
#          are untouched.
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner.capture
# Removal: once upstream's prefill runner initialises linear graph state (or
#          every linear backend plans its extend without it).
def prepare_linear_attention_for_full_prefill_capture(original, self):
    if self._is_full_backend:
        linear_backends = _linear_attention_backends(self.model_runner.attn_backend)
        for linear in linear_backends:
            require_capturable_full_prefill_graph(linear, self)
        if not self.model_runner.is_draft_worker:
            for linear in linear_backends:
                init_linear_graph_state_for_prefill(self, linear)
    return original(self)


def _linear_attention_backends(attn_backend) -> list:
    if isinstance(attn_backend, HybridLinearAttnBackend):
        return [attn_backend.linear_attn_backend]
    return []


def linear_graph_state_bounds(runner) -> tuple[int, int]:
    """(max_bs, tokens per request) for one allocation that serves the full
    prefill graph (its request slots) and the decode runner (the largest decode
    batch size it can capture, never above the configured ones; its width is
    the same decode_num_tokens_per_req call)."""
    decode = get_exec().graph.cuda_graph_config.decode
    decode_max_bs = max([decode.max_bs or 0, *(decode.bs or [])])
    max_bs = max(runner._capture_req_slots, decode_max_bs)
    tokens_per_req = runner.model_runner.decode_num_tokens_per_req(
        num_draft_tokens=get_spec().speculative_num_draft_tokens
    )
    return max_bs, tokens_per_req


def init_linear_graph_state_for_prefill(runner, linear) -> None:
    """The linear backend's own init_cuda_graph_state (subclass extensions
    included); max_num_tokens is a multiple of max_bs, as upstream asserts."""
    if isinstance(linear, InklingShortConvAttnBackend):
        return  # sizes its own graph buffers at init; reads no per-bs state
    max_bs, tokens_per_req = linear_graph_state_bounds(runner)
    linear.init_cuda_graph_state(max_bs, max_bs * tokens_per_req)


# What:    Wraps PrefillCudaGraphRunner.capture: once a full prefill graph has
#          captured, put the eager prefill of the batches it does not take on
#          sglang's default kernels, warm them, and log the routing rule once.
# Why:     A batch with more requests than full_prefill_max_req (sglang's
#          chunked_prefill_size // 512), more tokens than the largest bucket, or a
#          context above the graph's bound runs eager -- and ran eager on the
#          Triton GDN kernel that the full graph kept for the whole process,
#          JIT-compiling it on the first such user request ("took 2.26 s to
#          compile after serving started"; issue 13).
# How:     If keep_triton_gdn_prefill_for_full_graph recorded a default
#          (FlashInfer, unless FLASHINFER_GDN_CAPTURE_SM keeps it for the
#          graph), rebuild the GDN backend's dispatcher with it
#          (use_default_eager_gdn_prefill; the graphs keep the Triton kernels
#          they captured). Run the eager extend of a non-Triton kernel once on
#          scratch state (a graph that captured FlashInfer's holds its variant
#          with snapshots, not the eager one). Then one INFO line: which
#          batches replay the graph and which run eager.
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner.capture
# Removal: with keep_triton_gdn_prefill_for_full_graph.
def route_full_prefill_fallback(original, self):
    result = original(self)
    if not self._is_full_backend:
        return result
    model_runner = self.model_runner
    eager_kernel = "sglang's default kernels"
    default = getattr(model_runner, EAGER_GDN_PREFILL_DEFAULT, None)
    for linear in _linear_attention_backends(model_runner.attn_backend):
        if not isinstance(linear, GDNAttnBackend):
            continue
        if default is not None:
            use_default_eager_gdn_prefill(linear, model_runner, default)
        if not isinstance(linear.kernel_dispatcher.extend_kernel, TritonGDNKernel):
            kernel = linear.linear_attn_backends.prefill.value
            eager_kernel = f"sglang's default kernels (GDN prefill: {kernel})"
            _warm_eager_gdn_prefill(linear, kernel)
    long_prefill = long_prefill_eager_rule(self)
    logger.info(
        "Full prefill CUDA graph routing: a prefill batch replays the graph with "
        "up to %d request(s) and %d token(s) (buckets %s); others (more requests "
        "or tokens, contexts above the graph's bound, LoRA, multimodal "
        "or speculative inputs the graph cannot take%s) run eager on %s. Raise the "
        'request cap with --cuda-graph-config \'{"prefill": '
        '{"backend": "full", "full_prefill_max_req": N}}\'.',
        self._capture_req_slots,
        self.max_num_tokens,
        list(self.capture_num_tokens),
        ""
        if long_prefill is None
        else (
            f", and batches of up to {long_prefill.max_requests} request(s) and "
            f"at least {long_prefill.min_tokens} tokens, which FlashInfer's "
            "context-parallel GDN prefill runs faster eager"
        ),
        eager_kernel,
    )
    PREFILL_PATHS.reset()
    return result


def _warm_eager_gdn_prefill(linear, default: str) -> None:
    try:
        warm_eager_gdn_prefill(linear)
    except Exception as exc:  # a warm-up must not stop the server
        logger.warning(
            "Could not warm the %s GDN prefill kernel for eager prefill batches "
            "(%s: %s); the first batch the full prefill graph does not take may "
            "compile it.",
            default,
            type(exc).__name__,
            exc,
        )


class LongPrefillEager(NamedTuple):
    """Prefill batches of at most ``max_requests`` requests and at least
    ``min_tokens`` new tokens run eager (run_long_few_request_prefill_eager)."""

    max_requests: int
    min_tokens: int


# From 4096 new tokens up, FlashInfer's context-parallel GDN prefill of one
# request (eager) saves more than the full graph does over breakable (H200,
# Qwen3-Next-80B-A3B dimensions: benchmark/results/gpu/gdn_prefill_kernel_choice*).
LONG_PREFILL_EAGER_MIN_TOKENS = 4096

_LONG_PREFILL_RULE = "_graphfix_long_prefill_eager"


def long_prefill_eager_rule(runner) -> LongPrefillEager | None:
    """The batches a full prefill graph leaves to eager for FlashInfer's
    context-parallel GDN prefill, or None: the graph captured FlashInfer's GDN
    prefill (sglang's default on this GPU, not Triton), which picks its
    context-parallel kernel from the number of sequences -- eagerly the real
    requests, in the graph the bucket's request slots -- and on this GPU it picks
    it for a few requests but not for the slots. Computed once per runner."""
    if _LONG_PREFILL_RULE not in runner.__dict__:
        runner.__dict__[_LONG_PREFILL_RULE] = _long_prefill_eager_rule(runner)
    return runner.__dict__[_LONG_PREFILL_RULE]


def _long_prefill_eager_rule(runner) -> LongPrefillEager | None:
    model_runner = runner.model_runner
    if getattr(model_runner, EAGER_GDN_PREFILL_DEFAULT, None) is not None:
        return None  # the graph captured Triton's GDN extend
    for linear in _linear_attention_backends(model_runner.attn_backend):
        if not isinstance(linear, GDNAttnBackend) or not isinstance(
            linear.kernel_dispatcher.extend_kernel, FlashInferGDNKernel
        ):
            return None
        heads = max(gdn_rank_heads(linear))
        device = linear.req_to_token_pool.mamba_pool.mamba_cache.temporal.device
        slots = runner._capture_req_slots
        if flashinfer_picks_context_parallel(slots, heads, device) is not False:
            return None  # the graph's kernel is eager's, or the rule is unknown
        few = 0
        while few + 1 < slots and flashinfer_picks_context_parallel(
            few + 1, heads, device
        ):
            few += 1
        if few:
            return LongPrefillEager(few, LONG_PREFILL_EAGER_MIN_TOKENS)
    return None


def _runs_long_prefill_eager(runner, forward_batch) -> bool:
    rule = long_prefill_eager_rule(runner)
    return (
        rule is not None
        and forward_batch.global_num_tokens_cpu is None  # not under DP attention
        and forward_batch.batch_size <= rule.max_requests
        and len(forward_batch.input_ids) >= rule.min_tokens
    )


# What:    Wraps PrefillCudaGraphRunner.can_run_graph: under a full prefill graph
#          that captured FlashInfer's GDN prefill, a batch of as few requests as
#          FlashInfer runs on its context-parallel kernel, with at least
#          LONG_PREFILL_EAGER_MIN_TOKENS new tokens, runs eager.
# Why:     FlashInfer's GDN prefill picks its context-parallel kernel by the
#          number of sequences: eagerly the real requests (one or two on an
#          H200 at 32 value heads), in the graph the bucket's request slots (16
#          at sglang's default chunking), which get the plain kernel. On a long
#          prompt the plain kernel is the slower: at Qwen3-Next-80B-A3B's
#          dimensions an 8k-16k prompt's first token took 318 ms under the full
#          graph against breakable's 291 ms (issue 13).
# How:     long_prefill_eager_rule (once per runner: the GDN kernel the graph
#          captured, flashinfer's should_use_cp_host for the slots and for few
#          requests); such a batch gets False before sglang's own conditions,
#          and the eager forward runs FlashInfer's own choice. Not under DP
#          attention, whose ranks vote on the graph together.
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner.can_run_graph
#          (to propose: FlashInfer's use_cp per captured batch shape)
# Removal: once a full graph captures FlashInfer's GDN prefill per request count
#          (or forces its context-parallel kernel on long buckets).
def run_long_few_request_prefill_eager(original, self, forward_batch):
    if (
        self._is_full_backend
        and forward_batch.forward_mode.is_extend()
        and _runs_long_prefill_eager(self, forward_batch)
    ):
        return False
    return original(self, forward_batch)


class PrefillPathCounter:
    """Per process: how many prefill batches replayed the full prefill graph and
    how many ran eager, by reason. Summarised at INFO on the first eager batch
    of each reason and every SUMMARY_EVERY batches; each batch at DEBUG."""

    SUMMARY_EVERY = 1000

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.graph = 0
        self.eager = {}

    @property
    def total(self) -> int:
        return self.graph + sum(self.eager.values())

    def record(self, reason: str | None) -> None:
        if reason is None:
            self.graph += 1
        else:
            first = reason not in self.eager
            self.eager[reason] = self.eager.get(reason, 0) + 1
            if first:
                logger.info(
                    "Full prefill CUDA graph: first eager prefill batch (%s). %s",
                    reason,
                    self.summary(),
                )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "Prefill batch: %s. %s", reason or "full graph", self.summary()
            )
        if self.total % self.SUMMARY_EVERY == 0:
            logger.info(self.summary())

    def summary(self) -> str:
        eager = sum(self.eager.values())
        reasons = ", ".join(f"{r}: {n}" for r, n in sorted(self.eager.items()))
        return f"Prefill paths: {self.graph} full graph, {eager} eager" + (
            f" ({reasons})" if reasons else ""
        )


PREFILL_PATHS = PrefillPathCounter()


# What:    Wraps PrefillCudaGraphRunner.can_run_graph: count which path each
#          prefill batch takes under a full prefill graph (PREFILL_PATHS).
# Why:     Batches the graph cannot take run eager without a trace; at
#          chunked_prefill_size 512 every multi-request batch did (issue 13),
#          and nothing in the logs said so.
# How:     After the original verdict, record "full graph" or the eager reason
#          (request cap, token cap, padding past sglang's 2x limit -- a short
#          prompt below half the smallest bucket --, else another of sglang's
#          replay conditions).
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner.can_run_graph
# Removal: once upstream reports prefill graph coverage (its metrics).
def count_prefill_paths(original, self, forward_batch):
    verdict = original(self, forward_batch)
    if self._is_full_backend and forward_batch.forward_mode.is_extend():
        PREFILL_PATHS.record(None if verdict else _eager_reason(self, forward_batch))
    return verdict


def _eager_reason(runner, forward_batch) -> str:
    num_tokens = len(forward_batch.input_ids)
    if forward_batch.batch_size > runner._capture_req_slots:
        return f"more than {runner._capture_req_slots} requests"
    if num_tokens > runner.max_num_tokens:
        return f"more than {runner.max_num_tokens} tokens"
    if _runs_long_prefill_eager(runner, forward_batch):
        rule = long_prefill_eager_rule(runner)
        return (
            f"up to {rule.max_requests} request(s) and at least {rule.min_tokens} "
            "tokens: FlashInfer's context-parallel GDN prefill"
        )
    bucket = runner._pad_to_bucket(num_tokens, runner.capture_num_tokens)
    if bucket > num_tokens * _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR:
        return (
            f"under 1/{_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR} of the smallest "
            f"bucket that fits ({bucket} tokens)"
        )
    return "other replay condition"
