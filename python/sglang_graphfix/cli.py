# SPDX-License-Identifier: Apache-2.0
"""``sglang-graphfix explain``: what sglang 0.5.23 does with a model and server
flags, upstream and with sglang-graphfix, and the CUDA-graph plan with every
decision and warning on the way, without a GPU.

sglang's own resolution (``ServerArgs.resolve_once``, with the plugins sglang
loads) runs in this process twice: once with sglang-graphfix's hooks taken off
(upstream), once with them on. Only the hardware probes it reads are answered as
on the chosen GPU (``simulated_gpu``). What resolution cannot show, the failures
that come later at graph capture, is predicted from the resolved arguments with
the conditions sglang checks there (``upstream_outcome``, ``graphfix_outcome``).
No model weights are read: a model directory needs its config.json only, and
without one a sample config shipped with this package is used. Nothing is
downloaded unless --allow-download is given.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import pkgutil
import re
import sys
import textwrap
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

SAMPLE_CONFIGS = Path(__file__).resolve().parent / "sample_configs"
DEFAULT_SAMPLE = "qwen3-next"
PLUGIN_NAME = "graphfix"  # the setup.py entry point in sglang.srt.plugins


@dataclass(frozen=True)
class Gpu:
    name: str
    sm: int
    memory_mib: float


# What `--gpu` can simulate: CUDA GPUs whose every probe sglang's resolution
# reads is answered below (Blackwell is left out: some of its checks call
# is_sm100_supported() directly).
GPUS = {
    "h200": Gpu("NVIDIA H200", 90, 143771.0),
    "h100": Gpu("NVIDIA H100 80GB HBM3", 90, 81559.0),
    "a100": Gpu("NVIDIA A100-SXM4-80GB", 80, 81920.0),
}


@contextlib.contextmanager
def simulated_gpu(gpu: str = "h200"):
    """Answer the hardware probes that sglang's server-argument resolution reads
    as on ``gpu`` (a key of GPUS): the platform facts through sglang's own
    override_platform, plus the few probes it calls directly."""
    import sglang.srt.arg_groups as arg_groups
    from sglang.srt.model_executor import cuda_graph_config
    from sglang.srt.runtime_context import override_platform

    # Import what resolution imports lazily before any probe answers differently,
    # so no import-time probe (e.g. fp8_utils.cutlass_fp8_supported) sees it.
    for module in pkgutil.iter_modules(arg_groups.__path__):
        importlib.import_module(f"{arg_groups.__name__}.{module.name}")
    spec = GPUS[gpu]
    hopper = spec.sm == 90
    facts = dict(
        is_cuda=True,
        is_hip=False,
        is_npu=False,
        is_xpu=False,
        is_musa=False,
        is_mps=False,
        is_sm90=hopper,
        is_sm100=False,
        is_sm100_or_sm110=False,
        is_sm110=False,
        is_sm120=False,
        is_blackwell=False,
        is_hopper_with_cuda_12_3=hopper,
        has_amx=False,
        has_flashinfer=True,
        device_sm=spec.sm,
        device_capability=divmod(spec.sm, 10),
    )
    default_prefill_backend = cuda_graph_config.default_prefill_backend

    def default_prefill_backend_on_cuda():
        # Upstream's own default (breakable on CUDA), its is_cuda() probe answered.
        with mock.patch("sglang.srt.utils.is_cuda", return_value=True):
            return default_prefill_backend()

    memory = mock.Mock(return_value=spec.memory_mib)
    with contextlib.ExitStack() as stack:
        stack.enter_context(override_platform(**facts))
        for target, value in (
            ("sglang.srt.model_executor.cuda_graph_config.default_prefill_backend", default_prefill_backend_on_cuda),
            ("sglang.srt.arg_groups.serving_hook.get_device", mock.Mock(return_value="cuda")),
            ("sglang.srt.arg_groups.memory_hook.get_device_memory_capacity", memory),
            ("sglang.srt.arg_groups.kv_shard_hook.get_device_memory_capacity", memory),
            ("torch.cuda.get_device_capability", mock.Mock(return_value=divmod(spec.sm, 10))),
        ):  # fmt: skip
            stack.enter_context(mock.patch(target, value))
        yield spec


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def _captured_logs():
    """Keep log records instead of printing them (restores the root logger).
    Yields a function that (re)installs the capture, since sglang's
    prepare_server_args replaces the root handlers."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    handler = _Records()

    def install():
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)

    install()
    try:
        yield install, handler.records
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


# Server-argument fields whose decisions explain lists.
_PLAN_FIELDS = (
    "cuda_graph_backend_prefill",
    "cuda_graph_backend_decode",
    "disable_cuda_graph",
    "disable_prefill_cuda_graph",
    "disable_decode_cuda_graph",
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "linear_attn_backend",
    "linear_attn_prefill_backend",
    "linear_attn_decode_backend",
    "prefill_max_requests",
)


@dataclass
class Plan:
    """What resolution decided, or the error that stops the server."""

    server_args: object
    error: BaseException | None = None
    decisions: list[tuple[str, str]] = field(default_factory=list)
    log: list[logging.LogRecord] = field(default_factory=list)
    outcome: Outcome | None = None


def _decisions(server_args) -> list[tuple[str, str]]:
    """sglang's resolution record (``_resolved_overrides``): each declaration that
    changed a CUDA-graph backend, the full prefill graph's request slots or
    cached-prefix chunk tokens, or an attention backend, in order."""
    out, graph = [], (None, None)
    prefill = dict.fromkeys(
        ("full_prefill_max_req", "full_prefill_prefix_chunk_tokens")
    )
    for source, fields in getattr(server_args, "_resolved_overrides", ()):
        parts = []
        config = fields.get("cuda_graph_config")
        if config is not None:
            now = (config.prefill.backend, config.decode.backend)
            if now != graph:
                parts.append(f"prefill graph {now[0]}, decode graph {now[1]}")
            graph = now
            for name, before in prefill.items():
                value = getattr(config.prefill, name)
                if value != before:
                    prefill[name] = value
                    parts.append(f"{name}={value}")
        parts += [f"{k}={fields[k]}" for k in _PLAN_FIELDS if k in fields]
        if parts:
            out.append((source, "; ".join(parts)))
    return out


class BadInput(Exception):
    """Input explain cannot run with: printed as one line, exit status 2."""


@dataclass(frozen=True)
class Outcome:
    """What a server started with these flags does: runs, or fails and how."""

    runs: bool
    text: str


@dataclass(frozen=True)
class GraphfixState:
    """Whether sglang applies sglang-graphfix in a server started here."""

    applied: bool
    available: bool  # its hooks can be applied to the installed sglang
    why: str


def graphfix_state() -> GraphfixState:
    """What sglang's plugin loader does with sglang-graphfix in a server started
    with this environment: its entry point, SGLANG_PLUGINS, SGLANG_GRAPHFIX and
    the installed sglang, read as load_plugins and register() read them."""
    from importlib.metadata import entry_points

    import sglang_graphfix

    found = sglang_graphfix.installed_sglang()
    if found != sglang_graphfix.SUPPORTED_SGLANG:
        return GraphfixState(
            False,
            False,
            f"NOT applied: it supports sglang=={sglang_graphfix.SUPPORTED_SGLANG} "
            f"only, found sglang=={found}",
        )
    switch = os.environ.get("SGLANG_GRAPHFIX", "").strip()
    if switch.lower() in ("0", "false", "off", "no"):
        return GraphfixState(False, True, f"OFF (SGLANG_GRAPHFIX={switch})")
    names = [
        ep.name
        for ep in entry_points(group="sglang.srt.plugins")
        if ep.value.replace(" ", "") == "sglang_graphfix:register"
    ]
    if not names:
        return GraphfixState(
            False,
            True,
            "NOT installed as a sglang plugin (no sglang.srt.plugins entry point; "
            "pip install sglang-graphfix)",
        )
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()}
    if allowed_set and not allowed_set & set(names):
        return GraphfixState(False, True, f"OFF (SGLANG_PLUGINS={allowed})")
    return GraphfixState(True, True, "active")


def _around_hook(wrapper) -> tuple[object, object]:
    """(hook, wrapped function) of a HookRegistry AROUND wrapper, whose closure
    holds both; (None, None) for anything else."""
    code = getattr(wrapper, "__code__", None)
    if code is None or not {"hook", "original_fn"} <= set(code.co_freevars):
        return None, None
    cells = dict(zip(code.co_freevars, wrapper.__closure__))
    return cells["hook"].cell_contents, cells["original_fn"].cell_contents


def _graphfix_hooks() -> dict[int, tuple[object, str, object, object]]:
    """sglang-graphfix's hooks applied in this process: id(wrapper) -> (owner,
    name, wrapper, the upstream function it wraps)."""
    from sglang_graphfix.patches import PATCHES

    ours = {patch.hook for patch in PATCHES}
    hooks = {}
    for patch in PATCHES:
        owner_path, name = patch.target.rsplit(".", 1)
        owner = pkgutil.resolve_name(owner_path)
        wrapper = vars(owner).get(name) if isinstance(owner, type) else None
        if wrapper is None:
            wrapper = getattr(owner, name)
        # A classmethod/staticmethod stays one, as HookRegistry keeps it.
        kind = (
            type(wrapper) if isinstance(wrapper, (classmethod, staticmethod)) else None
        )
        hook, original = _around_hook(wrapper.__func__ if kind else wrapper)
        if hook in ours:
            # Several of ours on one target (e.g. PrefillCudaGraphRunner.capture):
            # upstream's function is below the last of them.
            while _around_hook(original)[0] in ours:
                original = _around_hook(original)[1]
            hooks[id(wrapper)] = (
                owner,
                name,
                wrapper,
                kind(original) if kind else original,
            )
            continue
        wrapper = wrapper.__func__ if kind else wrapper
        while wrapper is not None:  # ours further in: another hook wraps it
            if _around_hook(wrapper)[0] is patch.hook:
                raise RuntimeError(
                    f"cannot show upstream's plan: another plugin's hook on "
                    f"{patch.target} wraps sglang-graphfix's"
                )
            wrapper = getattr(wrapper, "__wrapped__", None)
    return hooks


@contextlib.contextmanager
def graphfix_hooks_removed():
    """Upstream sglang for the duration: every hook sglang-graphfix applied is
    replaced by the function it wraps, also where a module imported it by name
    (HookRegistry propagated the wrapper there), and put back afterwards."""
    hooks = _graphfix_hooks()
    swapped = []
    for owner, name, wrapper, original in hooks.values():
        setattr(owner, name, original)
        swapped.append((owner, name, wrapper))
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        for name, value in list(vars(module).items()):
            hook = hooks.get(id(value))
            if hook is not None and value is hook[2] and module is not hook[0]:
                setattr(module, name, hook[3])
                swapped.append((module, name, value))
    try:
        yield
    finally:
        for owner, name, wrapper in reversed(swapped):
            setattr(owner, name, wrapper)


def apply_graphfix() -> None:
    """sglang-graphfix's hooks in this process, whether or not sglang's plugin
    loader applied them (explain shows both plans wherever it runs)."""
    import sglang_graphfix

    if not sglang_graphfix._registered:
        from sglang_graphfix.patches import apply_patches

        apply_patches()
        sglang_graphfix._registered = True


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports an error as one line plus a hint, exit status 2."""

    def error(self, message):
        raise BadInput(message)


def parse_sglang_args(sglang_argv: list[str]):
    """sglang's own server parser (prepare_server_args), its errors as BadInput
    instead of its usage text."""
    from sglang.srt.server_args import prepare_server_args

    def one_line(parser, message):
        raise BadInput(message)

    with mock.patch.object(argparse.ArgumentParser, "error", one_line):
        try:
            return prepare_server_args(sglang_argv)
        except BadInput:
            raise
        except Exception as exc:  # a value sglang rejects while parsing
            raise BadInput(f"{type(exc).__name__}: {exc}") from exc


def resolve(
    sglang_argv: list[str], gpu: str = "h200", *, graphfix: bool = True
) -> Plan:
    """Parse ``sglang_argv`` with sglang's own server parser and resolve it as
    sglang does at launch (plugins loaded), as on ``gpu``: with sglang-graphfix's
    hooks (``graphfix``) or without them (upstream). The SGLANG_* variables
    resolution exports are undone afterwards, so each resolution starts alike."""
    from sglang.srt.plugins import load_plugins

    environ = dict(os.environ)
    with _captured_logs() as (capture, records):
        try:
            server_args = parse_sglang_args(sglang_argv)
            capture()  # prepare_server_args installed its own root handler
            load_plugins()
            if graphfix:
                apply_graphfix()
            view = contextlib.nullcontext() if graphfix else graphfix_hooks_removed()
            plan = Plan(server_args)
            with view, simulated_gpu(gpu):
                try:  # as the engine's launch does, before any model load
                    server_args.resolve_once()
                    server_args.check_server_args()
                except Exception as exc:  # what stops the server at launch
                    plan.error = exc
                plan.outcome = (graphfix_outcome if graphfix else upstream_outcome)(
                    plan
                )
        finally:
            os.environ.clear()
            os.environ.update(environ)
    plan.log = records
    plan.decisions = _decisions(server_args)
    return plan


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _graph_backends(server_args) -> tuple[str, str]:
    from sglang.srt.arg_groups.overrides import resolving_view

    graph = resolving_view(server_args).cuda_graph_config
    return graph.prefill.backend, graph.decode.backend


def _prefill_graph_turned_off(server_args, with_graphfix: bool = False) -> str | None:
    """Why sglang turns the resolved prefill graph off at startup for this model
    (capture_prefill_graph's layer scan, with or without our hook on it), None
    when it does not."""
    from sglang.srt.arg_groups.overrides import model_config_of
    from sglang_graphfix.srt.full_prefill_graph_capability import (
        device_sm,
        prefill_graph_turned_off,
    )

    prefill, _ = _graph_backends(server_args)
    return prefill_graph_turned_off(
        model_config_of(server_args), prefill, device_sm(), with_graphfix=with_graphfix
    )


def _runs(server_args, with_graphfix: bool = False) -> Outcome:
    prefill, decode = _graph_backends(server_args)
    off = _prefill_graph_turned_off(server_args, with_graphfix)
    if off:
        return Outcome(
            True,
            f"runs: every prefill eager (sglang turns the {prefill} prefill CUDA "
            f"graph off at startup: {off}), decode CUDA graph {decode}",
        )
    return Outcome(
        True, f"runs: prefill CUDA graph {prefill}, decode CUDA graph {decode}"
    )


def _refuses(error: BaseException) -> Outcome:
    return Outcome(
        False,
        f"refuses at startup, before loading weights: {type(error).__name__}: {error}",
    )


def upstream_full_prefill_graph_failure(server_args) -> str | None:
    """How upstream sglang 0.5.23 fails to capture a full prefill graph that its
    resolution let through (None: it captures). The first prefill capture plans a
    plain extend out of graph (PrefillCudaGraphRunner.capture_one_shape ->
    init_forward_metadata_out_graph), full-attention side first:
      - a full-attention backend other than fa3/fa4/flashinfer (MHA) or fa3/fa4
        (MLA) has no extend for it;
      - then on a hybrid linear-attention model every linear backend but Inkling's
        goes to MambaAttnBackendBase._replay_metadata, which indexes the decode
        graph's per-batch-size buffers (state_indices_list[bs - 1]); the decode
        graph captures after the prefill graph, so the list is still empty."""
    from sglang.srt.arg_groups.overrides import (
        attention_backends_of,
        model_config_of,
        resolved_view,
        resolving_view,
        use_mla_backend,
    )
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang_graphfix.srt.full_prefill_graph_capability import (
        FULL_PREFILL_ATTENTION_BACKENDS,
        FULL_PREFILL_MLA_ATTENTION_BACKENDS,
        family_label,
    )

    if _graph_backends(server_args)[0] != Backend.FULL:
        return None
    if resolving_view(server_args).dllm_algorithm is not None:
        return None  # dLLM backends plan their own prefill-graph metadata
    attention, _ = attention_backends_of(resolved_view(server_args))
    mla = use_mla_backend(server_args)
    capable = (
        FULL_PREFILL_MLA_ATTENTION_BACKENDS if mla else FULL_PREFILL_ATTENTION_BACKENDS
    )
    if attention is not None and attention not in capable:
        detail = (
            "ValueError: Invalid forward mode EXTEND for CUDA Graph replay"
            if attention == "triton"
            else f"the {attention} attention backend{' (MLA)' if mla else ''} plans "
            "no extend for a full prefill graph"
        )
        return f"crashes at prefill graph capture: {detail}"
    family = family_label(model_config_of(server_args))
    if family not in (None, "Inkling short-conv"):
        return (
            "crashes at prefill graph capture: IndexError: list index out of range "
            f"in HybridLinearAttnBackend._replay_metadata ({family} linear attention "
            "under a full prefill graph)"
        )
    return None


@dataclass(frozen=True)
class _DsaIndexerLora:
    """LoRA on a DSA model's indexer, as the server would build it."""

    weights_proj: bool  # an adapter slot on indexer.weights_proj
    fusion: bool  # indexer Q/K fusion folds weights_proj away
    prefill: str  # prefill CUDA graph backend
    decode: str
    prefill_cp: bool  # DSA prefill context parallelism


def dsa_indexer_lora(server_args) -> _DsaIndexerLora | None:
    """LoRA targets on a DSA model's indexer, None without any. Reads the
    conditions sglang reads: is_deepseek_dsa, --lora-target-modules normalized as
    the LoRA manager does ('all' covers the indexer's projections), the indexer
    fusion switch (Indexer.__init__: CUDA, SGLANG_DISABLE_DSA_INDEXER_FUSION,
    indexer_rope_interleave) and DSA prefill context parallelism (attn_cp_size)."""
    from sglang.srt.arg_groups.overrides import model_config_of, resolved_view
    from sglang.srt.configs.model_config import is_deepseek_dsa
    from sglang.srt.environ import envs
    from sglang.srt.lora.utils import (
        DSA_INDEXER_LORA_NAMES,
        get_normalized_target_modules,
    )

    hf_config = model_config_of(server_args).hf_config
    view = resolved_view(server_args)
    if not (
        is_deepseek_dsa(hf_config) and view.enable_lora and view.lora_target_modules
    ):
        return None  # without --lora-target-modules the adapters decide at load
    targets = get_normalized_target_modules(view.lora_target_modules)
    if "all" in targets:
        targets = set(DSA_INDEXER_LORA_NAMES)
    if not targets & DSA_INDEXER_LORA_NAMES:
        return None
    prefill, decode = _graph_backends(server_args)
    return _DsaIndexerLora(
        weights_proj="indexer.weights_proj" in targets,
        fusion=bool(getattr(hf_config, "indexer_rope_interleave", False))
        and not envs.SGLANG_DISABLE_DSA_INDEXER_FUSION.get(),
        prefill=prefill,
        decode=decode,
        prefill_cp=view.attn_cp_size > 1,
    )


_FUSION_REFUSAL = (
    "refuses at model load: ValueError: LoRA targets the DSA indexer, which is "
    "incompatible with DSA indexer Q/K fusion (indexer_rope_interleave); set "
    "SGLANG_DISABLE_DSA_INDEXER_FUSION=1"
)


def _dsa_lora_upstream_failure(server_args) -> str | None:
    from sglang.srt.layers.attention.dsa.dsa_prefill_cuda_graph import (
        GRAPH_WEIGHTS_PROJ_LORA_ERROR,
    )
    from sglang.srt.model_executor.cuda_graph_config import Backend

    lora = dsa_indexer_lora(server_args)
    if lora is None:
        return None
    if lora.fusion:
        return _FUSION_REFUSAL
    # Indexer.forward_cuda raises under any breakable graph when weights_proj
    # carries LoRA; the graphs capture at startup, prefill first.
    phase = next(
        (
            p
            for p, b in (("prefill", lora.prefill), ("decode", lora.decode))
            if b == Backend.BREAKABLE
        ),
        None,
    )
    if lora.weights_proj and phase is not None:
        return (
            f"refuses at startup, capturing the breakable {phase} CUDA graph: "
            f"RuntimeError: {GRAPH_WEIGHTS_PROJ_LORA_ERROR}"
        )
    return None


def _dsa_lora_graphfix(server_args) -> tuple[str | None, str | None]:
    """(failure, how it runs) for LoRA on a DSA indexer with sglang-graphfix."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang_graphfix.srt.layers.attention.dsa.dsa_indexer import (
        BREAKABLE_DECODE_LORA_ERROR,
        BREAKABLE_PREFILL_LORA_ERROR,
    )

    lora = dsa_indexer_lora(server_args)
    if lora is None:
        return None, None
    if lora.fusion:
        return _FUSION_REFUSAL, None
    if not lora.weights_proj:
        return None, None
    if lora.prefill == Backend.BREAKABLE and lora.prefill_cp:
        return (
            "refuses at startup, capturing the breakable prefill CUDA graph: "
            f"RuntimeError: {BREAKABLE_PREFILL_LORA_ERROR}",
            None,
        )
    if lora.decode == Backend.BREAKABLE:
        return (
            "refuses at startup, capturing the breakable decode CUDA graph: "
            f"RuntimeError: {BREAKABLE_DECODE_LORA_ERROR.format(mode='DECODE')}",
            None,
        )
    if lora.prefill == Backend.BREAKABLE:
        return None, (
            "weights_proj LoRA applied in the DSA indexer split op's head gate "
            "under the breakable prefill graph"
        )
    return None, None


def upstream_outcome(plan: Plan) -> Outcome:
    """What upstream sglang 0.5.23 does: its resolution's refusal, else the
    capture or load failure its resolved arguments lead to, else it runs."""
    if plan.error is not None:
        return _refuses(plan.error)
    if _prefill_graph_turned_off(plan.server_args):
        return _runs(plan.server_args)  # no prefill graph captured, none fails
    failure = upstream_full_prefill_graph_failure(
        plan.server_args
    ) or _dsa_lora_upstream_failure(plan.server_args)
    return Outcome(False, failure) if failure else _runs(plan.server_args)


def graphfix_outcome(plan: Plan) -> Outcome:
    """What sglang 0.5.23 does with sglang-graphfix: its resolution decides the
    full prefill graph (refusing or downgrading what cannot capture), so only
    the DSA indexer LoRA paths it does not cover fail later."""
    from sglang.srt.arg_groups.overrides import model_config_of
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang_graphfix.srt.full_prefill_graph_capability import (
        MAMBA2_FAMILY,
        full_prefill_graph_support,
        mamba_mixer_of_config,
    )

    if plan.error is not None:
        return _refuses(plan.error)
    args = plan.server_args
    failure, lora = _dsa_lora_graphfix(args)
    if failure:
        return Outcome(False, failure)
    runs = _runs(args, with_graphfix=True)
    notes = [lora] if lora else []
    if _graph_backends(args)[0] == Backend.FULL:
        support = full_prefill_graph_support(args)
        if support.linear_attention in ("GDN", "KDA"):
            notes.append(
                f"{support.linear_attention} extend captured in the full prefill graph "
                f"(prefill kernel {support.linear_prefill_kernel})"
            )
        elif support.linear_attention == MAMBA2_FAMILY:
            mixer = mamba_mixer_of_config(model_config_of(args))
            notes.append(
                "short-conv extend (sglang's conv kernel) captured in the full "
                "prefill graph"
                if mixer == "lfm2"
                else "Mamba2 extend (MambaMixer2) captured in the full prefill graph"
            )
    return Outcome(True, runs.text + "".join(f"; {n}" for n in notes))


def _shown(record: logging.LogRecord) -> bool:
    # WARNING and above, plus upstream's INFO-level prefill-graph decisions.
    return record.levelno >= logging.WARNING or (
        record.name.endswith("cuda_graph_hook") and record.levelno >= logging.INFO
    )


def _request_buckets_line(args, model_config, slots: int, buckets) -> str:
    """The plan's request buckets of a Mamba2 full prefill graph, as the runner's
    capture_request_bucket_graphs picks them (counts below the slots and a
    token bucket's tokens, for token buckets up to REQUEST_BUCKET_MAX_TOKENS;
    one slot above, up to MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS),
    or an empty line. ``slots``: the runner's request slots before sglang caps
    them at the request pool (--max-running-requests, where set, is applied)."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    if capability.mamba_mixer_of_config(model_config) != "mamba2":
        return ""
    view = resolving_view(args)
    if view.max_running_requests:
        slots = min(slots, view.max_running_requests)
    # As the runner's: only request buckets that hold sglang's capture batch.
    context = getattr(model_config, "context_len", None)
    per_bucket = {
        b: capability.mamba2_request_buckets(b, slots, context) for b in buckets
    }
    bound = capability.REQUEST_BUCKET_MAX_TOKENS
    captured = [b for b, counts in per_bucket.items() if counts]
    largest = max((b for b in captured if b <= bound), default=None)
    single = max((b for b in captured if b > bound), default=None)
    if largest is None and single is None:
        return ""
    if (view.attn_dp_size or 1) > 1:
        return (
            "request buckets     none under DP attention: the runner captures "
            "them only without it"
        )
    parts = []
    if largest is not None:
        counts = per_bucket[largest]
        parts.append(
            f"token buckets up to {largest} also have graphs over "
            + "/".join(map(str, counts))
            + (" request slot" if counts == (1,) else " request slots")
            + " (those below the "
            f"bucket's tokens); a batch of fewer requests than the {slots} slots "
            "replays the smallest that holds it (MAMBA2_REQUEST_BUCKETS_CAPTURED)"
        )
    if single is not None:
        parts.append(
            f"token buckets above {bound} up to {single} also have a graph over "
            "1 request slot, which a batch of one request replays "
            "(MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS)"
        )
    return "request buckets     " + "; ".join(parts)


def _long_prefill_line(args, model_config, buckets) -> str:
    """The plan's long-prefill routing of a Mamba2 full prefill graph
    (MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST, as the runner's
    route_long_mamba2_prefills_eager applies it), or an empty line (also where
    no batch the token ``buckets`` hold can exceed it, as the runner logs)."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    limit = capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST
    if (
        not capability.mamba2_graph_routes_long_prefills(max(buckets, default=0))
        or capability.mamba_mixer_of_config(model_config) != "mamba2"
    ):
        return ""
    if (resolving_view(args).attn_dp_size or 1) > 1:
        return (
            "long prefills       not routed under DP attention: the runner applies "
            "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST only without it (DP ranks must "
            "agree on graph or eager)"
        )
    return (
        f"long prefills       a batch of more than {limit} new tokens per request "
        "on average runs eager (MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST)"
    )


def _buckets(sizes) -> str:
    return f"{min(sizes)}..{max(sizes)} ({len(sizes)})" if sizes else "none"


def _wrapper(indent: int) -> textwrap.TextWrapper:
    return textwrap.TextWrapper(
        width=100,
        subsequent_indent=" " * indent,
        break_on_hyphens=False,
        break_long_words=False,
    )


UPSTREAM_LABEL = "upstream sglang {version}:"
GRAPHFIX_LABEL = "with sglang-graphfix:"


def render(
    upstream: Plan,
    patched: Plan | None,
    *,
    state: GraphfixState,
    gpu: str,
    model_label: str,
) -> str:
    """Both outcomes side by side, then the details of the plan a server started
    here gets (with sglang-graphfix when sglang applies it, else upstream's)."""
    import sglang_graphfix
    from sglang.srt.arg_groups.overrides import (
        attention_backends_of,
        model_config_of,
        resolved_view,
        resolving_view,
    )
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang_graphfix.srt.arg_groups.cuda_graph_hook import (
        ROUTE_SOURCE,
        sglang_full_prefill_slots,
    )
    from sglang_graphfix.srt.full_prefill_graph_capability import (
        full_prefill_graph_support,
    )

    spec = GPUS[gpu]
    version = sglang_graphfix.installed_sglang()
    here = patched if state.applied and patched is not None else upstream
    if state.applied:
        first = "sglang-graphfix: active, a server started here gets the plan 'with sglang-graphfix'"
    else:
        first = (
            f"sglang-graphfix: {state.why}; a server started here gets upstream's plan"
        )
    lines = [
        first,
        f"sglang {version}, as on an {spec.name} (sm{spec.sm}, "
        f"{spec.memory_mib / 1024:.0f} GiB; simulated, no GPU used)",
    ]
    args = here.server_args
    support = None
    try:
        arch = model_config_of(args).hf_config.architectures[0]
        with simulated_gpu(gpu):  # the kernels sglang would pick on that GPU
            support = full_prefill_graph_support(args)
    except Exception:  # the model config itself failed: the error says why
        arch = "?"
    lines.append(f"model      {arch}  ({model_label})")
    if support is not None:
        prefill, decode = attention_backends_of(resolved_view(args))
        linear = support.linear_attention or "none"
        if support.linear_prefill_kernel:
            linear += f" (prefill kernel {support.linear_prefill_kernel})"
        lines.append(
            f"attention  prefill {prefill or 'not chosen yet'}, "
            f"decode {decode or 'not chosen yet'}; "
            f"linear attention {linear}"
        )
    lines.append("")
    labels = [UPSTREAM_LABEL.format(version=version), GRAPHFIX_LABEL]
    width = max(map(len, labels)) + 2
    outcome_wrap = _wrapper(width)
    graphfix_text = (
        patched.outcome.text if patched is not None else f"not available ({state.why})"
    )
    for label, text in zip(labels, (upstream.outcome.text, graphfix_text)):
        lines += outcome_wrap.wrap(f"{label:<{width}}{_one_line(text)}")

    wrap = _wrapper(4)
    view = "with sglang-graphfix" if here is patched else "upstream sglang"
    lines += ["", f"plan ({view})"]
    if here.error is not None:
        lines.append("  the server refuses to start (before loading any weights):")
        lines += [
            "  " + line
            for line in wrap.wrap(f"{type(here.error).__name__}: {here.error}")
        ]
    else:
        graph = resolving_view(args).cuda_graph_config
        slots, request_slots = "", None
        if graph.prefill.backend == Backend.FULL:
            chunk = resolving_view(args).chunked_prefill_size
            request_slots = graph.prefill.full_prefill_max_req
            slots = f", request slots {request_slots}"
            if request_slots is None:
                request_slots = sglang_full_prefill_slots(chunk)
                slots = f", request slots {request_slots} (sglang's rule)"
            cap = resolving_view(args).prefill_max_requests
            if cap is not None:
                slots += f", at most {cap} requests a prefill batch"
        lines.append(
            f"  prefill CUDA graph  {graph.prefill.backend:<9} "
            f"token buckets {_buckets(graph.prefill.bs or [])}{slots}"
        )
        if request_slots and here is patched and support is not None:
            lines += [
                "  " + line
                for line in _wrapper(20).wrap(
                    _request_buckets_line(
                        args,
                        model_config_of(args),
                        request_slots,
                        graph.prefill.bs or [],
                    )
                )
            ]
            lines += [
                "  " + line
                for line in _wrapper(20).wrap(
                    _long_prefill_line(
                        args, model_config_of(args), graph.prefill.bs or []
                    )
                )
            ]
        lines.append(
            f"  decode CUDA graph   {graph.decode.backend:<9} "
            f"batch sizes {_buckets(graph.decode.bs or [])}"
        )
        if support is not None and here is patched:
            verdict = (
                "can capture here"
                if support.capable
                else "cannot capture here: " + "; ".join(support.reasons)
            )
            if any(source == ROUTE_SOURCE for source, _ in here.decisions):
                verdict += (
                    "; asked for, it runs as breakable on this model, faster here "
                    "(the warning below)"
                )
            lines += [
                "  " + line for line in wrap.wrap(f"full prefill graph  {verdict}")
            ]
    lines += ["", "decisions (sglang's resolution record, in order)"]
    width = max((len(s) for s, _ in here.decisions), default=0)
    lines += [f"  {s:<{width}}  {d}" for s, d in here.decisions] or ["  none"]
    shown = [r for r in here.log if _shown(r)]
    lines += ["", "log (warnings, and sglang's prefill-graph decisions)"]
    for r in shown:
        lines += [
            "  " + line
            for line in wrap.wrap(f"{r.levelname:<8} {r.name}: {r.getMessage()}")
        ]
    if not shown:
        lines.append("  none")
    return "\n".join(lines)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_model_path(path: str, allow_download: bool) -> None:
    """A model directory with a config.json, or a hub id with --allow-download."""
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise BadInput(f"--model-path {path}: the directory has no config.json")
        return
    if p.exists():
        raise BadInput(
            f"--model-path {path}: not a directory (give the model directory)"
        )
    if allow_download and _HUB_ID.match(path):
        return
    hub = (
        "; to read a Hugging Face Hub model's config.json, add --allow-download"
        if _HUB_ID.match(path)
        else ""
    )
    raise BadInput(f"--model-path {path}: no such directory{hub}")


def samples() -> list[str]:
    return sorted(
        p.name for p in SAMPLE_CONFIGS.iterdir() if (p / "config.json").exists()
    )


def _parser() -> argparse.ArgumentParser:
    import sglang_graphfix as gf

    parser = _OneLineParser(prog="sglang-graphfix", allow_abbrev=False)
    parser.add_argument(
        "--version",
        action="version",
        version=f"sglang-graphfix {gf.graphfix_version()} (sglang {gf.installed_sglang()} "
        f"found; supports sglang {gf.SUPPORTED_SGLANG})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "status",
        add_help=False,  # its own flags: sglang_graphfix.status
        help="what sglang-graphfix does in an sglang process started here; exit 1 "
        "if any patch is missing",
    )
    explain = commands.add_parser(
        "explain",
        allow_abbrev=False,
        help="what sglang does with a model and flags, upstream and with "
        "sglang-graphfix, and its CUDA-graph plan (no GPU needed)",
        description=(
            "Resolve sglang's server arguments as sglang does at launch, with the "
            "plugins it loads, as on the chosen GPU: once as upstream sglang, once "
            "with sglang-graphfix. Print what each does (runs, refuses, or fails "
            "at graph capture), then the prefill/decode CUDA-graph plan a server "
            "started here gets and every decision and warning on the way. Any "
            "other flag goes to sglang's server parser (see sglang serve --help), "
            "e.g. --cuda-graph-backend-prefill full --attention-backend triton."
        ),
    )
    explain.add_argument(
        "--model-path",
        "--model",
        dest="model_path",
        help="model directory (its config.json is read; no weights)",
    )
    explain.add_argument(
        "--sample",
        choices=samples(),
        default=DEFAULT_SAMPLE,
        help="sample config shipped with sglang-graphfix, used without --model-path",
    )
    explain.add_argument(
        "--gpu",
        choices=sorted(GPUS),
        default="h200",
        help="the GPU whose probes sglang's resolution reads, simulated (default h200)",
    )
    explain.add_argument(
        "--allow-download",
        action="store_true",
        help="let a Hugging Face Hub id as --model-path download its config.json "
        "(otherwise nothing is downloaded)",
    )
    return parser


def explain(args, sglang_argv: list[str]) -> int:
    """Exit status: 0 when a server started here runs, 1 when it would refuse
    or fail at startup."""
    if args.model_path:
        check_model_path(args.model_path, args.allow_download)
        model, label = args.model_path, args.model_path
    else:
        model = str(SAMPLE_CONFIGS / args.sample)
        label = f"sample config {args.sample!r}: {model}"
    if not args.allow_download:
        # Before huggingface_hub reads them at import: no request, no retry.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    argv = ["--model-path", model, *sglang_argv]
    state = graphfix_state()
    # Upstream first: in a fresh process nothing is patched yet.
    upstream = resolve(argv, gpu=args.gpu, graphfix=False)
    patched = resolve(argv, gpu=args.gpu) if state.available else None
    print(render(upstream, patched, state=state, gpu=args.gpu, model_label=label))
    here = patched if state.applied and patched is not None else upstream
    return 0 if here.outcome.runs else 1


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")  # import-time notices of sglang's quant modules
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        args, rest = _parser().parse_known_args(words)
        if args.command == "explain":
            return explain(args, rest)
        if args.command == "status":
            from sglang_graphfix import status

            return status.main(rest)
        raise BadInput(f"unrecognized arguments: {' '.join(rest)}")
    except BadInput as exc:
        command = " explain" if "explain" in words else ""
        print(
            f"sglang-graphfix{command}: error: {_one_line(exc)} "
            f"(see sglang-graphfix{command} --help)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
