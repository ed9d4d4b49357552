"""benchmark/trace_summary.py on hand-made torch-profiler traces laid out as
serving_prefill_graph.py --profile leaves them (and on one torch's profiler
wrote around sglang's own step spans), and benchmark/profile_diff.py on
its output (device ops and the CUDA runtime's calls)."""

import gzip
import json
import types

from benchmark_modules import load_benchmark


def _trace(folder, events):
    folder.mkdir(parents=True)
    with gzip.open(folder / "host-TP-0.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)


def _kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def _report(path, mode, events, requests, ttft, profiled_ttft):
    slug = "1_x_2048_tokens"
    _trace(path / "logs" / f"profile_{mode}" / slug / "1733.2", events)
    label = "1 x 2048 tokens"
    path.joinpath("serving_prefill_graph.json").write_text(
        json.dumps(
            {
                "model": "nemotron-h-8b",
                "modes": {
                    mode: {
                        "runs": {label: {"median_ttft_ms": ttft}},
                        "profiled": {
                            label: {
                                "completed": requests,
                                "median_ttft_ms": profiled_ttft,
                                "trace_dir": f"profile_{mode}/{slug}",
                            }
                        },
                    }
                },
            }
        )
    )
    return path / "serving_prefill_graph.json"


def test_per_request_device_and_host_time_of_two_servers(tmp_path, capsys):
    """Per request: device ops by name, the union of their intervals (overlap
    counted once), and the CUDA runtime's calls; CPU ops are not counted; two
    reports of one mode are told apart by their folders; profile_diff reads
    both tables."""
    summary = load_benchmark("trace_summary")
    diff = load_benchmark("profile_diff")
    full = _report(
        tmp_path / "full_bound_0",
        "full",
        [
            _kernel("conv", 0, 100),
            _kernel("conv", 50, 100),  # overlaps the first: busy 150 us, not 200
            _kernel("memcpy", 1000, 50, cat="gpu_memcpy"),
            _kernel("cudaStreamSynchronize", 0, 4000, cat="cuda_runtime"),
            _kernel("cuLaunchKernelEx", 0, 8, cat="cuda_driver"),  # Triton's launch
            _kernel("aten::mm", 0, 9000, cat="cpu_op"),
        ],
        requests=2,
        ttft=80.0,
        profiled_ttft=90.0,
    )
    other = _report(
        tmp_path / "full_bound_1536",
        "full",
        [
            _kernel("conv", 0, 100),
            _kernel("cudaLaunchKernel", 0, 10, cat="cuda_runtime"),
        ],
        requests=1,
        ttft=66.0,
        profiled_ttft=70.0,
    )
    profile = summary.served_profiles([full, other])
    servers = profile["models"]["nemotron-h-8b"]
    assert set(servers) == {"full", "full (full_bound_1536)"}
    run = servers["full"]["1 x 2048 tokens"]
    assert run["kernels"] == {"conv": [0.1, 1.0], "memcpy": [0.025, 0.5]}
    assert run["device_busy_ms"] == 0.1  # (150 + 50) us over 2 requests
    assert run["device_ops_per_forward"] == 1.5
    assert run["host_runtime"] == {
        "cudaStreamSynchronize": [2.0, 0.5],
        "cuLaunchKernelEx": [0.004, 0.5],
    }
    assert (run["wall_ms"], run["wall_ms_unprofiled"]) == (90.0, 80.0)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    diff.main([str(path), "--a", "full", "--b", "full (full_bound_1536)"])
    out = capsys.readouterr().out
    assert "wall ms (profiled): 90.0 vs 70.0" in out
    assert "conv" in out and "cudaStreamSynchronize" not in out
    diff.main(
        [str(path), "--a", "full", "--b", "full (full_bound_1536)", "--ops", "host_runtime"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "cudaStreamSynchronize" in out and "cudaLaunchKernel" in out


def test_a_profiled_run_without_a_trace_is_an_error(tmp_path):
    """No trace where the report says (the profiler never started), or a
    profiled run that failed: an error, not a summary of zeros."""
    import pytest

    summary = load_benchmark("trace_summary")
    report = _report(tmp_path / "a", "full", [_kernel("conv", 0, 100)], 1, 60.0, 61.0)
    for trace in (tmp_path / "a" / "logs").rglob("*.trace.json.gz"):
        trace.unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.trace.json"):
        summary.served_profiles([report])
    data = json.loads(report.read_text())
    data["modes"]["full"]["profiled"]["1 x 2048 tokens"]["error"] = "server gone"
    report.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="server gone"):
        summary.served_profiles([report])


def _event(cat, name, ts, dur, correlation=None, tid=1):
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7}
    event["tid"] = tid
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


def test_each_prefill_forward_splits_into_host_and_what_it_launched(tmp_path, capsys):
    """sglang's step[EXTEND ...] span per forward: its host time, the device ops
    its own runtime calls launched (by correlation id; not another thread's, not
    a decode step's), their span and union, and the time to its cudaGraphLaunch
    for a replay; medians over the forwards, in profile_diff's output."""
    summary = load_benchmark("trace_summary")
    diff = load_benchmark("profile_diff")
    events = [
        # An eager forward: two launches, kernels overlapping, 3 ms on the host.
        _event("user_annotation", "step[EXTEND bs=1 toks=2048]", 0, 3000),
        _event("cuda_runtime", "cudaLaunchKernel", 100, 10, correlation=1),
        _event("cuda_driver", "cuLaunchKernelEx", 200, 10, correlation=2),
        _event("kernel", "gemm", 500, 1000, correlation=1),
        _event("kernel", "scan", 1200, 600, correlation=2),  # busy 1300, span 1300
        # Another thread's launches inside the span, a graph's among them: not
        # this forward's.
        _event("cuda_runtime", "cudaLaunchKernel", 300, 10, correlation=3, tid=2),
        _event("kernel", "other", 2000, 5000, correlation=3),
        _event("cuda_runtime", "cudaGraphLaunch", 400, 10, correlation=6, tid=2),
        # A replay: the graph launched 800 us after the forward's start.
        _event("user_annotation", "step[EXTEND bs=1 toks=16]", 10000, 1000),
        _event("cuda_runtime", "cudaGraphLaunch", 10800, 20, correlation=4),
        _event("kernel", "gemm", 10900, 400, correlation=4),
        _event("kernel", "scan", 11400, 100, correlation=4),  # busy 500, span 600
        # A third forward, eager, 8 ms on the host and 5 ms on the device.
        _event("user_annotation", "step[EXTEND bs=1 toks=4096]", 12000, 8000),
        _event("cuda_runtime", "cudaLaunchKernel", 12100, 10, correlation=7),
        _event("kernel", "gemm", 12200, 5000, correlation=7),
        # A decode step is not a prefill forward, nor is what it launched.
        _event("user_annotation", "step[DECODE bs=1]", 20000, 500),
        _event("cuda_runtime", "cudaGraphLaunch", 20100, 20, correlation=5),
        _event("kernel", "decode", 20200, 9000, correlation=5),
    ]
    forwards = summary.prefill_forwards(events)
    assert forwards == {
        "prefill_forwards": 3,
        "graph_forwards": 1,
        "with_device_ops": 3,
        "host_ms": 3.0,  # median of 3, 1 and 8 (the mean would be 4)
        "device_span_ms": 1.3,  # of 1.3, 0.6 and 5
        "device_busy_ms": 1.3,  # of 1.3, 0.5 and 5
        "graph_launch_ms": 0.8,
    }
    assert summary.prefill_forwards([_kernel("conv", 0, 10)]) == {}
    # A forward whose launches left no device op in the trace: no device time.
    lost = summary.prefill_forwards(events[:3])
    assert (lost["with_device_ops"], lost["device_span_ms"]) == (0, None)
    full = _report(tmp_path / "a", "full", events, 3, 60.0, 61.0)
    other = _report(tmp_path / "b", "breakable", events[:8], 1, 70.0, 71.0)
    profile = summary.served_profiles([full, other])
    servers = profile["models"]["nemotron-h-8b"]
    assert servers["full"]["1 x 2048 tokens"]["forwards"] == forwards
    assert (
        servers["breakable"]["1 x 2048 tokens"]["forwards"]["graph_launch_ms"] is None
    )
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    diff.main([str(path)])
    out = capsys.readouterr().out
    assert "prefill forwards: 3 (1 replayed) vs 1 (0 replayed)" in out
    assert "per prefill forward, host ms: 3.0 vs 3.0" in out
    assert "per prefill forward, graph launched after ms: 0.8 vs None" in out


def test_correlation_ids_are_matched_within_one_rank_s_trace(tmp_path):
    """Two ranks' traces (sglang writes one per rank) reuse correlation ids: a
    forward counts only the device ops of its own trace."""
    summary = load_benchmark("trace_summary")
    rank = [
        _event("user_annotation", "step[EXTEND bs=1 toks=64]", 0, 1000),
        _event("cuda_runtime", "cudaLaunchKernel", 100, 10, correlation=1),
    ]
    folder = tmp_path / "trace"
    folder.mkdir()
    for name, kernel in (("a", _event("kernel", "gemm", 200, 300, correlation=1)),
                         ("b", _event("kernel", "gemm", 200, 700, correlation=1))):  # fmt: skip
        with gzip.open(folder / f"host-TP-{name}.trace.json.gz", "wt") as f:
            json.dump({"traceEvents": [*rank, kernel]}, f)
    forwards = summary.prefill_forwards(summary.load_events(folder))
    assert forwards["prefill_forwards"] == 2
    assert forwards["device_span_ms"] == 0.5  # of 0.3 and 0.7, not 1.0 twice


def test_sglang_s_own_step_spans_in_a_real_profiler_trace(tmp_path):
    """The spans as sglang names them (build_step_span_name, through its
    profile_range) in a trace torch's profiler wrote (CPU activity only: no
    device op, so the forwards' device times are None, not 0); a decode step's
    span is not a prefill forward."""
    import torch

    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.utils.nvtx_utils import profile_range
    from sglang.srt.utils.profile_utils import build_step_span_name

    trace_summary = load_benchmark("trace_summary")
    extend = types.SimpleNamespace(
        forward_mode=ForwardMode.EXTEND, batch_size=2, extend_num_tokens=128
    )
    decode = types.SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=2)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU]
    ) as profiler:
        for forward_id, batch in enumerate((extend, decode, extend, extend)):
            with profile_range(build_step_span_name(batch, forward_id=forward_id)):
                torch.randn(64, 64) @ torch.randn(64, 64)
    folder = tmp_path / "trace"
    folder.mkdir()
    profiler.export_chrome_trace(str(folder / "host-TP-0.trace.json"))
    forwards = trace_summary.prefill_forwards(trace_summary.load_events(folder))
    assert forwards["prefill_forwards"] == 3
    assert forwards["host_ms"] > 0
    assert forwards["with_device_ops"] == forwards["graph_forwards"] == 0
    assert forwards["device_span_ms"] is forwards["graph_launch_ms"] is None
