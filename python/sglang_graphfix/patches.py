# SPDX-License-Identifier: Apache-2.0
"""Every change sglang-graphfix makes to sglang 0.5.23: ``PATCHES`` is the index.

Each hook's header (What / Why / How / Upstream / Removal) sits on its function, in
a module that mirrors the upstream file it fixes.
"""

from __future__ import annotations

import logging
import pkgutil
from collections.abc import Callable
from typing import NamedTuple

from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang_graphfix.kernels.ops.mamba import causal_conv1d_triton
from sglang_graphfix.srt.arg_groups import cuda_graph_hook
from sglang_graphfix.srt.layers.attention import hybrid_linear_attn_backend
from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer
from sglang_graphfix.srt.layers.attention.linear import gdn_backend, kda_backend
from sglang_graphfix.srt.lora import lora_manager, mem_pool
from sglang_graphfix.srt.model_executor.model_runner_components import (
    cuda_graph_setup,
    weight_updater,
)
from sglang_graphfix.srt.model_executor.runner import prefill_cuda_graph_runner
from sglang_graphfix.srt.model_executor.runner_backend import full_cuda_graph_backend

logger = logging.getLogger(__name__)


class Patch(NamedTuple):
    target: str
    hook: Callable
    hook_type: HookType


_SRT = "sglang.srt."
_ARGS = _SRT + "arg_groups.cuda_graph_hook."
_ATTN = _SRT + "layers.attention."

PATCHES = (
    # Hybrid linear attention under a full prefill CUDA graph.
    Patch(_ARGS + "finalize_cuda_graph_prefill_max_context", cuda_graph_hook.route_mamba2_full_prefill_to_breakable, HookType.AROUND),
    Patch(_ARGS + "finalize_cuda_graph_prefill_max_context", cuda_graph_hook.judge_prefill_graph_on_final_settings, HookType.AROUND),
    Patch(_ARGS + "finalize_cuda_graph_prefill_max_context", cuda_graph_hook.hybrid_full_prefill_request_slots, HookType.AROUND),
    Patch(_ARGS + "finalize_cuda_graph_prefill_max_context", cuda_graph_hook.cap_prefill_batches_at_request_slots, HookType.AROUND),
    Patch(_ATTN + "hybrid_linear_attn_backend.HybridLinearAttnBackend.init_forward_metadata_out_graph", hybrid_linear_attn_backend.linear_extend_tables_for_full_prefill_graph, HookType.AROUND),
    Patch(_ATTN + "hybrid_linear_attn_backend.MambaAttnBackendBase._track_mamba_state_extend", hybrid_linear_attn_backend.snapshot_mamba2_states_on_graph_tables, HookType.AROUND),
    Patch(_ATTN + "linear.gdn_backend.GDNAttnBackend.forward_extend", gdn_backend.gdn_extend_on_full_graph_tables, HookType.AROUND),
    Patch(_ATTN + "linear.gdn_backend.flashinfer_gdn_prefill_default", gdn_backend.keep_triton_gdn_prefill_for_full_graph, HookType.AROUND),
    Patch(_ATTN + "linear.kda_backend.KDAAttnBackend.forward_extend", kda_backend.kda_graph_extend_applies_beta_sigmoid, HookType.AROUND),
    Patch(_ATTN + "hybrid_linear_attn_backend.HybridLinearAttnBackend.__init__", hybrid_linear_attn_backend.expose_full_attn_chunked_prefix_capture, HookType.AROUND),
    Patch(_ATTN + "hybrid_linear_attn_backend.MambaAttnBackendBase.init_cuda_graph_state", hybrid_linear_attn_backend.init_linear_graph_state_once, HookType.AROUND),
    Patch(_ATTN + "hybrid_linear_attn_backend.MambaAttnBackendBase._replay_metadata", hybrid_linear_attn_backend.replay_metadata_requires_graph_state, HookType.AROUND),
    Patch(_SRT + "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.capture", prefill_cuda_graph_runner.prepare_linear_attention_for_full_prefill_capture, HookType.AROUND),
    Patch(_SRT + "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.capture", prefill_cuda_graph_runner.route_full_prefill_fallback, HookType.AROUND),
    Patch(_SRT + "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph", prefill_cuda_graph_runner.count_prefill_paths, HookType.AROUND),
    Patch(_SRT + "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_replay_locally", prefill_cuda_graph_runner.replay_small_batches_in_smallest_bucket, HookType.AROUND),
    Patch(_SRT + "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_replay_locally", prefill_cuda_graph_runner.route_long_mamba2_prefills_eager, HookType.AROUND),
    Patch(_SRT + "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.capture_one_shape", prefill_cuda_graph_runner.capture_request_bucket_graphs, HookType.AROUND),
    Patch(_SRT + "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner._shape_key", prefill_cuda_graph_runner.replay_request_bucket_graph, HookType.AROUND),
    Patch(_SRT + "model_executor.runner_backend.full_cuda_graph_backend.FullCudaGraphBackend.capture_one", full_cuda_graph_backend.key_graph_by_request_bucket, HookType.AROUND),
    Patch(_SRT + "model_executor.model_runner_components.cuda_graph_setup.has_standard_gqa_for_all_local_layers", cuda_graph_setup.keep_full_prefill_graph_across_mamba2_layer_gaps, HookType.AROUND),
    Patch("sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_fn", causal_conv1d_triton.launch_conv_on_bucket_block_table, HookType.AROUND),
    # DSA indexer weights_proj LoRA under the breakable prefill graph.
    Patch(_ATTN + "dsa.dsa_indexer.Indexer._get_logits_head_gate", dsa_indexer.lora_aware_head_gate, HookType.AROUND),
    Patch(_ATTN + "dsa.dsa_indexer.Indexer.forward_cuda", dsa_indexer.lora_aware_split_op_dispatch, HookType.AROUND),
    Patch(_SRT + "lora.mem_pool.LoRAMemoryPool.load_lora_weight_to_buffer", mem_pool.drop_merged_gates_on_pool_load, HookType.AROUND),
    Patch(_SRT + "lora.mem_pool.LoRAMemoryPool.init_buffers", mem_pool.reserve_merged_gates_with_lora_pool, HookType.AROUND),
    Patch(_SRT + "lora.mem_pool.LoRAMemoryPool.remove_lora", mem_pool.drop_merged_gates_on_adapter_unload, HookType.AROUND),
    Patch(_SRT + "lora.lora_manager.LoRAManager.init_memory_pool", lora_manager.compile_merged_gate_scaling_at_pool_init, HookType.AROUND),
    Patch(_SRT + "model_executor.model_runner_components.weight_updater._unsupported_derived_weight_cache_error", weight_updater.drop_merged_gates_on_weight_update, HookType.AROUND),
    Patch(_SRT + "model_executor.model_runner_components.weight_updater.WeightUpdater.end_weight_update", weight_updater.drop_merged_gates_after_weight_update_session, HookType.AROUND),
)  # fmt: skip


GUARD_TARGET = "sglang.srt.server_args.ServerArgs.resolve_once"


def refuse_incomplete_patch_set(*args, **kwargs):
    """BEFORE hook on ServerArgs.resolve_once, installed ahead of every patch.

    sglang's plugin loader catches and logs whatever register() raises, then
    starts the server anyway. Server-argument resolution is the step every
    server process runs after loading plugins (the launcher before it spawns
    anything, each scheduler and detokenizer through publish()) and none wraps
    in an except: raising here stops an Engine, ``sglang serve`` and
    ``python -m sglang.launch_server`` before any weight loads.
    """
    import sglang_graphfix

    if sglang_graphfix._refusal is not None:
        raise RuntimeError(sglang_graphfix._refusal)


def install_guard() -> None:
    """Register and apply the start-up guard on its own, then check it wraps
    resolve_once; raises if not."""
    original = _lookup(GUARD_TARGET)
    HookRegistry.register(GUARD_TARGET, refuse_incomplete_patch_set, HookType.BEFORE)
    HookRegistry.apply_hooks()
    current = _lookup(GUARD_TARGET)
    if not (
        _wraps(current, original)
        and hook_in_chain(current, refuse_incomplete_patch_set)
    ):
        raise RuntimeError(f"HookRegistry did not apply the guard on {GUARD_TARGET}")


def _lookup(target: str):
    owner_path, name = target.rsplit(".", 1)
    return getattr(pkgutil.resolve_name(owner_path), name)


def _wraps(current, original) -> bool:
    """Whether ``current`` is (a wrapper chain around) ``original``."""
    seen = set()
    while current is not None and id(current) not in seen:
        if current is original:
            return True
        seen.add(id(current))
        current = getattr(current, "__wrapped__", None)
    return False


def hook_in_chain(current, hook) -> bool:
    """Whether ``hook`` is one of the hooks HookRegistry wrapped around the
    function now at a target (its wrappers keep the hook in their closure)."""
    seen = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for cell in getattr(current, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # an empty cell
                continue
        current = getattr(current, "__wrapped__", None)
    return False


def patch_applied(patch: Patch) -> bool:
    """Whether ``patch``'s hook wraps its target in this process."""
    try:
        current = _lookup(patch.target)
    except (AttributeError, ImportError, ValueError):
        return False
    return hook_in_chain(current, patch.hook)


def apply_patches(patches=None) -> int:
    """Register every patch (default: ``PATCHES``) with sglang's HookRegistry,
    apply, and verify; returns how many were applied.

    Every target is resolved before anything is registered, so a missing one
    patches nothing. HookRegistry.apply_hooks only logs a failed target; each
    one is checked afterwards and any that does not wrap its original with our
    hook raises, naming it.
    """
    patches = PATCHES if patches is None else patches
    originals = {}
    missing = []
    for patch in patches:
        try:
            originals[patch.target] = _lookup(patch.target)
        except (AttributeError, ImportError, ValueError) as exc:
            missing.append(f"{patch.target} ({exc})")
    if missing:
        raise RuntimeError(
            "sglang-graphfix: patch targets not found, nothing patched: "
            + "; ".join(missing)
        )

    for patch in patches:
        HookRegistry.register(patch.target, patch.hook, patch.hook_type)
    HookRegistry.apply_hooks()

    unapplied = []
    for patch in patches:
        current, original = _lookup(patch.target), originals[patch.target]
        if (
            current is original
            or not _wraps(current, original)
            or not hook_in_chain(current, patch.hook)
        ):
            unapplied.append(f"{patch.hook.__name__} on {patch.target}")
    if unapplied:
        raise RuntimeError(
            f"sglang-graphfix: HookRegistry did not apply {len(unapplied)} of "
            f"{len(patches)} patches: " + ", ".join(unapplied) + "."
        )
    logger.info("sglang-graphfix: applied %d patches to sglang", len(patches))
    return len(patches)
