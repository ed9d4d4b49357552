# SPDX-License-Identifier: Apache-2.0
"""Full prefill CUDA graphs, decided when the server arguments resolve.

Fixes sglang/srt/arg_groups/cuda_graph_hook.py. In 0.5.23 the full prefill graph's
rule list is empty, the compatibility cascade is skipped whenever the prefill
backend is locked (also by a model default such as Inkling's), and validation
checks only the backend's name. A configuration whose linear attention or
full-attention backend cannot capture a plain extend therefore reaches graph
capture and dies there: ``IndexError`` in ``HybridLinearAttnBackend._replay_metadata``,
or ``ValueError: Invalid forward mode EXTEND for CUDA Graph replay`` (triton).

``full_prefill_graph_support`` is the one capability model; the four hooks below
apply it at the points where sglang decides the prefill graph backend.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from sglang.srt.arg_groups import cuda_graph_hook as upstream
from sglang.srt.arg_groups.overrides import (
    attention_backends_of,
    declare_resolution,
    model_config_of,
    resolved_view,
    resolving_view,
    use_mla_backend,
)
from sglang.srt.configs.hybrid_arch import (
    hybrid_gdn_config,
    hybrid_kda_config,
    hybrid_lightning_config,
    linear_attn_model_spec,
    mamba2_config,
    mambaish_config,
)
from sglang.srt.configs.inkling import InklingMMConfig, InklingModelConfig
from sglang.srt.model_executor.cuda_graph_config import (
    Backend,
    CudaGraphConfig,
    Phase,
    with_phase,
)

logger = logging.getLogger(__name__)

# The declaration source this package's downgrades carry in sglang's record.
DOWNGRADE_SOURCE = "sglang_graphfix:full_prefill_graph_rules"

# KDA (Kimi-Linear, GLM-5.x Next) under a full prefill graph: the extend runs on
# upstream's breakable-graph KDA tables (KDAPrefillGraphMetadata), wired in by
# ..layers.attention.linear.kda_backend. THE switch for KDA: set it to False to
# reject a full prefill graph on KDA models again.
KDA_FULL_PREFILL_GRAPH = True

# Prefill attention backends whose init_forward_metadata_out_graph plans a plain
# EXTEND for a full prefill graph, read from sglang 0.5.23's backends:
#   fa3, fa4    FlashAttentionBackend._init_full_cg_prefill_metadata (MHA and MLA);
#               also the only backend with supports_full_cuda_graph_chunked_prefix,
#               which PrefillCudaGraphRunner asserts for MLA models that keep the
#               chunked prefix cache.
#   flashinfer  FlashInferAttnBackend plans it on full_cg_prefill_wrappers; MHA only,
#               since "flashinfer" on an MLA model is FlashInferMLAAttnBackend.
# Every other backend fails in capture or replay: triton and trtllm_mha
# (_apply_cuda_graph_metadata: "Invalid forward mode ... for CUDA Graph replay"),
# FlashInferMLAAttnBackend and its subclasses flashmla / trtllm_mla / cutedsl_mla
# ("Invalid mode"), dsa (no EXTEND branch), dsv4 (_GraphBucket raises
# NotImplementedError), aiter and wave ("Invalid forward mode"), hpc_ops (asserts
# decode); torch_native and flex_attention turn every graph off themselves.
FULL_PREFILL_ATTENTION_BACKENDS = ("fa3", "fa4", "flashinfer")
FULL_PREFILL_MLA_ATTENTION_BACKENDS = ("fa3", "fa4")

# sglang's breakable-graph rules (disable_breakable_cudagraph_if_incompatible) that
# an explicit --cuda-graph-backend-prefill breakable may override with a warning:
# upstream calls DeepSeek-V4 "BCG-compatible" and turns it off for capture-pool
# memory pressure only. Every other rule describes a failure or an unvalidated
# path (KDA outside GLM-5.3 Flash, a2a backends), so an explicit request errors.
BREAKABLE_RULES_KNOWN_TO_WORK = ("DeepSeek-V4 (heavy capture-pool memory pressure)",)

# Why sglang's breakable rules turn the graph off, from the comments on each rule.
_BREAKABLE_RULE_WHY = {
    "KDA hybrid linear attention": (
        "sglang validates the breakable prefill graph for KDA on GLM-5.3 Flash only "
        "and keeps it off for other KDA models"
    ),
    "decode context parallel (dcp_size > 1)": (
        "its capture builds a dummy extend without decode-context-parallel metadata"
    ),
    "two-batch overlap": "its capture does not support two-batch overlap",
    "unvalidated a2a backend": "it is not validated with this MoE all-to-all backend",
    "multimodal model": (
        "multimodal prefill replay faults under it (this architecture is not on "
        "sglang's breakable allowlist)"
    ),
}


@dataclass(frozen=True)
class FullPrefillGraphSupport:
    """Whether a full prefill CUDA graph can capture this configuration, and why not."""

    architecture: str
    linear_attention: Optional[str]  # the linear-attention family, None without one
    linear_prefill_kernel: Optional[str]  # kernel of a GDN/KDA extend, else None
    attention_backend: Optional[str]  # prefill full-attention backend; None: unresolved
    capturing_attention_backends: Tuple[str, ...] = ()  # for this model's arch
    reasons: Tuple[str, ...] = ()  # empty: capable
    fixes: Tuple[str, ...] = ()  # flags that keep the full graph, where one exists

    @property
    def capable(self) -> bool:
        return not self.reasons

    def describe(self) -> str:
        linear = self.linear_attention or "none"
        if self.linear_prefill_kernel:
            linear += f" ({self.linear_prefill_kernel} prefill kernel)"
        attention = self.attention_backend or "not chosen yet (sglang's default)"
        return (
            f"architecture {self.architecture}, linear attention {linear}, "
            f"full-attention backend {attention}"
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
        spec = linear_attn_model_spec(model_config)
        backend = spec.backend_class_name.rsplit(".", 1)[-1] if spec else "unknown"
        return f"registry-defined ({backend})"
    return None


# Linear-attention families whose extend a full prefill graph captures:
#   GDN      this package's captured extend on static per-bucket tables
#            (..layers.attention.linear.gdn_prefill_graph), Triton kernels only;
#   KDA      with KDA_FULL_PREFILL_GRAPH, Triton kernels only;
#   Inkling  upstream records its short-conv metadata inside the graph
#            (InklingShortConvAttnBackend.init_forward_metadata_in_graph).
# Mamba2/short-conv (NemotronH, Falcon-H1, GraniteMoeHybrid, LFM2), Lightning and
# registry-defined backends have no capturable extend.
def full_prefill_graph_support(server_args: Any) -> FullPrefillGraphSupport:
    """The capability model: can a full prefill CUDA graph capture this model with
    the settings resolved so far? The full-attention backend is judged once known
    (set by the user, or after sglang resolves it)."""
    cfg = resolving_view(server_args)
    model_config = model_config_of(server_args)
    family = linear_attention_family(model_config)
    kernel = None
    reasons, fixes = [], []
    if family in ("GDN", "KDA"):
        # Under a full prefill graph the automatic FlashInfer prefill defaults are
        # off (GDN: ..layers.attention.linear.gdn_backend; KDA: upstream's
        # flashinfer_kda_prefill_default), so the kernel is the one configured.
        kernel = cfg.linear_attn_prefill_backend or cfg.linear_attn_backend
    if family == "KDA" and not KDA_FULL_PREFILL_GRAPH:
        reasons.append(_no_capturable_extend(family))
    elif family in ("GDN", "KDA"):
        # The captured extend runs sglang's Triton chunk kernels on static tables.
        if kernel != "triton":
            reasons.append(
                f"the captured {family} extend runs the Triton kernels, not {kernel}"
            )
            fixes.append("set --linear-attn-prefill-backend triton")
    elif family not in (None, "Inkling short-conv"):
        reasons.append(_no_capturable_extend(family))

    attention, _ = attention_backends_of(resolved_view(server_args))
    mla = use_mla_backend(server_args)
    capable = (
        FULL_PREFILL_MLA_ATTENTION_BACKENDS if mla else FULL_PREFILL_ATTENTION_BACKENDS
    )
    # dLLM backends plan their own prefill-graph metadata (dllm_attention).
    if attention is not None and cfg.dllm_algorithm is None:
        if attention not in capable:
            reasons.append(
                f"the {attention} attention backend{' (MLA)' if mla else ''} plans "
                "no extend for a full prefill graph"
                + (_TRITON_FAILURE if attention == "triton" else "")
            )
            fixes.append("set --attention-backend " + " / ".join(capable))
    return FullPrefillGraphSupport(
        architecture=model_config.hf_config.architectures[0],
        linear_attention=family,
        linear_prefill_kernel=kernel,
        attention_backend=attention,
        capturing_attention_backends=capable,
        reasons=tuple(reasons),
        fixes=tuple(fixes),
    )


_TRITON_FAILURE = (
    " (its capture fails with 'Invalid forward mode EXTEND for CUDA Graph replay')"
)


def _no_capturable_extend(family: str) -> str:
    return (
        f"{family} linear attention has no capturable extend (its kernels read "
        "host-side sequence lengths, and sglang plans only its decode and verify "
        "out of graph)"
    )


def user_prefill_backend(server_args: Any) -> Optional[str]:
    """The prefill graph backend the user's own flags ask for, None if they set none.

    parse_cuda_graph_config locks the prefill backend for any source, including a
    model default declared before it (Inkling's cuda_graph_backend_prefill), so the
    lock alone cannot tell; this reads the raw input with the same precedence.
    """
    raw = getattr(server_args, "_raw_input", None) or {}

    def field(name):
        return raw[name] if name in raw else getattr(server_args, name, None)

    explicit = field("cuda_graph_config")
    if isinstance(explicit, CudaGraphConfig):
        explicit = explicit.to_dict()
    prefill = (explicit or {}).get(Phase.PREFILL)
    if isinstance(prefill, dict) and "backend" in prefill:
        return prefill["backend"]
    if field("cuda_graph_backend_prefill") is not None:
        return field("cuda_graph_backend_prefill")
    if field("disable_prefill_cuda_graph") or field("disable_cuda_graph"):
        return Backend.DISABLED
    return None


class _RuleCapture(logging.Filter):
    """Swallows upstream's breakable-rule warning while a rule is only probed."""

    rule: Optional[str] = None

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Breakable CUDA graph is incompatible with"):
            self.rule = record.args[0]
            return False
        return True


def breakable_prefill_graph_rejection(server_args: Any) -> Optional[str]:
    """Which of sglang's own breakable-graph rules turns a default breakable
    prefill graph off for this configuration (None: they accept it).

    Runs upstream's disable_breakable_cudagraph_if_incompatible and rolls back
    whatever it declared.
    """
    if resolving_view(server_args).pp_size > 1:
        # apply_cuda_graph_compatibility: breakable is opt-in under pipeline parallelism.
        return "pipeline parallelism"
    if getattr(server_args, "_resolved_overrides", None) is None:
        server_args._resolved_overrides = []
    stash = server_args._resolved_overrides
    before = len(stash)
    capture = _RuleCapture()
    upstream.logger.addFilter(capture)
    try:
        upstream.disable_breakable_cudagraph_if_incompatible(server_args)
    finally:
        upstream.logger.removeFilter(capture)
        rejected = len(stash) > before
        del stash[before:]
    if not rejected:
        return None
    # The one unnamed rule: context parallelism without a breakable CP path.
    return capture.rule or "context parallelism without breakable CP support"


def _downgrade(server_args: Any, support: FullPrefillGraphSupport) -> None:
    """Replace a full prefill graph the user did not ask for: breakable if sglang's
    breakable rules accept the configuration, else disabled; one warning."""
    rejection = breakable_prefill_graph_rejection(server_args)
    target = Backend.BREAKABLE if rejection is None else Backend.DISABLED
    because = (
        "" if rejection is None else f" (sglang's breakable rules exclude {rejection})"
    )
    logger.warning(
        "Full prefill CUDA graph (%s) cannot be captured here: %s; %s. Using the %s "
        "prefill graph instead%s. Set --cuda-graph-backend-prefill to choose one.",
        _full_source(server_args),
        support.describe(),
        "; ".join(support.reasons),
        target,
        because,
    )
    cfg = resolving_view(server_args)
    declare_resolution(
        server_args,
        DOWNGRADE_SOURCE,
        cuda_graph_config=with_phase(
            cfg.cuda_graph_config, Phase.PREFILL, backend=target
        ),
    )


def _full_source(server_args: Any) -> str:
    """Who selected the full prefill graph, from sglang's resolution record."""
    for source, fields in reversed(getattr(server_args, "_resolved_overrides", ())):
        if fields.get("cuda_graph_backend_prefill") == Backend.FULL:
            return f"selected by {source}"
    return "selected automatically"


def _full_prefill_error(server_args: Any, support: FullPrefillGraphSupport) -> str:
    remedies = ["--cuda-graph-backend-prefill disabled"]
    # An explicit breakable graph is also how pipeline parallelism opts in.
    if breakable_prefill_graph_rejection(server_args) in (None, "pipeline parallelism"):
        remedies.insert(0, "--cuda-graph-backend-prefill breakable")
    keep = f", or keep it: {'; '.join(support.fixes)}" if support.fixes else ""
    return (
        "The full prefill CUDA graph requested (--cuda-graph-backend-prefill full / "
        f"--cuda-graph-config) cannot be captured: {support.describe()}; "
        f"{'; '.join(support.reasons)}. Use {' or '.join(remedies)} instead{keep}."
    )


def _full_instead(support: FullPrefillGraphSupport) -> str:
    """The full prefill graph as a remedy, when this configuration can capture it
    (naming the attention backends it needs while that is not chosen yet)."""
    if not support.capable:
        return ""
    if support.attention_backend is None:
        backends = " / ".join(support.capturing_attention_backends)
        return f" or --cuda-graph-backend-prefill full (attention backend {backends})"
    return " or --cuda-graph-backend-prefill full"


# What:    Wraps disable_full_prefill_cudagraph_if_incompatible with the rules of
#          full_prefill_graph_support.
# Why:     The upstream rule list is empty, so a full prefill graph sglang selects
#          on a configuration that cannot capture it crashes at capture.
# How:     If the model names reasons, warn once and declare the breakable prefill
#          graph when sglang's breakable rules accept the configuration, else
#          disabled (_downgrade); otherwise defer to upstream.
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::disable_full_prefill_cudagraph_if_incompatible
# Removal: once upstream's rule list knows which configurations capture.
def downgrade_unsupported_full_prefill_graph(original, server_args: Any):
    support = full_prefill_graph_support(server_args)
    if support.capable:
        return original(server_args)
    _downgrade(server_args, support)


# What:    Wraps apply_cuda_graph_compatibility to run the full prefill graph rules
#          on a full prefill graph that a model default locked.
# Why:     The cascade returns early when the prefill backend is locked, and a
#          model default (Inkling's apply_inkling_prefill_cuda_graph_default)
#          locks it like a user flag, so no rule ever sees it.
# How:     After upstream, if the prefill backend is a locked full that the user's
#          own flags did not ask for (user_prefill_backend), call
#          disable_full_prefill_cudagraph_if_incompatible as the cascade would.
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::apply_cuda_graph_compatibility
# Removal: once upstream's lock distinguishes user flags from model defaults.
def full_prefill_rules_for_model_defaults(original, server_args: Any):
    original(server_args)
    cfg = resolving_view(server_args)
    if (
        cfg.cuda_graph_config.prefill.backend == Backend.FULL
        and (Phase.PREFILL, "backend") in server_args._cuda_graph_config_locked
        and user_prefill_backend(server_args) is None
    ):
        upstream.disable_full_prefill_cudagraph_if_incompatible(server_args)


# What:    Wraps validate_cuda_graph_config to reject an explicit prefill graph
#          backend that cannot run on this configuration.
# Why:     Validation checks only the backend's name and the lock skips every
#          rule, so an explicit full graph fails minutes later at capture, and an
#          explicit breakable graph runs where sglang's own rules turn it off
#          (e.g. KDA on Kimi-Linear).
# How:     After upstream, for the user's own full: raise a ValueError naming the
#          architecture, linear attention, full-attention backend and the flags to
#          use (full_prefill_graph_support). For the user's own breakable: raise
#          if one of sglang's breakable rules rejects it, or warn if that rule is
#          known to work (BREAKABLE_RULES_KNOWN_TO_WORK).
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::validate_cuda_graph_config
# Removal: once upstream validates the prefill backend against the model.
def reject_explicit_prefill_graph_it_cannot_run(original, server_args: Any):
    original(server_args)
    graph_config = resolving_view(server_args).cuda_graph_config
    if graph_config is None:
        return
    backend = graph_config.prefill.backend
    if user_prefill_backend(server_args) != backend:
        return
    if backend == Backend.FULL:
        support = full_prefill_graph_support(server_args)
        if not support.capable:
            raise ValueError(_full_prefill_error(server_args, support))
    elif backend == Backend.BREAKABLE:
        rule = breakable_prefill_graph_rejection(server_args)
        if rule is None or rule == "pipeline parallelism":
            return  # an explicit breakable graph is how PP opts in
        arch = model_config_of(server_args).hf_config.architectures[0]
        why = _BREAKABLE_RULE_WHY.get(rule, "")
        if rule in BREAKABLE_RULES_KNOWN_TO_WORK:
            logger.warning(
                "Breakable prefill CUDA graph on %s, as requested: sglang turns it "
                "off by default for %s. Use --cuda-graph-backend-prefill disabled "
                "if capture runs out of memory.",
                arch,
                rule,
            )
            return
        full = ""
        if rule == "KDA hybrid linear attention":  # KDA's full prefill graph
            full = _full_instead(full_prefill_graph_support(server_args))
        raise ValueError(
            f"The breakable prefill CUDA graph requested (--cuda-graph-backend-prefill "
            f"breakable) cannot run on {arch}: sglang's breakable rules exclude "
            f"{rule}{': ' + why if why else ''}. Use --cuda-graph-backend-prefill "
            f"disabled{full} instead."
        )


# What:    Wraps disable_prefill_cuda_graph_for_deepseek_trtllm_mla (the first
#          prefill-graph rule after the attention backend resolves) to judge a full
#          prefill graph again on the resolved full-attention backend.
# Why:     handle_cuda_graph_config runs before sglang picks the attention backend
#          (its default, model overrides such as Inkling's, the fa3 fp8_e5m2
#          fallback to triton), so a backend that cannot capture a full prefill
#          graph can still be chosen after the rules above ran.
# How:     After upstream: a full prefill graph that full_prefill_graph_support now
#          rejects raises the same ValueError when the user asked for it, else is
#          downgraded (_downgrade) and DeepEP's breakable buckets aligned, as
#          apply_prefill_cp_cuda_graph_default does after a late change.
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::disable_prefill_cuda_graph_for_deepseek_trtllm_mla
# Removal: with reject_explicit_prefill_graph_it_cannot_run.
def recheck_full_prefill_graph_on_resolved_attention(original, server_args: Any):
    original(server_args)
    if resolving_view(server_args).cuda_graph_config.prefill.backend != Backend.FULL:
        return
    support = full_prefill_graph_support(server_args)
    if support.capable:
        return
    if user_prefill_backend(server_args) == Backend.FULL:
        raise ValueError(_full_prefill_error(server_args, support))
    _downgrade(server_args, support)
    upstream.apply_deepep_adjustments(server_args)
