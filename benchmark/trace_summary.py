"""Device and host time per request from the torch-profiler traces of served runs
(`serving_prefill_graph.py --profile LABEL`: sglang's /start_profile around one
run, after its warm-up requests), in the shape benchmark/profile_diff.py reads, so
that two servers' runs of the same prompts diff op by op:

    python3 benchmark/trace_summary.py A/serving_prefill_graph.json \
        B/serving_prefill_graph.json > served_profile.json
    python3 benchmark/profile_diff.py served_profile.json --a full --b breakable

Per server (its report's mode; "mode (folder)" where two reports have one mode)
and profiled run, divided by the run's completed requests (one prefill forward
each for one prompt at a time and one output token): "kernels", every device
op's ms and calls; "device_busy_ms", the union of device-op intervals;
"host_runtime", the CUDA runtime's and driver's calls' ms and calls (launches,
Triton's through the driver, synchronisations, copies); "wall_ms", the profiled run's median time to first token, and
"wall_ms_unprofiled", the measured run's.
"""

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "timer"))
from graphfix_bench_timer import busy_us  # noqa: E402  (the profiled forwards' union)

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATEGORIES = {"cuda_runtime", "cuda_driver"}  # Triton launches via the driver


def load_events(folder: Path) -> list:
    """Every complete event ("ph" X) of the traces under ``folder`` (sglang
    writes one per rank, .trace.json.gz, in a folder the client names); an
    error where there is none."""
    events, paths = [], sorted(folder.rglob("*.trace.json*"))
    if not paths:
        raise FileNotFoundError(f"no *.trace.json* under {folder}")
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            trace = json.load(f)
        events += [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    return events


def summarize(events: list, requests: int) -> dict:
    """Per request: device ops by name, device busy time, their count, and the
    CUDA runtime's calls by name (ms and calls)."""
    per = 1.0 / max(requests, 1)
    kernels, runtime, intervals = {}, {}, []
    for e in events:
        cat, dur = e.get("cat"), float(e.get("dur", 0.0))
        if cat in DEVICE_CATEGORIES:
            table = kernels
            intervals.append((float(e["ts"]), float(e["ts"]) + dur))
        elif cat in HOST_CATEGORIES:
            table = runtime
        else:
            continue
        ms, calls = table.get(e["name"], (0.0, 0.0))
        table[e["name"]] = (ms + dur / 1000.0, calls + 1)

    def scaled(table):
        return {
            n: [round(ms * per, 4), round(c * per, 2)] for n, (ms, c) in table.items()
        }

    return {
        "requests": requests,
        "device_busy_ms": round(busy_us(intervals) / 1000.0 * per, 4),
        "device_ops_per_forward": round(len(intervals) * per, 1),
        "kernels": scaled(kernels),
        "host_runtime": scaled(runtime),
    }


def served_profiles(report_paths: list) -> dict:
    """profile_diff's JSON from the serving reports' profiled runs."""
    model, servers = None, {}
    for path in map(Path, report_paths):
        report = json.loads(path.read_text())
        model = model or report.get("model", "served")
        for mode, entry in report["modes"].items():
            name = mode if mode not in servers else f"{mode} ({path.parent.name})"
            for label, run in (entry.get("profiled") or {}).items():
                if "error" in run:
                    raise ValueError(f"{path}: {mode} {label}: {run['error']}")
                folder = path.parent / "logs" / run["trace_dir"]
                if not folder.exists() and run.get("trace_path"):
                    folder = Path(run["trace_path"])  # a report kept elsewhere
                events = load_events(folder)
                summary = summarize(events, run.get("completed") or 1)
                summary["wall_ms"] = run.get("median_ttft_ms")
                measured = entry.get("runs", {}).get(label, {})
                summary["wall_ms_unprofiled"] = measured.get("median_ttft_ms")
                servers.setdefault(name, {})[label] = summary
    return {"models": {model: servers}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="serving_prefill_graph.json files")
    args = parser.parse_args(argv)
    json.dump(served_profiles(args.reports), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
