# SPDX-License-Identifier: Apache-2.0
"""Full prefill CUDA graph vs. hybrid linear attention, decided at server-args time.

Fixes sglang/srt/arg_groups/cuda_graph_hook.py: the full prefill graph rule list is
empty and the final validation ignores the model, so a hybrid model whose linear
attention cannot be captured reaches graph capture and dies there with
``IndexError: list index out of range``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from sglang.srt.arg_groups.overrides import (
    declare_resolution,
    model_config_of,
    resolving_view,
)
from sglang.srt.configs.hybrid_arch import (
    hybrid_gdn_config,
    hybrid_kda_config,
    hybrid_lightning_config,
    mamba2_config,
    mambaish_config,
)
from sglang.srt.configs.inkling import InklingMMConfig, InklingModelConfig
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

logger = logging.getLogger(__name__)

_USE_INSTEAD = (
    "Use --cuda-graph-backend-prefill breakable (the default) or "
    "--cuda-graph-backend-prefill disabled instead."
)


def linear_attention_family(model_config: Any) -> Optional[str]:
    """The linear-attention family sglang builds for this model (same order as
    attention_registry.attn_backend_wrapper), or None for models without one."""
    if isinstance(model_config.hf_config, (InklingModelConfig, InklingMMConfig)):
        return "Inkling short-conv"
    if hybrid_gdn_config(model_config) is not None:
        return "GDN"
    if mamba2_config(model_config) is not None:
        return "Mamba2/short-conv"
    if hybrid_kda_config(model_config) is not None:
        return "KDA"
    if hybrid_lightning_config(model_config) is not None:
        return "Lightning"
    if mambaish_config(model_config) is not None:
        return "registry-defined linear"
    return None


# GDN extends on static per-bucket tables (see ..layers.attention.linear.
# gdn_prefill_graph); Inkling's sidecar captures its own short convs upstream.
_CAPTURABLE_FAMILIES = (None, "GDN", "Inkling short-conv")


def full_prefill_graph_blocker(server_args: Any) -> Optional[str]:
    """Why this model cannot run a full prefill CUDA graph, or None if it can."""
    model_config = model_config_of(server_args)
    family = linear_attention_family(model_config)
    if family in _CAPTURABLE_FAMILIES:
        return None
    arch = model_config.hf_config.architectures[0]
    return (
        f"{arch} uses {family} attention, whose extend kernels size their "
        "launches from host-side sequence lengths and cannot be captured in a "
        "full prefill CUDA graph"
    )


# What:    Wraps disable_full_prefill_cudagraph_if_incompatible with a rule for
#          linear attention that a full prefill graph cannot capture.
# Why:     The upstream rule list is empty, so an automatically selected full
#          prefill graph on such a model crashes at capture (IndexError in
#          HybridLinearAttnBackend._replay_metadata).
# How:     If full_prefill_graph_blocker() names a reason, warn and declare the
#          prefill backend disabled, like the upstream rules do; else defer.
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::disable_full_prefill_cudagraph_if_incompatible
# Removal: once upstream carries this rule (or captures every linear family).
def downgrade_unsupported_full_prefill_graph(original, server_args: Any):
    reason = full_prefill_graph_blocker(server_args)
    if reason is None:
        return original(server_args)
    logger.warning(
        "Disabling the full prefill CUDA graph: %s. Set "
        "--cuda-graph-backend-prefill breakable to keep a prefill graph.",
        reason,
    )
    cfg = resolving_view(server_args)
    declare_resolution(
        server_args,
        "_disable_full_prefill_cudagraph_if_incompatible",
        cuda_graph_config=with_phase(
            cfg.cuda_graph_config, Phase.PREFILL, backend=Backend.DISABLED
        ),
    )


# What:    Wraps validate_cuda_graph_config to reject an explicit full prefill
#          graph on a model whose linear attention cannot be captured.
# Why:     Validation only checks the backend name, so the request passes and
#          fails minutes later during capture with an IndexError.
# How:     After the upstream checks, raise a ValueError that names the model,
#          the reason and the flag to use instead.
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::validate_cuda_graph_config
# Removal: with downgrade_unsupported_full_prefill_graph.
def reject_unsupported_full_prefill_graph(original, server_args: Any):
    original(server_args)
    graph_config = resolving_view(server_args).cuda_graph_config
    if graph_config is None or graph_config.prefill.backend != Backend.FULL:
        return
    reason = full_prefill_graph_blocker(server_args)
    if reason is not None:
        raise ValueError(
            f"--cuda-graph-config prefill.backend='full' is not supported: "
            f"{reason}. {_USE_INSTEAD}"
        )
