"""Benchmark-only sglang plugin: times every prefill forward inside the scheduler.

With GRAPHFIX_BENCH_TIMER=<file> set, ModelRunner.forward is timed for EXTEND
batches (device synchronised before and after, so the time is the forward's GPU
work plus its launch overhead, without the scheduler and IPC around it) and one
line "batch_size tokens graph ms" is appended to the file per forward.
benchmark/prefill_graph_latency.py puts this folder on sys.path; sglang finds the
plugin through the dist-info beside it.

Profiling mode: GRAPHFIX_BENCH_PROFILE=<dir> as well (only with the timer) runs
torch.profiler (CPU + CUDA activities) around EXTEND forwards, one profiler
session per forward, started before and stopped after the timed region. Forwards
are counted per (batch size, tokens) key: for each key the first
GRAPHFIX_BENCH_PROFILE_SKIP (default 20) are skipped (warm-up; the median of the
second half of them is the unprofiled wall time), the next
GRAPHFIX_BENCH_PROFILE_COUNT (default 10) are profiled. After every profiled
forward <dir>/profile_<pid>.json is rewritten: {"pid", "skip", "count",
"markers_installed", "markers_missing", "errors", "windows": [summary per key]}, where a
summary (summarize()) holds, per profiled forward: wall ms (the timer's own
measurement, under the profiler; median), device ms (sum of GPU kernel/memcpy
time) and device busy ms (their union), GPU-idle fraction 1 - busy/wall (also
against the unprofiled wall), host ms covered by profiled CPU ops, the inclusive
CPU ms of the MARKERS (record_function ranges around sglang's replay steps:
runner.execute > load_batch > attn metadata > FlashInfer plan / linear tables;
graph replay; logits; they nest), the top CPU ops by self CPU time and the top
GPU kernels by device time. The markers are installed when the first window
opens, wrap sglang's (and sglang-graphfix's) functions found by name (missing
ones are listed, not fatal) and record only inside profiled forwards. Before the
CUDA graphs are captured an empty profiler session initialises CUPTI (torch's
workaround for profiling graphs captured before the profiler's first use). With
GRAPHFIX_BENCH_PROFILE unset nothing of this is installed.
"""

import functools
import logging
import os
import pkgutil
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

PROFILE_ENV = "GRAPHFIX_BENCH_PROFILE"
SKIP_ENV, COUNT_ENV = "GRAPHFIX_BENCH_PROFILE_SKIP", "GRAPHFIX_BENCH_PROFILE_COUNT"
TOP_CPU_OPS, TOP_KERNELS, NAME_CHARS = 25, 15, 80

_RUNNER = "sglang.srt.model_executor.runner."
_BACKEND = "sglang.srt.model_executor.runner_backend."
_ATTN = "sglang.srt.layers.attention."
# (label, "module:qualname"): record_function ranges inside profiled forwards.
MARKERS = (
    ("model_runner.prepare_eager_batch", "sglang.srt.model_executor.model_runner:ModelRunner._prepare_eager_forward_batch"),
    ("runner.execute", _RUNNER + "prefill_cuda_graph_runner:PrefillCudaGraphRunner.execute"),
    ("runner.load_batch", _RUNNER + "prefill_cuda_graph_runner:PrefillCudaGraphRunner.load_batch"),
    ("runner.fill_static_buffers", "sglang.srt.model_executor.cuda_graph_buffer_registry:CudaGraphBufferRegistry.fill_from"),
    ("runner.attn_metadata_for_replay", _RUNNER + "prefill_cuda_graph_runner:PrefillCudaGraphRunner._prepare_forward_metadata_for_replay"),
    ("hybrid.init_forward_metadata_out_graph", _ATTN + "hybrid_linear_attn_backend:HybridLinearAttnBackend.init_forward_metadata_out_graph"),
    ("hybrid.init_forward_metadata", _ATTN + "hybrid_linear_attn_backend:HybridLinearAttnBackend.init_forward_metadata"),
    ("flashinfer.init_forward_metadata_out_graph", _ATTN + "flashinfer_backend:FlashInferAttnBackend.init_forward_metadata_out_graph"),
    ("flashinfer.init_forward_metadata", _ATTN + "flashinfer_backend:FlashInferAttnBackend.init_forward_metadata"),
    ("hybrid.breakable_replay_metadata", _ATTN + "hybrid_linear_attn_backend:HybridLinearAttnBackend.prepare_forward_metadata_for_breakable_cuda_graph_replay"),
    ("gdn.init_forward_metadata", _ATTN + "linear.gdn_backend:GDNAttnBackend.init_forward_metadata"),
    ("graphfix.linear_tables", "sglang_graphfix.srt.layers.attention.hybrid_linear_attn_backend:prepare_full_prefill_graph_tables"),
    ("kda_tables.fill", _ATTN + "linear.kda_prefill_graph:KDAPrefillGraphMetadata.fill"),
    ("runner.replay_body_and_eager_tail", _RUNNER + "prefill_cuda_graph_runner:PrefillCudaGraphRunner._execute_body_capture"),
    ("graph.replay_full", _BACKEND + "full_cuda_graph_backend:FullCudaGraphBackend.replay"),
    ("graph.replay_breakable", _BACKEND + "breakable_cuda_graph_backend:BreakableCudaGraphBackend.replay"),
    ("logits_processor", "sglang.srt.layers.logits_processor:LogitsProcessor.forward"),
    ("runner.finalize_output", _RUNNER + "prefill_cuda_graph_runner:PrefillCudaGraphRunner._finalize_execute_output"),
    ("eager_runner.execute", _RUNNER + "eager_runner:EagerRunner.execute"),
)  # fmt: skip
MARKER_PREFIX = "bench::"
logger = logging.getLogger(__name__)


def read_forwards(path) -> dict:
    """The file register() writes: (batch size, tokens) -> [(graph, ms)], in order."""
    forwards = defaultdict(list)
    for line in Path(path).read_text().splitlines():
        bs, tokens, graph, ms = line.split()
        forwards[(int(bs), int(tokens))].append((bool(int(graph)), float(ms)))
    return forwards


def read_profiles(directory) -> dict:
    """What the profiling mode wrote under ``directory`` (every process):
    {"windows": [summary per (batch size, tokens)], "markers_missing": [...],
    "errors": [...]}."""
    import json

    merged = {"windows": [], "markers_missing": [], "errors": []}
    for path in sorted(Path(directory).glob("profile_*.json")):
        data = json.loads(path.read_text())
        merged["windows"] += data["windows"]
        merged["markers_missing"] += data["markers_missing"]
        merged["errors"] += data["errors"]
    return merged


def register():
    path = os.environ.get("GRAPHFIX_BENCH_TIMER")
    if not path:
        return
    import torch

    from sglang.srt.model_executor.model_runner import ModelRunner

    forward = ModelRunner.forward
    profiler = Profiler.from_env()
    if profiler is not None:
        _init_profiler_before_capture(ModelRunner)

    def timed_forward(self, forward_batch, *args, **kwargs):
        if not forward_batch.forward_mode.is_extend():
            return forward(self, forward_batch, *args, **kwargs)
        session = None
        if profiler is not None:  # outside the timed region
            session = profiler.begin(
                (forward_batch.batch_size, int(forward_batch.input_ids.shape[0]))
            )
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = forward(self, forward_batch, *args, **kwargs)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        tokens = int(forward_batch.input_ids.shape[0])
        with open(path, "a") as f:
            f.write(
                f"{forward_batch.batch_size} {tokens} {int(out.can_run_graph)} {ms:.4f}\n"
            )
        if session is not None:
            profiler.end(session, ms, bool(out.can_run_graph))
        return out

    ModelRunner.forward = timed_forward


def _init_profiler_before_capture(model_runner_cls) -> None:
    """One empty CPU + CUDA profiler session before the CUDA graphs are captured
    (torch.profiler._utils._init_for_cuda_graphs does the same with the autograd
    profiler): graphs captured before the profiler's first use may not profile."""
    init = model_runner_cls.init_cuda_graphs

    @functools.wraps(init)
    def init_cuda_graphs(self, *args, **kwargs):
        import torch
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            torch.cuda.synchronize()
        return init(self, *args, **kwargs)

    model_runner_cls.init_cuda_graphs = init_cuda_graphs


class _Active:
    """Whether a profiled forward is running (read by the marker wrappers)."""

    on = False


def install_markers(markers=None, active=_Active) -> tuple:
    """Wrap each target (default MARKERS) in a record_function range named
    MARKER_PREFIX + label, entered only while ``active.on``. Returns (installed
    labels, missing "label (target: why)")."""
    import inspect

    from torch.autograd.profiler import record_function

    installed, missing = [], []
    for label, target in MARKERS if markers is None else markers:
        module_name, _, qualname = target.partition(":")
        owner_name, _, attr = qualname.rpartition(".")
        try:
            owner = pkgutil.resolve_name(
                f"{module_name}:{owner_name}" if owner_name else module_name
            )
            current = inspect.getattr_static(owner, attr)
        except (AttributeError, ImportError, ValueError) as exc:
            missing.append(f"{label} ({target}: {type(exc).__name__}: {exc})")
            continue
        if not inspect.isfunction(current):
            missing.append(f"{label} ({target}: not a plain function)")
            continue
        name = MARKER_PREFIX + label

        def marked(*args, _fn=current, _name=name, **kwargs):
            if not active.on:
                return _fn(*args, **kwargs)
            with record_function(_name):
                return _fn(*args, **kwargs)

        setattr(owner, attr, functools.wraps(current)(marked))
        installed.append(label)
    return installed, missing


def busy_us(intervals) -> float:
    """The length of the union of (start, end) intervals: overlapping device
    ops counted once."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def forward_stats(events) -> dict:
    """One profiled forward's events (a FunctionEvent list) reduced to sums:
    CPU self time per op name, device time per kernel name, the union of the
    device intervals, and each marker's inclusive CPU time."""
    from torch.autograd import DeviceType

    cpu_self, cpu_calls = Counter(), Counter()
    dev, dev_calls = Counter(), Counter()
    markers, marker_calls = Counter(), Counter()
    intervals = []
    for e in events:
        if e.device_type == DeviceType.CPU:
            if e.is_async or e.name == "[memory]":
                continue
            cpu_self[e.name] += e.self_cpu_time_total
            cpu_calls[e.name] += 1
            if e.name.startswith(MARKER_PREFIX):
                markers[e.name[len(MARKER_PREFIX) :]] += e.cpu_time_total
                marker_calls[e.name[len(MARKER_PREFIX) :]] += 1
        elif not e.is_user_annotation and e.activity_type not in (
            "gpu_user_annotation",
            "overhead",
        ):
            start, end = e.time_range.start, e.time_range.end
            dev[e.name] += end - start
            dev_calls[e.name] += 1
            intervals.append((start, end))
    return {
        "cpu_self_us": cpu_self,
        "cpu_calls": cpu_calls,
        "device_us": dev,
        "device_calls": dev_calls,
        "device_busy_us": busy_us(intervals),
        "marker_us": markers,
        "marker_calls": marker_calls,
    }


def _name(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def summarize(stats: list, wall_ms: list, graph: list, unprofiled_ms: list) -> dict:
    """Per-forward averages of forward_stats() over the profiled forwards of one
    key, with the timer's wall times (profiled and unprofiled)."""
    n = len(stats)

    def total(field):
        out = Counter()
        for s in stats:
            out.update(s[field])
        return out

    def per_fwd_ms(us):
        return round(us / n / 1e3, 4)

    cpu, cpu_calls = total("cpu_self_us"), total("cpu_calls")
    dev, dev_calls = total("device_us"), total("device_calls")
    marker, marker_calls = total("marker_us"), total("marker_calls")
    wall = statistics.median(wall_ms)
    unprofiled = statistics.median(unprofiled_ms) if unprofiled_ms else None
    device = sum(dev.values()) / n / 1e3
    busy = sum(s["device_busy_us"] for s in stats) / n / 1e3

    def idle(w):
        return round(1 - busy / w, 4) if w else None

    return {
        "forwards_profiled": n,
        "graph_forwards": sum(graph),
        "wall_ms": round(wall, 4),
        "wall_ms_unprofiled": round(unprofiled, 4) if unprofiled else None,
        "unprofiled_forwards": len(unprofiled_ms),
        "device_ms": round(device, 4),
        "device_busy_ms": round(busy, 4),
        "gpu_idle_fraction": idle(wall),
        "gpu_idle_fraction_unprofiled": idle(unprofiled),
        "device_ops_per_forward": round(sum(dev_calls.values()) / n, 2),
        "host_ops_ms": per_fwd_ms(sum(cpu.values())),
        "markers_ms": {
            label: {"ms": per_fwd_ms(us), "calls": round(marker_calls[label] / n, 2)}
            for label, us in sorted(marker.items(), key=lambda kv: -kv[1])
        },
        "top_cpu_ops": [
            {
                "name": _name(name),
                "self_ms": per_fwd_ms(us),
                "calls": round(cpu_calls[name] / n, 2),
            }
            for name, us in cpu.most_common(TOP_CPU_OPS)
        ],
        "top_kernels": [
            {
                "name": _name(name),
                "ms": per_fwd_ms(us),
                "calls": round(dev_calls[name] / n, 2),
            }
            for name, us in dev.most_common(TOP_KERNELS)
        ],
        # Every device op (kernels and copies), for benchmark/profile_diff.py.
        "kernels": _all_device_ops(dev, dev_calls, n),
    }


def _all_device_ops(dev: Counter, dev_calls: Counter, n: int) -> dict:
    """{name: [ms, calls]} per forward of every device op, longest first; names
    cut to NAME_CHARS (ops whose cut names agree are summed)."""
    us, calls = Counter(), Counter()
    for name, total in dev.items():
        us[_name(name)] += total
        calls[_name(name)] += dev_calls[name]
    return {
        name: [round(total / n / 1e3, 4), round(calls[name] / n, 2)]
        for name, total in us.most_common()
    }


class Profiler:
    """Per-(batch size, tokens) profiling windows of EXTEND forwards."""

    def __init__(self, directory, skip: int, count: int, activities=None):
        from torch.profiler import ProfilerActivity

        self.path = Path(directory) / f"profile_{os.getpid()}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.skip, self.count = skip, count
        self.activities = activities or [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        self.seen = Counter()
        self.unprofiled = defaultdict(list)
        self.windows = defaultdict(lambda: {"stats": [], "wall": [], "graph": []})
        self.markers = None  # (installed, missing), on the first profiled forward
        self.errors = []

    @classmethod
    def from_env(cls):
        directory = os.environ.get(PROFILE_ENV)
        if not directory:
            return None
        return cls(
            directory,
            int(os.environ.get(SKIP_ENV, "20")),
            int(os.environ.get(COUNT_ENV, "10")),
        )

    def begin(self, key):
        """Before the timed region: (key, index, running profiler or None)."""
        n = self.seen[key]
        self.seen[key] += 1
        if not self.skip <= n < self.skip + self.count:
            return key, n, None
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self.markers is None:
            self.markers = install_markers()
        if ProfilerActivity.CUDA in self.activities:
            # Work queued before the forward finishes outside the session, so
            # the timed region's first synchronize waits for nothing.
            torch.cuda.synchronize()
        try:
            prof = profile(activities=self.activities)
            prof.start()
        except Exception as exc:  # a benchmark aid must not stop the engine
            logger.exception("graphfix_bench_timer: profiling %s failed", key)
            self.errors.append(f"{key}: {type(exc).__name__}: {exc}")
            return key, n, None
        _Active.on = True
        return key, n, prof

    def end(self, session, ms: float, graph: bool) -> None:
        """After the timed region: stop the profiler, reduce and write."""
        key, n, prof = session
        if prof is None:
            if self.skip // 2 <= n < self.skip:
                self.unprofiled[key].append(ms)
            return
        _Active.on = False
        try:
            prof.stop()
            stats = forward_stats(prof.events())
        except Exception as exc:  # a benchmark aid must not stop the engine
            logger.exception("graphfix_bench_timer: profiling %s failed", key)
            self.errors.append(f"{key}: {type(exc).__name__}: {exc}")
        else:
            window = self.windows[key]
            window["stats"].append(stats)
            window["wall"].append(ms)
            window["graph"].append(graph)
        self.write()

    def write(self) -> None:
        import json

        windows = []
        for (bs, tokens), w in self.windows.items():
            windows.append(
                {
                    "batch_size": bs,
                    "tokens": tokens,
                    "complete": len(w["stats"]) == self.count,
                    **summarize(
                        w["stats"], w["wall"], w["graph"], self.unprofiled[(bs, tokens)]
                    ),
                }
            )
        installed, missing = self.markers or ([], [])
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "skip": self.skip,
                    "count": self.count,
                    "markers_installed": installed,
                    "markers_missing": missing,
                    "errors": self.errors,
                    "windows": windows,
                },
                indent=1,
            )
            + "\n"
        )
        tmp.replace(self.path)
