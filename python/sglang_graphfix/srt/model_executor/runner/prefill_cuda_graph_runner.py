# SPDX-License-Identifier: Apache-2.0
"""PrefillCudaGraphRunner and hybrid linear attention under a full prefill graph.

Fixes sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py: only the
decode runner initialises the linear-attention backends' CUDA-graph state, and
sglang captures the prefill graph first (cuda_graph_setup.capture_cuda_graphs),
so a full prefill capture finds no per-batch-size state; nor does anything stop a
linear backend that cannot capture an extend from reaching the capture.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
    Mamba2AttnBackend,
)
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.layers.attention.linear.inkling_sconv_backend import (
    InklingShortConvAttnBackend,
)
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
    _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR,
)
from sglang.srt.runtime_context import get_exec, get_parallel, get_spec
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.full_prefill_graph_capability import (
    require_capturable_full_prefill_graph,
)
from sglang_graphfix.srt.layers.attention.hybrid_linear_attn_backend import (
    CAPTURE_REQUEST_SLOTS,
    REQUEST_BUCKETS,
    capture_request_buckets,
    replay_request_slots,
    single_request_graph_setting,
)
from sglang_graphfix.srt.layers.attention.linear.gdn_backend import (
    EAGER_GDN_PREFILL_DEFAULT,
)
from sglang_graphfix.srt.layers.attention.linear.gdn_prefill_graph import (
    use_default_eager_gdn_prefill,
    warm_eager_gdn_prefill,
)
from sglang_graphfix.srt.layers.attention.linear.kda_prefill_graph import (
    num_real_requests,
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
#          with snapshots, not the eager one). Where Mamba2 prefills above
#          MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST run eager
#          (route_long_mamba2_prefills_eager) and a bucket can exceed it, two
#          eager dummy prefills just over it (_warm_eager_mamba2_prefill). Then
#          one INFO line: which batches replay the graph and which run eager.
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
    logger.info(
        "Full prefill CUDA graph routing: a prefill batch replays the graph with "
        "up to %d request(s) and %d token(s) (buckets %s); others (more requests "
        "or tokens, contexts above the graph's bound, LoRA, multimodal "
        "or speculative inputs the graph cannot take) run eager on %s. Raise the "
        'request cap with --cuda-graph-config \'{"prefill": '
        '{"backend": "full", "full_prefill_max_req": N}}\'.',
        self._capture_req_slots,
        self.max_num_tokens,
        list(self.capture_num_tokens),
        eager_kernel,
    )
    # Nothing to route (and warm) where no batch the buckets hold can exceed it.
    if _routes_long_prefills(self) and capability.mamba2_graph_routes_long_prefills(
        self.max_num_tokens
    ):
        _warm_eager_mamba2_prefill(self)
        logger.info(
            "Full prefill CUDA graph routing: a prefill batch of more than %d new "
            "tokens per request on average also runs eager "
            "(MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST: the full graph was slower than "
            "eager for long prompts).",
            capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST,
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


def _warm_eager_mamba2_prefill(runner) -> None:
    """Eager prefills of one request just over MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST,
    through sglang's own dummy forward (BaseRunner._dummy_run, as its FlashInfer
    EXTEND autotune runs one), so that the first batch routed eager does not
    autotune and build most of sglang's eager Mamba2 kernels: a fresh prompt's
    with no prefix-cache snapshot (sglang's dummy buffers carry no track mask; an
    extend on a cached state, or one that snapshots, may still compile), at a
    token count of each of Triton's integer classes (a multiple of 16 and not).
    Its buffers are freed and the allocator's cache emptied after it, as
    sglang's own autotune does. With one tensor-parallel rank only: a rank
    whose warm-up failed would leave the others waiting in the forward's
    collectives. A failure is logged, not raised."""
    if get_parallel().tp_size > 1:
        logger.info(
            "Not warming sglang's eager Mamba2 prefill under tensor parallelism: the "
            "first prefill batch the full graph sends eager may compile its kernels."
        )
        return
    first = capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST + 1
    second = first + 1 if first % 16 == 0 else -(-first // 16) * 16
    buffers = None
    try:
        with runner.model_context(), torch.no_grad():
            for tokens in (first, second):
                buffers = runner._alloc_dummy_decode_buffers(
                    1, num_tokens_per_req=tokens, allocate_logits_buffer=False
                )
                runner._dummy_run(
                    1,
                    buffers=buffers,
                    forward_mode_override=ForwardMode.EXTEND,
                    extend_num_tokens_per_req=tokens,
                )
                buffers = None
    except Exception as exc:  # a warm-up must not stop the server
        logger.warning(
            "Could not warm sglang's eager Mamba2 prefill for the batches the full "
            "prefill graph sends eager (%s: %s); the first such batch may compile "
            "its kernels.",
            type(exc).__name__,
            exc,
        )
    finally:
        buffers = None  # a failed run's too, before the cache is emptied
        torch.cuda.empty_cache()


def request_bucket_label(slots: int) -> str:
    """ShapeKey.attention_variant of a request bucket's graph (the prefill runner
    sets no attention variant of its own)."""
    return f"request_slots:{slots}"


# What:    Wraps PrefillCudaGraphRunner.capture_one_shape: after a token bucket's
#          full prefill graph over all request slots, capture one graph per
#          request bucket of the bucket (capture_request_buckets: Mamba2, up to
#          REQUEST_BUCKET_MAX_TOKENS tokens; one slot above, up to
#          MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS; GDN on FlashInfer's prefill,
#          one slot above, GDN_SINGLE_REQUEST_GRAPHS) and record them on the
#          HybridLinearAttnBackend.
# Why:     Every replay runs the linear extend over the graph's request slots,
#          and upstream's MambaMixer2 does per-sequence state work for each of
#          them: at Falcon-H1-7B's dimensions the 16-slot graph's GPU time for one
#          16-token prompt was 15.9 ms against breakable's 8.5, most of the
#          difference in per-sequence kernels run for all 17 sequences (issue
#          13's "a batch of few requests does not pay for many request slots").
#          FlashInfer's GDN prefill over every slot runs its plain kernel where
#          one eager prompt runs its faster context-parallel one.
# How:     Upstream's capture of the shape runs again per request bucket with
#          CAPTURE_REQUEST_SLOTS set on the attention backend: the
#          full-attention side still plans every slot, the linear side allocates
#          tables over the first ones (linear_request_rows), and
#          key_graph_by_request_bucket files the graph under the bucket's
#          attention variant; logged once per tier (up to and above
#          REQUEST_BUCKET_MAX_TOKENS), at its largest bucket. Only request
#          buckets that hold the capture batch's requests (one per context
#          length of tokens); not with chunked-prefix variants, a fixed prefill
#          context size, DP attention or draft workers.
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner.capture_one_shape
# Removal: once upstream captures prefill graphs per request count.
def capture_request_bucket_graphs(original, self, size, *args, **kwargs):
    original(self, size, *args, **kwargs)
    buckets = _request_buckets_to_capture(self, size, *args, **kwargs)
    if not buckets:
        return
    hybrid = self.model_runner.attn_backend
    # Logged at the largest bucket of each tier (buckets come largest first).
    bound = capability.REQUEST_BUCKET_MAX_TOKENS
    if (size > bound) not in {
        b > bound for b in getattr(hybrid, REQUEST_BUCKETS, None) or {}
    }:
        if size > bound:
            logger.info(
                "Full prefill CUDA graph request buckets: token buckets above %d "
                "up to %d tokens also capture a graph over 1 request slot "
                "(%s); a batch of one request replays it.",
                bound,
                size,
                single_request_graph_setting(hybrid.linear_attn_backend),
            )
        else:
            logger.info(
                "Full prefill CUDA graph request buckets: token buckets up to %d "
                "tokens also capture graphs over %s request slots; a batch of "
                "fewer requests than the graph's %d replays the smallest that "
                "holds it.",
                size,
                "/".join(map(str, buckets)),
                self._capture_req_slots,
            )
    for slots in buckets:
        setattr(hybrid, CAPTURE_REQUEST_SLOTS, slots)
        try:
            original(self, size, *args, **kwargs)
        finally:
            setattr(hybrid, CAPTURE_REQUEST_SLOTS, None)
    hybrid.__dict__.setdefault(REQUEST_BUCKETS, {})[size] = buckets


def _request_buckets_to_capture(runner, size, prefix_num_chunks=0) -> tuple:
    hybrid = runner.model_runner.attn_backend
    if not (
        runner._is_full_backend
        and isinstance(hybrid, HybridLinearAttnBackend)
        and not prefix_num_chunks
        and not runner._capture_chunked_prefix
        and runner.max_context_size is None
        and not runner.model_runner.is_draft_worker
        and not get_parallel().attn_dp_enabled
    ):
        return ()
    # capture_prepare splits the bucket into requests of at most the context
    # length: a request bucket must hold them.
    return capture_request_buckets(
        hybrid.linear_attn_backend,
        size,
        runner._capture_req_slots,
        runner.model_runner.model_config.context_len,
    )


# What:    Wraps PrefillCudaGraphRunner._shape_key: a batch of fewer requests
#          than the slots replays its bucket's smallest request-bucket graph
#          that holds it.
# Why:     The graphs capture_request_bucket_graphs adds are filed under their
#          own key; the runner's key names only the token bucket.
# How:     replay_request_slots on the batch's requests as linear_request_rows
#          counts them for the tables (num_real_requests of the batch's
#          extend_seq_lens_cpu, which the runner's padded view keeps), so both
#          sides pick the same graph; its attention variant on the runner's key.
#          Otherwise the key is upstream's.
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner._shape_key
# Removal: with capture_request_bucket_graphs.
def replay_request_bucket_graph(original, self, num_tokens, forward_batch):
    key = original(self, num_tokens, forward_batch)
    hybrid = self.model_runner.attn_backend
    if not (self._is_full_backend and getattr(hybrid, REQUEST_BUCKETS, None)):
        return key
    slots = replay_request_slots(
        hybrid, num_tokens, num_real_requests(forward_batch.extend_seq_lens_cpu)
    )
    if slots is None:
        return key
    return dataclasses.replace(key, attention_variant=request_bucket_label(slots))


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
#          replay conditions). A speculative verify batch that reaches this runner
#          (above the decode graph's sizes) is not a prefill: not counted.
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner.can_run_graph
# Removal: once upstream reports prefill graph coverage (its metrics).
def count_prefill_paths(original, self, forward_batch):
    verdict = original(self, forward_batch)
    mode = forward_batch.forward_mode
    if self._is_full_backend and mode.is_extend() and not mode.is_target_verify():
        PREFILL_PATHS.record(None if verdict else _eager_reason(self, forward_batch))
    return verdict


def _eager_reason(runner, forward_batch) -> str:
    num_tokens = len(forward_batch.input_ids)
    if forward_batch.batch_size > runner._capture_req_slots:
        return f"more than {runner._capture_req_slots} requests"
    if num_tokens > runner.max_num_tokens:
        return f"more than {runner.max_num_tokens} tokens"
    if _routes_long_prefills(runner) and not capability.mamba2_graph_takes(
        num_tokens, forward_batch.batch_size
    ):
        limit = capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST
        return f"more than {limit} new tokens per request on average"
    bucket = runner._pad_to_bucket(num_tokens, runner.capture_num_tokens)
    if (
        bucket > num_tokens * _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR
        and _smallest_bucket_for(runner, num_tokens) is None
    ):
        return (
            f"under 1/{_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR} of the smallest "
            f"bucket that fits ({bucket} tokens)"
        )
    return "other replay condition"


# What:    Wraps PrefillCudaGraphRunner.can_replay_locally: under a full prefill
#          graph on a hybrid linear-attention model, a prefill batch of fewer
#          tokens than the smallest bucket (of at most
#          capability.SMALL_BATCH_REPLAY_MAX_BUCKET tokens) replays that bucket.
# Why:     sglang runs a batch eager when its bucket is more than twice its
#          tokens, so with its default buckets (4, 8, ...) every one-token
#          prefill ran eager: sglang's own /health_generate, and every prompt
#          the radix cache holds but for its last token. Under a full graph the
#          eager Mamba2 kernels are not built at startup (its capture runs the
#          tables path): on a fresh H200 the first /health_generate of a
#          Falcon-H1-7B-sized server with the full graph waited 2 min 15 s for
#          them (2026-12-03). Eager is slower there too: served with prefill
#          graphs disabled, the median time to first token of one 16-token prompt
#          was 141.7 ms, against 47.4 with the full graph (2026-12-02).
# How:     Such a batch is judged as the smallest bucket, which load_batch pads
#          it to; every other condition is upstream's (also for the DP vote,
#          which calls this too). Breakable graphs, models without linear
#          attention and larger smallest buckets keep upstream's rule.
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner.can_replay_locally
# Removal: once upstream's padding limit lets a batch below the smallest
#          bucket replay it.
def replay_small_batches_in_smallest_bucket(original, self, **kwargs):
    smallest = _smallest_bucket_for(self, kwargs.get("num_tokens"))
    if smallest is not None:
        kwargs["num_tokens"] = smallest
    return original(self, **kwargs)


def _smallest_bucket_for(runner, num_tokens) -> int | None:
    """The smallest bucket, where a batch of ``num_tokens`` replays it under
    replay_small_batches_in_smallest_bucket; else None."""
    if not (runner._is_full_backend and num_tokens):  # every breakable batch
        return None
    smallest = min(runner.capture_num_tokens, default=None)
    if (
        smallest is not None
        and num_tokens < smallest <= capability.SMALL_BATCH_REPLAY_MAX_BUCKET
        and _linear_attention_backends(runner.model_runner.attn_backend)
    ):
        return smallest
    return None


# What:    Wraps PrefillCudaGraphRunner.can_replay_locally: under a Mamba2 full
#          prefill graph, a batch of more new tokens per request, on average,
#          than capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST (1536 as
#          shipped) runs eager.
# Why:     Served at Nemotron-H-8B's dimensions on an H200, the full graph's
#          median time to first token for one prompt of 2048 or 3072 tokens was
#          above that of a second full server that ran them eager (81.3 vs 77.9
#          and 105.8 vs 100.6 ms; below it up to 1536: the capability's
#          table), and the full graph runs Mamba2 models only where sglang's own
#          prefill is eager.
# How:     Before upstream (and before replay_small_batches_in_smallest_bucket
#          rewrites a tiny batch's tokens): on a full graph whose
#          linear-attention backend is Mamba2's, False for a batch over the
#          limit (capability.mamba2_graph_takes), which the runner then runs
#          eager; every other batch is judged by upstream. Not under DP
#          attention (attn_dp_enabled, whatever the MLP does): the
#          schedule-time vote sees a rank's own tokens and requests, the forward
#          its tokens padded to a capture bucket (across the ranks where sglang
#          all-gathers the MLP input, to the rank's own bucket where it does not,
#          e.g. --moe-dense-tp-size 1 --enable-dp-lm-head with an a2a backend)
#          over the rank's requests, so ranks could split. route_full_prefill_fallback warms the eager
#          Mamba2 prefill at start-up.
# Upstream: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py::PrefillCudaGraphRunner.can_replay_locally
#          (to propose: a replay bound in tokens per request)
# Removal: once a Mamba2 full graph's long prefills are no slower than eager.
def route_long_mamba2_prefills_eager(original, self, **kwargs):
    num_tokens, requests = kwargs.get("num_tokens"), kwargs.get("batch_size")
    if (
        num_tokens
        and requests
        and _routes_long_prefills(self)
        and not capability.mamba2_graph_takes(num_tokens, requests)
    ):
        return False
    return original(self, **kwargs)


def _routes_long_prefills(runner) -> bool:
    """A full prefill graph over Mamba2 linear attention, with a limit set, and
    no DP attention (route_long_mamba2_prefills_eager)."""
    return (
        capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST is not None
        and any(
            isinstance(linear, Mamba2AttnBackend)
            for linear in _linear_attention_backends(runner.model_runner.attn_backend)
        )
        and runner._is_full_backend
        and not get_parallel().attn_dp_enabled
    )
