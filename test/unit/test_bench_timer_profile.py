"""benchmark/timer/graphfix_bench_timer.py's profiling mode on CPU: the real plugin
registered on the real ModelRunner, with a stand-in forward (CPU matmuls) and
torch.cuda.synchronize a no-op; torch.profiler runs for real (its CUDA activity
disables itself without a GPU). The GPU side of the reduction (kernel time, busy
union) runs on hand-made FunctionEvents."""

import importlib.util
import json
import re
import sys
import types
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from sglang.srt.model_executor.model_runner import ModelRunner

ROOT = Path(__file__).resolve().parents[2]
# Loaded from its file, not through sys.path: the plugin's folder holds its
# dist-info, and on sys.path every other test's sglang would load the plugin
# through its entry point.
_spec = importlib.util.spec_from_file_location(
    "graphfix_bench_timer", ROOT / "benchmark" / "timer" / "graphfix_bench_timer.py"
)
timer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timer)

LONG = "x" * 120  # a record_function name longer than the summary keeps


class Work:
    """A marker target: two matmuls."""

    def step(self, a):
        return (a @ a) @ a


def _batch(bs, tokens, extend=True):
    return types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(is_extend=lambda: extend),
        batch_size=bs,
        input_ids=torch.zeros(tokens, dtype=torch.long),
    )


def _stand_in_forward(self, forward_batch, *args, **kwargs):
    a = torch.randn(64, 64)
    Work().step(a)
    with torch.autograd.profiler.record_function(LONG):
        a @ a
    return types.SimpleNamespace(can_run_graph=forward_batch.batch_size == 1)


@pytest.fixture
def keep_model_runner(monkeypatch):
    """register() patches ModelRunner: restored after the test."""
    init_calls = []
    monkeypatch.setattr(ModelRunner, "forward", _stand_in_forward)
    monkeypatch.setattr(
        ModelRunner, "init_cuda_graphs", lambda self, *a, **k: init_calls.append(a)
    )
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return init_calls


@pytest.fixture
def marker_target(monkeypatch):
    module = types.ModuleType("bench_marker_target")
    module.Work = Work
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(Work, "step", Work.step)  # install_markers replaces it
    monkeypatch.setattr(
        timer,
        "MARKERS",
        (
            ("work", "bench_marker_target:Work.step"),
            ("gone", "bench_marker_target:Work.missing"),
        ),
    )


def test_profiled_windows_per_key(
    tmp_path, monkeypatch, keep_model_runner, marker_target
):
    lines_path, profile_dir = tmp_path / "forwards.txt", tmp_path / "profile"
    monkeypatch.setenv("GRAPHFIX_BENCH_TIMER", str(lines_path))
    monkeypatch.setenv(timer.PROFILE_ENV, str(profile_dir))
    monkeypatch.setenv(timer.SKIP_ENV, "2")
    monkeypatch.setenv(timer.COUNT_ENV, "3")
    original_init = ModelRunner.init_cuda_graphs
    timer.register()
    assert profile_dir.is_dir()
    # The empty profiler session runs before the capture, then the capture.
    ModelRunner.init_cuda_graphs(None)
    assert keep_model_runner == [()]
    assert ModelRunner.init_cuda_graphs.__wrapped__ is original_init

    # Key (1, 64): 2 skipped, 3 profiled, 1 after the window; key (4, 256): 2
    # skipped, 1 profiled (window incomplete); a decode forward: untimed.
    for bs, tokens in [(1, 64)] * 3 + [(4, 256)] * 3 + [(1, 64)] * 3:
        ModelRunner.forward(None, _batch(bs, tokens))
    ModelRunner.forward(None, _batch(1, 1, extend=False))
    assert timer._Active.on is False

    lines = lines_path.read_text().splitlines()
    assert len(lines) == 9
    assert all(re.fullmatch(r"\d+ \d+ [01] \d+\.\d{4}", line) for line in lines)
    ms = {1: [], 4: []}
    for line in lines:
        bs, _, _, t = line.split()
        ms[int(bs)].append(float(t))

    (path,) = profile_dir.glob("profile_*.json")
    data = json.loads(path.read_text())
    assert data["markers_installed"] == ["work"]
    assert [m.split()[0] for m in data["markers_missing"]] == ["gone"]
    assert data["errors"] == []
    windows = {(w["batch_size"], w["tokens"]): w for w in data["windows"]}
    assert set(windows) == {(1, 64), (4, 256)}

    a, b = windows[(1, 64)], windows[(4, 256)]
    assert (a["complete"], a["forwards_profiled"], a["graph_forwards"]) == (True, 3, 3)
    assert (b["complete"], b["forwards_profiled"], b["graph_forwards"]) == (False, 1, 0)
    assert a["wall_ms"] == pytest.approx(sorted(ms[1][2:5])[1], abs=1e-4)
    assert a["wall_ms_unprofiled"] == pytest.approx(ms[1][1], abs=1e-4)
    assert b["wall_ms"] == pytest.approx(ms[4][2], abs=1e-4)
    assert a["unprofiled_forwards"] == b["unprofiled_forwards"] == 1

    # CPU only: no device time, the GPU idle the whole forward.
    assert (a["device_ms"], a["device_busy_ms"], a["device_ops_per_forward"]) == (
        0,
        0,
        0,
    )
    assert a["gpu_idle_fraction"] == 1.0 and a["top_kernels"] == []
    ops = {op["name"]: op for op in a["top_cpu_ops"]}
    assert ops["aten::mm"]["calls"] == 3.0 and ops["aten::mm"]["self_ms"] > 0
    assert ops["x" * 77 + "..."]["calls"] == 1.0
    assert len(a["top_cpu_ops"]) <= timer.TOP_CPU_OPS
    # The marker: once per forward, inclusive (its own Python time, listed as an
    # op, plus its two matmuls), inside the host time the profiled ops cover.
    work, own = a["markers_ms"]["work"], ops[timer.MARKER_PREFIX + "work"]
    assert work["calls"] == own["calls"] == 1.0
    assert 0 < own["self_ms"] < work["ms"] < a["host_ops_ms"]
    assert a["host_ops_ms"] == pytest.approx(
        sum(op["self_ms"] for op in a["top_cpu_ops"]), abs=1e-3
    )
    # Outside a window the marker only forwards the call.
    assert Work().step(torch.eye(2)).equal(torch.eye(2))

    merged = timer.read_profiles(profile_dir)
    assert len(merged["windows"]) == 2 and merged["errors"] == []


def test_unset_profile_env_installs_nothing(tmp_path, monkeypatch, keep_model_runner):
    monkeypatch.delenv(timer.PROFILE_ENV, raising=False)
    monkeypatch.delenv("GRAPHFIX_BENCH_TIMER", raising=False)
    forward, init = ModelRunner.forward, ModelRunner.init_cuda_graphs
    timer.register()
    assert (ModelRunner.forward, ModelRunner.init_cuda_graphs) == (forward, init)

    monkeypatch.setenv("GRAPHFIX_BENCH_TIMER", str(tmp_path / "forwards.txt"))
    timer.register()
    assert ModelRunner.forward is not forward
    assert ModelRunner.init_cuda_graphs is init
    ModelRunner.forward(None, _batch(2, 32))
    assert (tmp_path / "forwards.txt").read_text().startswith("2 32 0 ")
    assert list(tmp_path.iterdir()) == [tmp_path / "forwards.txt"]


def _event(name, start, end, device=DeviceType.CUDA, **kwargs):
    return FunctionEvent(
        id=0,
        name=name,
        thread=0,
        start_us=start,
        end_us=end,
        device_type=device,
        use_device="cuda",
        **kwargs,
    )


def test_device_time_is_kernels_and_busy_is_their_union():
    events = [
        _event("gemm", 0, 10, activity_type="kernel"),
        _event("gemm", 5, 15, activity_type="kernel"),  # another stream, overlapping
        _event("Memcpy HtoD", 20, 25, activity_type="gpu_memcpy"),
        _event(
            "bench::x",
            0,
            30,
            activity_type="gpu_user_annotation",
            is_user_annotation=True,
        ),
        _event("aten::mm", 0, 40, device=DeviceType.CPU, activity_type="cpu_op"),
    ]
    stats = timer.forward_stats(events)
    assert stats["device_us"] == {"gemm": 20, "Memcpy HtoD": 5}
    assert stats["device_busy_us"] == 20
    assert stats["cpu_self_us"] == {"aten::mm": 40}

    s = timer.summarize([stats, stats], [0.1, 0.1], [True, True], [0.08])
    assert (s["device_ms"], s["device_busy_ms"]) == (0.025, 0.02)
    assert s["gpu_idle_fraction"] == pytest.approx(0.8)
    assert s["gpu_idle_fraction_unprofiled"] == pytest.approx(0.75)
    assert s["top_kernels"][0] == {"name": "gemm", "ms": 0.02, "calls": 2.0}
    assert s["host_ops_ms"] == 0.04 and s["device_ops_per_forward"] == 3.0
    # Every device op, longest first, whatever TOP_KERNELS keeps.
    assert s["kernels"] == {"gemm": [0.02, 2.0], "Memcpy HtoD": [0.005, 1.0]}


def test_all_device_ops_sum_names_cut_alike():
    long_a, long_b = "k" * 100 + "a", "k" * 100 + "b"  # cut to the same name
    dev = Counter({long_a: 3000, long_b: 1000, "short": 8000})
    calls = Counter({long_a: 2, long_b: 2, "short": 4})
    ops = timer._all_device_ops(dev, calls, 2)
    assert ops == {"short": [4.0, 2.0], "k" * 77 + "...": [2.0, 2.0]}
