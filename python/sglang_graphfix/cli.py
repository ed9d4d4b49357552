# SPDX-License-Identifier: Apache-2.0
"""``sglang-graphfix explain``: the CUDA-graph plan sglang resolves for a model and
server flags, and every decision and warning on the way, without a GPU.

sglang's own resolution (``ServerArgs.resolve_once``, with the plugins sglang
loads) runs in this process; only the hardware probes it reads are answered as
on the chosen GPU (``simulated_gpu``). No model weights are read: a model
directory needs its config.json only, and without one a sample config shipped
with this package is used.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import pkgutil
import sys
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple
from unittest import mock

SAMPLE_CONFIGS = Path(__file__).resolve().parent / "sample_configs"
DEFAULT_SAMPLE = "qwen3-next"


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
        self.records: List[logging.LogRecord] = []

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
)


@dataclass
class Plan:
    """What resolution decided, or the error that stops the server."""

    server_args: object
    error: Optional[BaseException] = None
    decisions: List[Tuple[str, str]] = field(default_factory=list)
    log: List[logging.LogRecord] = field(default_factory=list)
    graphfix_active: bool = False


def _decisions(server_args) -> List[Tuple[str, str]]:
    """sglang's resolution record (``_resolved_overrides``): each declaration that
    changed a CUDA-graph backend or an attention backend, in order."""
    out, graph = [], (None, None)
    for source, fields in getattr(server_args, "_resolved_overrides", ()):
        parts = []
        config = fields.get("cuda_graph_config")
        if config is not None:
            now = (config.prefill.backend, config.decode.backend)
            if now != graph:
                parts.append(f"prefill graph {now[0]}, decode graph {now[1]}")
            graph = now
        parts += [f"{k}={fields[k]}" for k in _PLAN_FIELDS if k in fields]
        if parts:
            out.append((source, "; ".join(parts)))
    return out


def resolve(sglang_argv: List[str], gpu: str = "h200") -> Plan:
    """Parse ``sglang_argv`` with sglang's own server parser and resolve it as
    sglang does at launch (plugins loaded), as on ``gpu``."""
    import sglang_graphfix
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    with _captured_logs() as (capture, records):
        server_args = prepare_server_args(sglang_argv)
        capture()  # prepare_server_args installed its own root handler
        load_plugins()
        plan = Plan(server_args, graphfix_active=sglang_graphfix._registered)
        with simulated_gpu(gpu):
            try:
                server_args.resolve_once()
            except Exception as exc:  # what stops the server at launch
                plan.error = exc
    plan.log = records
    plan.decisions = _decisions(server_args)
    return plan


def _shown(record: logging.LogRecord) -> bool:
    # WARNING and above, plus upstream's INFO-level prefill-graph decisions.
    return record.levelno >= logging.WARNING or (
        record.name.endswith("cuda_graph_hook") and record.levelno >= logging.INFO
    )


def _buckets(sizes) -> str:
    return f"{min(sizes)}..{max(sizes)} ({len(sizes)})" if sizes else "none"


def render(plan: Plan, *, gpu: str, model_label: str) -> str:
    import sglang_graphfix
    from sglang.srt.arg_groups.overrides import (
        attention_backends_of,
        model_config_of,
        resolved_view,
        resolving_view,
    )
    from sglang_graphfix.srt.arg_groups.cuda_graph_hook import (
        full_prefill_graph_support,
    )

    spec = GPUS[gpu]
    args = plan.server_args
    wrap = textwrap.TextWrapper(
        width=100,
        subsequent_indent=" " * 4,
        break_on_hyphens=False,
        break_long_words=False,
    )
    state = "active" if plan.graphfix_active else "NOT loaded: upstream sglang's plan"
    lines = [
        f"sglang {sglang_graphfix.installed_sglang()} with sglang-graphfix ({state}), "
        f"resolved as on an {spec.name} (sm{spec.sm}, {spec.memory_mib / 1024:.0f} GiB; "
        "simulated, no GPU used)",
    ]
    support = None
    try:
        arch = model_config_of(args).hf_config.architectures[0]
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
    lines.append("plan")
    if plan.error is not None:
        lines.append("  the server refuses to start (before loading any weights):")
        lines += [
            "  " + line
            for line in wrap.wrap(f"{type(plan.error).__name__}: {plan.error}")
        ]
    else:
        graph = resolving_view(args).cuda_graph_config
        lines.append(
            f"  prefill CUDA graph  {graph.prefill.backend:<9} "
            f"token buckets {_buckets(graph.prefill.bs or [])}"
        )
        lines.append(
            f"  decode CUDA graph   {graph.decode.backend:<9} "
            f"batch sizes {_buckets(graph.decode.bs or [])}"
        )
        if support is not None:
            verdict = (
                "can capture here"
                if support.capable
                else "cannot capture here: " + "; ".join(support.reasons)
            )
            lines += [
                "  " + line for line in wrap.wrap(f"full prefill graph  {verdict}")
            ]
    lines += ["", "decisions (sglang's resolution record, in order)"]
    width = max((len(s) for s, _ in plan.decisions), default=0)
    lines += [f"  {s:<{width}}  {d}" for s, d in plan.decisions] or ["  none"]
    shown = [r for r in plan.log if _shown(r)]
    lines += ["", "log (warnings, and sglang's prefill-graph decisions)"]
    for r in shown:
        lines += [
            "  " + line
            for line in wrap.wrap(f"{r.levelname:<8} {r.name}: {r.getMessage()}")
        ]
    if not shown:
        lines.append("  none")
    return "\n".join(lines)


def samples() -> List[str]:
    return sorted(
        p.name for p in SAMPLE_CONFIGS.iterdir() if (p / "config.json").exists()
    )


def _parser() -> argparse.ArgumentParser:
    import sglang_graphfix as gf

    parser = argparse.ArgumentParser(prog="sglang-graphfix", allow_abbrev=False)
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
        help="print the CUDA-graph plan sglang resolves, and why (no GPU needed)",
        description=(
            "Resolve sglang's server arguments as sglang does at launch, with the "
            "plugins it loads, as on the chosen GPU, and print the prefill/decode "
            "CUDA-graph plan and every decision and warning on the way. Any other "
            "flag goes to sglang's server parser, e.g. --cuda-graph-backend-prefill "
            "full --attention-backend triton."
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
    explain.add_argument("--gpu", choices=sorted(GPUS), default="h200")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Exit status: 0 when the server would start, 1 when it would refuse."""
    warnings.filterwarnings("ignore")  # import-time notices of sglang's quant modules
    args, sglang_argv = _parser().parse_known_args(argv)
    if args.command == "status":
        from sglang_graphfix import status

        return status.main(sglang_argv)
    if args.model_path:
        model, label = args.model_path, args.model_path
    else:
        model = str(SAMPLE_CONFIGS / args.sample)
        label = f"sample config {args.sample!r}: {model}"
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    plan = resolve(["--model-path", model, *sglang_argv], gpu=args.gpu)
    print(render(plan, gpu=args.gpu, model_label=label))
    return 1 if plan.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
