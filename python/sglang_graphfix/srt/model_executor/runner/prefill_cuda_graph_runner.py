# SPDX-License-Identifier: Apache-2.0
"""PrefillCudaGraphRunner and hybrid linear attention under a full prefill graph.

Fixes sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py: only the
decode runner initialises the linear-attention backends' CUDA-graph state, and
sglang captures the prefill graph first (cuda_graph_setup.capture_cuda_graphs),
so a full prefill capture finds no per-batch-size state; nor does anything stop a
linear backend that cannot capture an extend from reaching the capture.
"""

from __future__ import annotations

from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
    HybridLinearAttnBackend,
)
from sglang.srt.layers.attention.linear.inkling_sconv_backend import (
    InklingShortConvAttnBackend,
)
from sglang.srt.runtime_context import get_exec, get_spec

from sglang_graphfix.srt.full_prefill_graph_capability import (
    require_capturable_full_prefill_graph,
)


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
