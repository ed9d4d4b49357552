"""benchmark/trace_summary.py on hand-made torch-profiler traces laid out as
serving_prefill_graph.py --profile leaves them, and benchmark/profile_diff.py on
its output (device ops and the CUDA runtime's calls)."""

import gzip
import json

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
