# SPDX-License-Identifier: Apache-2.0
"""Full prefill CUDA graphs, decided when the server arguments resolve.

Fixes sglang/srt/arg_groups/cuda_graph_hook.py. In 0.5.23 the full prefill graph's
rule list is empty, the compatibility cascade is skipped whenever the prefill
backend is locked (also by a model default such as Inkling's), and validation
checks only the backend's name. A configuration whose linear attention or
full-attention backend cannot capture a plain extend therefore reaches graph
capture and dies there: ``IndexError`` in ``HybridLinearAttnBackend._replay_metadata``,
or ``ValueError: Invalid forward mode EXTEND for CUDA Graph replay`` (triton).

The capability model (``..full_prefill_graph_capability``) decides; a hook
applies it once every setting it reads has resolved, another gives a hybrid
model's full graph enough request slots for multi-request prefill batches, and a
third keeps every prefill batch within those slots.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.arg_groups import cuda_graph_hook as upstream
from sglang.srt.arg_groups.overrides import (
    declare_resolution,
    model_config_of,
    resolving_view,
    use_mla_backend,
)
from sglang.srt.model_executor.cuda_graph_config import (
    Backend,
    CudaGraphConfig,
    Phase,
    with_phase,
)
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.full_prefill_graph_capability import (
    FullPrefillGraphSupport,
    full_prefill_graph_support,
)

logger = logging.getLogger(__name__)

# The declaration source this package's downgrades carry in sglang's record.
DOWNGRADE_SOURCE = "sglang_graphfix:full_prefill_graph_rules"
# The source of a Mamba2 full prefill graph run as breakable
# (route_mamba2_full_prefill_to_breakable).
ROUTE_SOURCE = "sglang_graphfix:mamba2_full_prefill_to_breakable"

# The one breakable-graph rule of sglang's (disable_breakable_cudagraph_if_incompatible)
# that an explicit --cuda-graph-backend-prefill breakable is refused for: upstream
# lets the explicit flag through, and KDA's extend then runs eagerly between graph
# segments on a path sglang validates on GLM-5.3 Flash only. Every other rule is
# left to upstream, which serves the explicit request.
KDA_BREAKABLE_RULE = "KDA hybrid linear attention"


def user_prefill_backend(server_args: Any) -> str | None:
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


class _RuleRecorder:
    """Stands in for upstream's module logger while its breakable rules are only
    probed: records the rule a warning names and prints nothing, whatever the log
    level (a logging.Filter never sees a record below the logger's level)."""

    def __init__(self):
        self.rule: str | None = None

    def warning(self, msg, *args, **kwargs):
        if str(msg).startswith("Breakable CUDA graph is incompatible with"):
            self.rule = args[0]

    def __getattr__(self, name):  # info, debug, ...: nothing to record
        return lambda *args, **kwargs: None


def breakable_prefill_graph_rejection(server_args: Any) -> str | None:
    """Which of sglang's own breakable-graph rules turns a default breakable
    prefill graph off for this configuration (None: they accept it).

    Runs upstream's disable_breakable_cudagraph_if_incompatible and rolls back
    whatever it declared.
    """
    if resolving_view(server_args).pp_size > 1:
        # apply_cuda_graph_compatibility: breakable is opt-in under pipeline parallelism.
        return "pipeline parallelism"
    return breakable_rule_rejection(server_args)


def breakable_rule_rejection(server_args: Any) -> str | None:
    """Which rule of upstream's disable_breakable_cudagraph_if_incompatible turns
    a breakable prefill graph off for this configuration (None: none does),
    whatever the parallelism; whatever it declared is rolled back."""
    if getattr(server_args, "_resolved_overrides", None) is None:
        server_args._resolved_overrides = []
    stash = server_args._resolved_overrides
    before = len(stash)
    recorder, upstream_logger = _RuleRecorder(), upstream.logger
    upstream.logger = recorder
    try:
        upstream.disable_breakable_cudagraph_if_incompatible(server_args)
    finally:
        upstream.logger = upstream_logger
        rejected = len(stash) > before
        del stash[before:]
    if not rejected:
        return None
    # The one unnamed rule: context parallelism without a breakable CP path.
    return recorder.rule or "context parallelism without breakable CP support"


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
    _declare_prefill_backend(server_args, DOWNGRADE_SOURCE, target)


def _declare_prefill_backend(server_args: Any, source: str, backend: str) -> None:
    """Declare the prefill graph backend in sglang's resolution record."""
    cfg = resolving_view(server_args)
    declare_resolution(
        server_args,
        source,
        cuda_graph_config=with_phase(
            cfg.cuda_graph_config, Phase.PREFILL, backend=backend
        ),
    )
    # As apply_prefill_cp_cuda_graph_default does after a late change: DeepEP's
    # breakable buckets must be multiples of 8.
    upstream.apply_deepep_adjustments(server_args)


def _full_source(server_args: Any) -> str:
    """Who selected the full prefill graph, from sglang's resolution record."""
    for source, fields in reversed(getattr(server_args, "_resolved_overrides", ())):
        if fields.get("cuda_graph_backend_prefill") == Backend.FULL:
            return f"selected by {source}"
    return "selected automatically"


def _full_prefill_error(server_args: Any, support: FullPrefillGraphSupport) -> str:
    remedies = ["--cuda-graph-backend-prefill disabled"]
    # An explicit breakable graph is also how pipeline parallelism opts in.
    if breakable_rule_rejection(server_args) is None:
        remedies.insert(0, "--cuda-graph-backend-prefill breakable")
    keep = f", or keep it: {'; '.join(support.fixes)}" if support.fixes else ""
    return (
        "The full prefill CUDA graph requested (--cuda-graph-backend-prefill full / "
        f"--cuda-graph-config) cannot be captured: {support.describe()}; "
        f"{'; '.join(support.reasons)}. Use {' or '.join(remedies)} instead{keep}."
    )


def _kda_breakable_error(server_args: Any) -> str:
    arch = model_config_of(server_args).hf_config.architectures[0]
    support = full_prefill_graph_support(server_args)
    full = " or --cuda-graph-backend-prefill full" if support.capable else ""
    return (
        "The breakable prefill CUDA graph requested (--cuda-graph-backend-prefill "
        f"breakable) cannot run on {arch}: sglang's breakable rules exclude "
        f"{KDA_BREAKABLE_RULE}: sglang validates the breakable prefill graph for KDA "
        "on GLM-5.3 Flash only and keeps it off for other KDA models. Use "
        f"--cuda-graph-backend-prefill disabled{full} instead."
    )


# What:    Wraps finalize_cuda_graph_prefill_max_context, the last prefill-graph
#          step of server-argument resolution, to judge the prefill graph backend
#          on the final settings with the capability model
#          (..full_prefill_graph_capability.full_prefill_graph_support).
# Why:     0.5.23's full prefill graph rules are empty and the backend lock skips
#          them for a user's flag and for a model default alike (Inkling's), so a
#          configuration that cannot capture a full prefill graph loads its
#          weights and dies at capture (IndexError in
#          HybridLinearAttnBackend._replay_metadata; triton's "Invalid forward
#          mode EXTEND for CUDA Graph replay"); and an explicit breakable graph
#          runs KDA's extend where sglang's own rule keeps it off. The facts the
#          verdict needs settle late: the attention backend (its default, model
#          overrides, the fa3 fp8_e5m2 fallback, capability adjustments), the
#          linear-attention kernels, speculative decoding, the page-major layout.
# How:     After upstream, on a full prefill graph the model rejects: a
#          ValueError naming the settings and the flags to use when the user asked
#          for it (user_prefill_backend), else one warning and the breakable graph
#          where sglang's breakable rules accept the configuration, disabled
#          otherwise (_downgrade). On a breakable graph the user asked for on a
#          model sglang's KDA rule excludes: a ValueError. Anything else: upstream.
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::finalize_cuda_graph_prefill_max_context
#          (to propose: the rules in disable_full_prefill_cudagraph_if_incompatible,
#          checked for locked backends too, on the final settings)
# Removal: once upstream validates the prefill graph backend against the model.
def judge_prefill_graph_on_final_settings(original, server_args: Any):
    original(server_args)
    graph_config = resolving_view(server_args).cuda_graph_config
    if graph_config is None:
        return
    backend = graph_config.prefill.backend
    explicit = user_prefill_backend(server_args) == backend
    if backend == Backend.FULL:
        support = full_prefill_graph_support(server_args)
        if support.capable:
            return
        if explicit:
            raise ValueError(_full_prefill_error(server_args, support))
        _downgrade(server_args, support)
    elif (
        backend == Backend.BREAKABLE
        and explicit
        and breakable_rule_rejection(server_args) == KDA_BREAKABLE_RULE
    ):
        raise ValueError(_kda_breakable_error(server_args))


# What:    Wraps finalize_cuda_graph_prefill_max_context: a full prefill graph
#          on a Mamba2 model that sglang's breakable graph runs (every layer
#          holds attention: Falcon-H1, NemotronH of Mamba2 and attention layers
#          only) becomes breakable, with one warning.
# Why:     The full graph captures there (upstream crashes), but served at
#          Falcon-H1-7B's dimensions on an H200 (issue 16,
#          benchmark/results/gpu/serving_2026-12-02c/falcon_h1_7b) its median
#          time to first token was above breakable's at every workload measured
#          (MAMBA2_FULL_BEATS_BREAKABLE; profiled again with fewer track rows,
#          2026-12-03: still 37.1 vs 20.3 ms for 8 x 64 tokens): a full graph
#          asked for speed would cost it. Where sglang runs no prefill graph
#          (NemotronH's MLP and MoE layers, Granite's Mamba2 layers, LFM2's conv
#          layers) breakable means eager, which on Falcon-H1-7B was 3x slower
#          than full for short prompts (141.7 vs 47.4 ms at 16 tokens) and
#          matched or beat it at 2k-16k tokens: the full graph stays there, a
#          bet on short prompts.
# How:     After upstream and before the capability judgement (so that no
#          refusal asks for flags that would only lead here): on a full prefill
#          graph of a Mamba2-mixer model with no layer sglang's graph setup finds
#          no attention module in, and sglang's breakable rules accepting the
#          configuration, declare the breakable backend in sglang's resolution
#          record and warn, naming the measurement. Under pipeline parallelism
#          breakable is opt-in (breakable_prefill_graph_rejection): the full
#          graph is judged as before, as it is with MAMBA2_FULL_BEATS_BREAKABLE.
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::finalize_cuda_graph_prefill_max_context
#          (nothing to propose: upstream's full prefill graph crashes on these
#          models)
# Removal: once the full graph beats breakable on these models
#          (MAMBA2_FULL_BEATS_BREAKABLE).
def route_mamba2_full_prefill_to_breakable(original, server_args: Any):
    original(server_args)
    cfg = resolving_view(server_args)
    if not _full_prefill_graph(cfg) or capability.MAMBA2_FULL_BEATS_BREAKABLE:
        return
    settings, _ = capability.settings_from_server_args(server_args)
    if (
        settings.family != capability.MAMBA2_FAMILY
        or settings.mamba_mixer != "mamba2"
        or settings.layer_gap is not None
        or breakable_prefill_graph_rejection(server_args) is not None
    ):
        return
    explicit = user_prefill_backend(server_args) == Backend.FULL
    logger.warning(
        "Full prefill CUDA graph (%s) on %s: sglang's breakable prefill graph runs "
        "this model (its Mamba2 layers eager between captured segments), and its "
        "median time to first token was below the full graph's at every workload "
        "measured on an H200 at Falcon-H1-7B's dimensions (22.9 vs 47.4 ms for one "
        "16-token prompt). Using the breakable prefill graph instead; no flag keeps "
        "the full graph on this model.",
        "requested" if explicit else _full_source(server_args),
        settings.architecture,
    )
    _declare_prefill_backend(server_args, ROUTE_SOURCE, Backend.BREAKABLE)


def _full_prefill_graph(cfg: Any) -> bool:
    graph_config = cfg.cuda_graph_config
    return graph_config is not None and graph_config.prefill.backend == Backend.FULL


# The fewest request slots a hybrid model's full prefill graph gets when the user
# sets none. Issue 13, on a Qwen3-Next layout at chunked_prefill_size 512: with 8
# slots 8 x 64-token batches replayed the graph, 1.7x faster than breakable; a
# lone 16-token prompt paid the padding (11.4 instead of 8.6 ms with one slot) and
# stayed 2x faster than breakable.
HYBRID_FULL_PREFILL_MIN_REQ = 8


def sglang_full_prefill_slots(chunked_prefill_size: int | None) -> int:
    """The request slots sglang gives a full prefill graph when none is set
    (cuda_graph_setup at capture, before its cap at the request pool)."""
    return max((chunked_prefill_size or 0) // 512, 1)


# What:    Wraps finalize_cuda_graph_prefill_max_context: a full prefill graph on
#          a hybrid linear-attention model gets up to HYBRID_FULL_PREFILL_MIN_REQ
#          request slots when the user set no full_prefill_max_req.
# Why:     sglang sizes the slots at capture as max(chunked_prefill_size // 512,
#          1): one at chunked_prefill_size 512 (a setting users lower for
#          latency), so every prefill batch of two or more requests ran eager,
#          slower than under sglang's default breakable graph (issue 13). The
#          cost: a batch of fewer requests replays padded to 8 slots (a lone
#          short prompt some latency), and a PD prefill server with
#          --max-mamba-cache-size and --prefill-max-requests <= 8 sizes its KV
#          cache as upstream does when the user sets the slots (no reserve for
#          eager prefill activations).
# How:     After upstream (and the capability judgement, which has refused or
#          downgraded what cannot capture): on a full prefill graph of a model
#          with linear attention, no slot count set and sglang's rule below the
#          floor, declare the floor in sglang's resolution record (capture still
#          caps it at the request pool) and say so once at INFO, naming the
#          setting. On an MLA model with the chunked prefix cache (Kimi-Linear),
#          whose graph replays a cached prefix in chunks of
#          full_prefill_prefix_chunk_tokens shared by the slots, also declare
#          that many more chunk tokens when the user set none, so that each
#          request's chunk, and the longest prefix a graph replays, stay sglang's
#          (8 slots alone cut them 8x at chunked_prefill_size 512: cached prefixes
#          over 1024 tokens ran eager). Models without linear attention, and
#          Inkling's short conv (sglang captures its full graph itself), keep
#          upstream's rule.
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::finalize_cuda_graph_prefill_max_context
#          (to propose: a floor in cuda_graph_setup's full_prefill_max_req default)
# Removal: once upstream's default keeps multi-request prefill batches on the graph.
def hybrid_full_prefill_request_slots(original, server_args: Any):
    original(server_args)
    cfg = resolving_view(server_args)
    graph_config = cfg.cuda_graph_config
    if (
        not _full_prefill_graph(cfg)
        or graph_config.prefill.full_prefill_max_req is not None
    ):
        return
    linear = _linear_attention_of_our_graph(server_args)
    upstream_slots = sglang_full_prefill_slots(cfg.chunked_prefill_size)
    if linear is None or upstream_slots >= HYBRID_FULL_PREFILL_MIN_REQ:
        return
    prefill = {"full_prefill_max_req": HYBRID_FULL_PREFILL_MIN_REQ}
    chunk_tokens = _prefix_chunk_tokens_for_slots(server_args, upstream_slots)
    if chunk_tokens is not None:
        prefill["full_prefill_prefix_chunk_tokens"] = chunk_tokens
    declare_resolution(
        server_args,
        "_hybrid_full_prefill_request_slots",
        cuda_graph_config=with_phase(graph_config, Phase.PREFILL, **prefill),
    )
    logger.info(
        "Full prefill CUDA graph on %s linear attention: up to %d request slots per "
        "captured batch (sglang's rule, chunked_prefill_size %s // 512, gives %d, "
        "which sends every prefill batch of more requests eager; fewer requests "
        "replay padded to the slots)%s. Set --cuda-graph-config "
        '\'{"prefill": {"backend": "full", "full_prefill_max_req": N}}\' to choose.',
        linear,
        HYBRID_FULL_PREFILL_MIN_REQ,
        cfg.chunked_prefill_size,
        upstream_slots,
        (
            f", and cached-prefix chunks of {chunk_tokens} tokens over the slots "
            f"(full_prefill_prefix_chunk_tokens), "
            f"{chunk_tokens // _capped(HYBRID_FULL_PREFILL_MIN_REQ, cfg)} a request "
            "as with sglang's slots"
            if chunk_tokens is not None
            else ""
        ),
    )


def _linear_attention_of_our_graph(server_args: Any) -> str | None:
    """The linear-attention family whose full prefill graph this package
    captures; None without linear attention and for Inkling's short conv, whose
    full prefill graph is sglang's own."""
    linear = full_prefill_graph_support(server_args).linear_attention
    return None if linear == capability.INKLING_FAMILY else linear


def _prefix_chunk_tokens_for_slots(server_args: Any, upstream_slots: int) -> int | None:
    """The aggregate cached-prefix chunk that gives each of the raised slots the
    per-request chunk sglang's own slots would get
    (PrefillCudaGraphRunner._resolve_prefix_chunk_shape: the chunk tokens, by
    default chunked_prefill_size, else the prefill max_bs, over the slots, both
    slot counts capped at --max-running-requests as capture caps them at the
    request pool), where the graph captures cached-prefix chunks (an MLA model
    with the chunked prefix cache) and the user set no chunk size; else None. A
    request pool smaller still (a tiny memory budget) gives each request a larger
    chunk than sglang's."""
    cfg = resolving_view(server_args)
    prefill = cfg.cuda_graph_config.prefill
    if (
        prefill.full_prefill_prefix_chunk_tokens is not None
        or cfg.disable_chunked_prefix_cache
        or not use_mla_backend(server_args)
    ):
        return None
    capacity = cfg.chunked_prefill_size
    if capacity is None or capacity <= 0:
        capacity = prefill.max_bs
    if capacity is None or capacity <= 0:
        return None
    return max(capacity // _capped(upstream_slots, cfg), 1) * _capped(
        HYBRID_FULL_PREFILL_MIN_REQ, cfg
    )


def _capped(slots: int, cfg: Any) -> int:
    """A full graph's request slots as capture caps them, where
    --max-running-requests bounds the request pool."""
    return min(slots, cfg.max_running_requests or slots)


def full_prefill_request_slots(cfg: Any) -> int:
    """The request slots of a full prefill graph as resolved: full_prefill_max_req,
    else sglang's capture-time rule (capture then caps them at the request pool,
    which bounds every batch as well)."""
    slots = cfg.cuda_graph_config.prefill.full_prefill_max_req
    return (
        slots
        if slots is not None
        else sglang_full_prefill_slots(cfg.chunked_prefill_size)
    )


# What:    Wraps finalize_cuda_graph_prefill_max_context: under a full prefill
#          graph on a hybrid linear-attention model, a prefill batch takes at most
#          as many requests as the graph has request slots (sglang's
#          --prefill-max-requests) when the user set no such cap.
# Why:     sglang forms prefill batches of any number of requests and runs those
#          above the slots eager. Served at Qwen3-Next-80B-A3B's dimensions on an
#          H200 (16 slots), 100 chat requests arriving at once formed two eager
#          batches of 32 and 24 requests: full's median time to first token was
#          1677 ms. With the batches capped at 16 the same traffic, in the same
#          session, gave 426 ms and 908 instead of 532 output tokens/s, every
#          prefill batch on the graph (breakable: 668 ms, 728 tokens/s; issue 13,
#          benchmark/results/gpu/serving_2026-12-02).
# How:     After the slots are resolved (hybrid_full_prefill_request_slots): on a
#          full prefill graph of a model with linear attention and no
#          prefill_max_requests set, declare it equal to the slots in sglang's
#          resolution record (its PrefillAdder leaves the other waiting requests
#          to the next prefill batch; with --prefill-delayer-queue-min-ratio the
#          delayer's queue target is capped at it too) and say so once at INFO,
#          naming the flag. Left as upstream: --enable-mixed-chunk (a mixed batch
#          carries the running decode requests too, and runs eager above the
#          slots whatever the cap), and a PD prefill server with
#          --max-mamba-cache-size (a cap at the slots drops its KV-cache reserve
#          for eager prefill activations, kv_pool_runtime: the user's call), and
#          Inkling's short conv (sglang captures its full graph itself; under fa4
#          its multimodal batches run eager whatever their size).
# Upstream: sglang/srt/arg_groups/cuda_graph_hook.py::finalize_cuda_graph_prefill_max_context
#          (to propose: prefill_max_requests defaults to the slots under a full
#          prefill graph)
# Removal: once upstream keeps prefill batches within a full graph's slots, or
#          runs larger ones on a graph.
def cap_prefill_batches_at_request_slots(original, server_args: Any):
    original(server_args)
    cfg = resolving_view(server_args)
    if (
        not _full_prefill_graph(cfg)
        or cfg.prefill_max_requests is not None
        or cfg.enable_mixed_chunk
        or (
            cfg.disaggregation_mode == "prefill"
            and cfg.max_mamba_cache_size is not None
        )
    ):
        return
    linear = _linear_attention_of_our_graph(server_args)
    if linear is None:
        return
    slots = full_prefill_request_slots(cfg)
    declare_resolution(
        server_args, "_cap_prefill_batches_at_request_slots", prefill_max_requests=slots
    )
    logger.info(
        "Full prefill CUDA graph on %s linear attention: a prefill batch takes at most "
        "%d requests, the graph's request slots (a larger batch would run eager); the "
        "other waiting requests go to the next prefill batch. Set "
        "--prefill-max-requests to choose.",
        linear,
        slots,
    )
