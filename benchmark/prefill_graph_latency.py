"""First-token (prefill) latency of GDN hybrids under each prefill CUDA-graph
backend: disabled (eager), breakable (sglang's default) and full (upstream
0.5.23 crashes at capture; works with sglang-graphfix installed).

Workloads: B prompts of L tokens (L in 16/64/256, B in 1/4/8), max_new_tokens=1,
radix cache off; each run WARMUP times, then REPEATS times. Two numbers each:
  forward_ms  the prefill forward inside the scheduler (ModelRunner.forward,
              device-synchronised; benchmark/timer plugin), median
  e2e_ms      engine.generate wall time (adds scheduling, sampling and IPC), median
Models:
  tiny        test/tiny_configs.py's random Qwen3-Next: 3 GDN + 1 attention layer
  qwen3-next  Qwen3-Next-80B-A3B layer dimensions (hidden 2048, 16/32 GDN heads of
              128, 512 experts top-10, attention 16/2 heads of 256), the first
              LAYERS layers, load_format="dummy" (latency only)

    python3 benchmark/prefill_graph_latency.py [--models tiny,qwen3-next] [--quick]
    python3 benchmark/prefill_graph_latency.py --plot   # PNG from the committed JSON (CPU)
    python3 benchmark/prefill_graph_latency.py --models tiny --profile
    python3 benchmark/prefill_graph_latency.py --models qwen3-next-80b-fp8 --profile [--backends full]
        [--shapes 2048x1,8192x1] [--radix]
    python3 benchmark/prefill_graph_latency.py --models falcon-h1-7b --profile --radix

Writes $OUT/prefill_graph_latency.json, else benchmark/results/prefill_graph_latency.json.

--profile: where the time of one prefill forward goes, full vs breakable. One
engine per backend runs each PROFILE_SHAPES workload PROFILE_SKIP + PROFILE_COUNT
times in a row; the timer plugin's profiling mode (GRAPHFIX_BENCH_PROFILE, see
benchmark/timer/graphfix_bench_timer.py) skips the first PROFILE_SKIP forwards of
each (batch size, tokens) and runs torch.profiler (CPU + CUDA) around each of the
next PROFILE_COUNT. Per model, backend and shape: the timer's wall ms (profiled,
and unprofiled from the skipped forwards' second half), GPU device ms (sum and
busy union), GPU-idle fraction, the inclusive host ms of record_function markers
around sglang's replay steps (load_batch, attention metadata / FlashInfer plan,
linear-attention table fill, graph replay, logits; nested), the top CPU ops by
self time, the top kernels and every device op ("kernels"; compare two backends
with benchmark/profile_diff.py). Writes $OUT/prefill_graph_profile.json, else
benchmark/results/prefill_graph_profile.json: {"provenance", "workload", "models":
{model: {backend: {"LxB": summary}}}}, and prints one line per shape.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
RESULT = "prefill_graph_latency.json"
sys.path[:0] = [
    str(ROOT / "benchmark" / "timer"),  # the timer plugin, for the engine processes
    str(ROOT / "test" / "gpu"),
    str(ROOT / "test"),
]

LENGTHS, BATCH_SIZES = (16, 64, 256), (1, 4, 8)
BUCKETS = [16, 32, 64, 128, 256, 512, 1024, 2048]
PREFILL = {
    "disabled": {"backend": "disabled"},
    "breakable": {"backend": "breakable", "bs": BUCKETS},
    "full": {"backend": "full", "bs": BUCKETS, "full_prefill_max_req": 8},
}
LAYERS = 8  # of Qwen3-Next's 48: 6 GDN + 2 attention (time budget on one H200)
PROFILE = "prefill_graph_profile.json"
PROFILE_SHAPES = ((64, 1), (256, 8))  # (prompt tokens, batch size)
# The served model's: the serving benchmark's bursts.
SERVED_SHAPES = ((16, 1), (256, 1), (256, 4), (64, 8))
PROFILE_SKIP, PROFILE_COUNT = 10, 10  # forwards per shape: skipped, then profiled
PROFILE_BACKENDS = ("full", "breakable")


def qwen3_next_dims(path: Path) -> str:
    from tiny_configs import add_qwen3_next_layout, qwen3_next_80b_a3b_config

    qwen3_next_80b_a3b_config(LAYERS).save_pretrained(path)
    add_qwen3_next_layout(path)
    return str(path)


def _engine_kwargs(model: dict, prefill: dict) -> dict:
    if model.get("served"):  # sglang's defaults but the prefill graph backend
        return {
            **model["kwargs"],
            "disable_radix_cache": True,
            "cuda_graph_config": {"prefill": {"backend": prefill["backend"]}},
        }
    return {
        **model["kwargs"],
        "attention_backend": "flashinfer",
        # The GDN kernels the full graph captures, for every backend.
        "linear_attn_prefill_backend": "triton",
        "chunked_prefill_size": BUCKETS[-1],
        "context_length": 4096,
        "cuda_graph_max_bs_decode": 8,
        "max_running_requests": 8,
        "disable_radix_cache": True,
        "cuda_graph_config": {"prefill": prefill},
    }


def measure(model: dict, prefill: dict, warmup: int, repeats: int) -> dict:
    from engine_utils import run_engine
    from graphfix_bench_timer import read_forwards
    from models import prompts

    timer = Path(tempfile.mkdtemp(prefix="graphfix-timer")) / "forwards.txt"
    batches = []
    for length in LENGTHS:
        for bs in BATCH_SIZES:
            batch = {
                "input_ids": prompts(length * 10 + bs, [length] * bs),
                "max_new_tokens": 1,
            }
            batches += [batch] * (warmup + repeats)
    results = run_engine(
        _engine_kwargs(model, prefill),
        batches,
        env={"GRAPHFIX_BENCH_TIMER": timer, **switches(model)},
    )
    forwards = read_forwards(timer)
    report, i = {}, 0
    for length in LENGTHS:
        for bs in BATCH_SIZES:
            e2e = [
                r[0]["seconds"] * 1e3
                for r in results[i + warmup : i + warmup + repeats]
            ]
            i += warmup + repeats
            runs = forwards[(bs, bs * length)][-repeats:]
            report[f"{length}x{bs}"] = {
                "e2e_ms": round(statistics.median(e2e), 3),
                "forward_ms": round(statistics.median(ms for _, ms in runs), 3)
                if runs
                else None,
                "forwards_timed": len(runs),
                "graph_forwards": sum(g for g, _ in runs),
            }
    return report


def run(models: list, quick: bool) -> None:
    warmup, repeats = (2, 5) if quick else (3, 10)
    out = Path(os.environ.get("OUT") or ROOT / "benchmark" / "results")
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "provenance": provenance(),
        "workload": f"B prompts x L tokens, max_new_tokens=1, radix cache off; median of {repeats} after {warmup} warmups",
        "models": {},
    }
    specs = _specs()
    for name in models:
        spec = specs[name]()
        entry = report["models"][name] = {
            "description": spec["description"],
            "prefill_backend": {},
        }
        for backend, cfg in PREFILL.items():  # written after each backend
            entry["prefill_backend"][backend] = measure(spec, cfg, warmup, repeats)
            (out / RESULT).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def _specs() -> dict:
    """Model name -> a function that writes the checkpoint and returns
    {"description", "kwargs"} (engine kwargs of the model)."""
    return {
        "tiny": lambda: {
            "description": "tiny random Qwen3-Next (test/tiny_configs.py): 3 GDN + 1 attention layer",
            "kwargs": {
                "model_path": _tiny(),
                "mem_fraction_static": 0.3,
                "max_total_tokens": 32768,
                "max_mamba_cache_size": 64,
            },
        },
        "qwen3-next-80b-fp8": lambda: {
            "description": "Qwen3-Next-80B-A3B's published dimensions, 48 layers, FP8 "
            "blocks as the published checkpoint, dummy weights, with sglang's defaults "
            "(attention and GDN prefill kernels, chunking, buckets, request slots) as "
            "benchmark/serving_prefill_graph.py serves it, but the radix cache off "
            "(repeated prompts; no prefix-cache state tracking); run it with "
            "SGLANG_ENABLE_JIT_DEEPGEMM=0 as the serving runs are",
            "served": True,
            "shapes": SERVED_SHAPES,
            "kwargs": {
                "model_path": _qwen3_next_80b_fp8(),
                "load_format": "dummy",
                "mem_fraction_static": 0.85,
                "context_length": 20480,
            },
        },
        "falcon-h1-7b": lambda: {
            "description": "Falcon-H1-7B's published dimensions (44 layers, Mamba2 beside "
            "attention), bfloat16, dummy weights, with sglang's defaults and "
            "--attention-backend flashinfer as benchmark/serving_prefill_graph.py serves "
            "it, but the radix cache off unless --radix (which turns on the mamba extra "
            "buffer's prefix-cache state tracking, as served)",
            "served": True,
            "shapes": SERVED_SHAPES,
            # The captured graph, which sglang-graphfix runs as breakable on this
            # model as shipped (MAMBA2_FULL_BEATS_BREAKABLE), with its request
            # buckets (MAMBA2_REQUEST_BUCKETS_CAPTURED, on as shipped since
            # 2026-12-03; not the graph of mamba2_2026-12-03's profile); the test
            # probe sets both.
            "switches": {
                "MAMBA2_FULL_BEATS_BREAKABLE": True,
                "MAMBA2_REQUEST_BUCKETS_CAPTURED": True,
            },
            "kwargs": {
                "model_path": _served_checkpoint("falcon_h1_7b"),
                "load_format": "dummy",
                "mem_fraction_static": 0.85,
                "context_length": 20480,
                "attention_backend": "flashinfer",
            },
        },
        "qwen3-next": lambda: {
            "description": f"Qwen3-Next-80B-A3B layer dimensions, first {LAYERS} of 48 layers (6 GDN + 2 attention), dummy weights",
            "kwargs": {
                "model_path": qwen3_next_dims(
                    Path(tempfile.mkdtemp(prefix="qwen3_next_dims"))
                ),
                "load_format": "dummy",
                "mem_fraction_static": 0.6,
                "max_total_tokens": 65536,
                "max_mamba_cache_size": 64,
            },
        },
    }


def switches(model: dict) -> dict:
    """Set the model's capability switches in this process (sglang.Engine
    resolves its arguments here) and return the test probe's variables that set
    them in the engine processes (test/gpu/probe, on their path via run_engine)."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    env = {}
    for name, value in model.get("switches", {}).items():
        assert value is True, (name, value)  # the probe only turns switches on
        setattr(capability, name, value)  # kept for the process's later models
        env[f"GRAPHFIX_PROBE_{name}"] = "1"
    return env


def profile_backend(
    model: dict, prefill: dict, shapes=None, radix: bool = False
) -> dict:
    """One engine: each PROFILE_SHAPES workload (or ``shapes``) PROFILE_SKIP +
    PROFILE_COUNT times in a row, the last PROFILE_COUNT forwards of each profiled
    in the scheduler. ``radix``: the radix cache on (as served: the prefix cache
    tracks linear-attention states), every repeat a new prompt so none hits it.
    Returns {"LxB": the plugin's summary}."""
    from engine_utils import run_engine
    from graphfix_bench_timer import read_profiles
    from models import prompts

    work = Path(tempfile.mkdtemp(prefix="graphfix-profile"))
    shapes = shapes or model.get("shapes", PROFILE_SHAPES)
    batches = []
    for length, bs in shapes:
        for repeat in range(PROFILE_SKIP + PROFILE_COUNT):
            # radix: a prompt no other shape or repeat draws (bs < 100 here)
            seed = length * 100_000 + bs * 1000 + repeat if radix else length * 10 + bs
            batches.append(
                {"input_ids": prompts(seed, [length] * bs), "max_new_tokens": 1}
            )
    kwargs = _engine_kwargs(model, prefill)
    if radix:
        kwargs["disable_radix_cache"] = False
    run_engine(
        kwargs,
        batches,
        env={
            "GRAPHFIX_BENCH_TIMER": work / "forwards.txt",
            "GRAPHFIX_BENCH_PROFILE": work / "profile",
            "GRAPHFIX_BENCH_PROFILE_SKIP": PROFILE_SKIP,
            "GRAPHFIX_BENCH_PROFILE_COUNT": PROFILE_COUNT,
            **switches(model),
        },
    )
    profiled = read_profiles(work / "profile")
    windows = {(w["batch_size"], w["tokens"]): w for w in profiled["windows"]}
    report = {}
    for length, bs in shapes:
        window = windows.get((bs, bs * length)) or {
            "error": f"no profiled forward of batch size {bs} x {bs * length} tokens "
            f"(profiled: {sorted(windows)}; requests split across forwards?)"
        }
        report[f"{length}x{bs}"] = {
            **window,
            "markers_missing": profiled["markers_missing"],
            "profiler_errors": profiled["errors"],
        }
    return report


def profile(
    models: list, backends=PROFILE_BACKENDS, shapes=None, radix: bool = False
) -> None:
    out = Path(os.environ.get("OUT") or ROOT / "benchmark" / "results")
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "provenance": provenance(),
        "workload": (
            "L tokens x B prompts (LxB), max_new_tokens=1, "
            + (
                "radix cache on (a new prompt each repeat); "
                if radix
                else "radix cache off; "
            )
            + f"each shape {PROFILE_SKIP + PROFILE_COUNT} times in a row, the last {PROFILE_COUNT} "
            "forwards profiled (torch.profiler CPU + CUDA, one session per forward); "
            "per-forward averages; markers_ms are inclusive host time and nest"
        ),
        "models": {},
    }
    specs = _specs()
    for name in models:
        spec = specs[name]()
        entry = report["models"][name] = {}
        for backend in backends:  # written after each backend
            entry[backend] = profile_backend(spec, PREFILL[backend], shapes, radix)
            (out / PROFILE).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    for name, entry in report["models"].items():
        for backend, shapes in entry.items():
            for shape, w in shapes.items():
                print(_profile_line(name, backend, shape, w))


def _profile_line(name: str, backend: str, shape: str, w: dict) -> str:
    if "error" in w:
        return f"{name} {backend} {shape}: {w['error']} {w['profiler_errors']}"
    markers = ", ".join(
        f"{label} {m['ms']}" for label, m in list(w["markers_ms"].items())[:6]
    )
    return (
        f"{name} {backend} {shape}: wall {w['wall_ms']} ms (unprofiled "
        f"{w['wall_ms_unprofiled']}), GPU busy {w['device_busy_ms']} ms, idle "
        f"{w['gpu_idle_fraction_unprofiled']} of unprofiled wall, host ops "
        f"{w['host_ops_ms']} ms, graph {w['graph_forwards']}/{w['forwards_profiled']}; "
        f"markers ms: {markers}"
    )


def _qwen3_next_80b_fp8() -> str:
    from serving_prefill_graph import qwen3_next_80b_a3b_fp8

    path = Path(tempfile.mkdtemp(prefix="qwen3_next_80b_fp8"))
    qwen3_next_80b_a3b_fp8(path)
    return str(path)


def _served_checkpoint(name: str) -> str:
    """A config-only checkpoint of benchmark/serving_prefill_graph.py's ``name``."""
    import serving_prefill_graph

    path = Path(tempfile.mkdtemp(prefix=name))
    getattr(serving_prefill_graph, name)(path)
    return str(path)


def _tiny() -> str:
    from models import tiny_qwen3_next

    return tiny_qwen3_next(Path(tempfile.mkdtemp(prefix="qwen3_next")))


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads((ROOT / "benchmark" / "results" / RESULT).read_text())
    models = report["models"]
    fig, axes = plt.subplots(
        1, len(models), figsize=(6 * len(models), 4), squeeze=False
    )
    for ax, (name, entry) in zip(axes[0], models.items()):
        keys = list(next(iter(entry["prefill_backend"].values())))
        width = 0.8 / len(entry["prefill_backend"])
        for j, (backend, rows) in enumerate(entry["prefill_backend"].items()):
            ax.bar(
                [k + j * width for k in range(len(keys))],
                [rows[k]["forward_ms"] or 0 for k in keys],
                width,
                label=backend,
            )
        ax.set_xticks([k + width for k in range(len(keys))], keys, rotation=45)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens x batch size")
        ax.set_ylabel("prefill forward, ms (median)")
        device = report.get("provenance", {}).get("device") or report.get("device")
        ax.set_title(f"{name} ({device})", fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "benchmark" / "results" / "prefill_graph_latency.png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,qwen3-next")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument(
        "--plot", action="store_true", help="only draw the committed JSON"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile full vs breakable prefill forwards (torch.profiler) instead",
    )
    parser.add_argument(
        "--backends",
        default=",".join(PROFILE_BACKENDS),
        help="with --profile: which prefill backends, in order (one engine each)",
    )
    parser.add_argument(
        "--shapes",
        default=None,
        help="with --profile: LxB,... (prompt tokens x prompts) instead of the "
        "model's shapes, e.g. 2048x1,4096x1,8192x1",
    )
    parser.add_argument(
        "--radix",
        action="store_true",
        help="with --profile: radix cache on, as served (a new prompt each repeat)",
    )
    args = parser.parse_args()
    if (args.shapes or args.radix) and not args.profile:
        parser.error("--shapes and --radix need --profile")
    try:
        shapes = args.shapes and [
            tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")
        ]
    except ValueError:
        parser.error(f"--shapes takes LxB,... (e.g. 4096x1,256x8), not {args.shapes!r}")
    if shapes and any(len(s) != 2 or s[1] >= 100 for s in shapes):
        parser.error(f"--shapes takes LxB,... with B < 100, not {args.shapes!r}")
    unknown = set(args.backends.split(",")) - set(PREFILL)
    if unknown or (
        args.backends != parser.get_default("backends") and not args.profile
    ):
        parser.error(f"--backends takes {', '.join(PREFILL)} and needs --profile")
    if args.plot:
        plot()
    elif args.profile:
        profile(args.models.split(","), args.backends.split(","), shapes, args.radix)
    else:
        run(args.models.split(","), args.quick)


if __name__ == "__main__":
    main()
