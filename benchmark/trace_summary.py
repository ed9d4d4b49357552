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
Triton's through the driver, synchronisations, copies); "forwards", per prefill
forward (medians; sglang's own span around ModelRunner.forward under the
profiler, step[EXTEND ...]): its host time, the device time of what it launched,
and for a graph replay how long after the forward's start the graph was
launched (the host work before replay); "wall_ms", the profiled run's median
time to first token, and "wall_ms_unprofiled", the measured run's.
"""

import argparse
import bisect
import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "timer"))
from graphfix_bench_timer import busy_us  # noqa: E402  (the profiled forwards' union)

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATEGORIES = {"cuda_runtime", "cuda_driver"}  # Triton launches via the driver
# sglang's span around one ModelRunner.forward while the torch profiler runs
# (utils/profile_utils.build_step_span_name): "step[EXTEND bs=1 toks=2048]".
PREFILL_STEP = "step[EXTEND"
GRAPH_LAUNCH = "cudaGraphLaunch"  # kineto records no driver-level graph launch
TRACE = "_trace"  # load_events' tag: which trace file (rank) an event came from


def load_events(folder: Path) -> list:
    """Every complete event ("ph" X) of the traces under ``folder`` (sglang
    writes one per rank, .trace.json.gz, in a folder the client names); an
    error where there is none."""
    events, paths = [], sorted(folder.rglob("*.trace.json*"))
    if not paths:
        raise FileNotFoundError(f"no *.trace.json* under {folder}")
    for number, path in enumerate(paths):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            trace = json.load(f)
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "X":
                event[TRACE] = number  # correlation ids are per process
                events.append(event)
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


def prefill_forwards(events: list) -> dict:
    """Per prefill forward (sglang's step[EXTEND ...] span around
    ModelRunner.forward, on the scheduler's thread; the batch's ForwardBatch is
    built and its inputs copied before it, sampling after): "host_ms", the span
    (launches and waits included); "device_span_ms", first start to last end of
    the device ops that the span's own runtime calls launched (same trace, pid
    and thread; matched by the profiler's correlation ids: a replay's kernels
    carry its cudaGraphLaunch's), and "device_busy_ms", their union, both None
    for a forward whose launches the trace holds no device op of; and
    "graph_launch_ms", from the span's start to its first cudaGraphLaunch (the
    host work before a replay), for the forwards with one ("graph_forwards";
    the others ran eager). Medians over the forwards, with their counts
    ("with_device_ops": those with device ops); empty without a span (sglang
    records none outside its profiler, or without the CPU activity)."""
    spans = []
    calls = {}  # (trace, pid, tid) -> that thread's runtime calls, by start
    launched = {}  # (trace, correlation id) -> the device ops it launched
    for e in events:
        cat = e.get("cat")
        if cat == "user_annotation" and e.get("name", "").startswith(PREFILL_STEP):
            spans.append(e)
        elif cat in HOST_CATEGORIES:
            calls.setdefault((e.get(TRACE), e.get("pid"), e.get("tid")), []).append(e)
        elif cat in DEVICE_CATEGORIES:
            correlation = (e.get("args") or {}).get("correlation")
            if correlation is not None:
                launched.setdefault((e.get(TRACE), correlation), []).append(e)
    if not spans:
        return {}
    starts = {}
    for thread, thread_calls in calls.items():
        thread_calls.sort(key=lambda e: float(e["ts"]))
        starts[thread] = [float(e["ts"]) for e in thread_calls]
    rows = []
    for span in spans:
        start = float(span["ts"])
        end = start + float(span.get("dur", 0.0))
        thread = (span.get(TRACE), span.get("pid"), span.get("tid"))
        times = starts.get(thread, [])
        mine = calls.get(thread, [])[
            bisect.bisect_left(times, start) : bisect.bisect_right(times, end)
        ]
        ops = [
            op
            for c in mine
            for op in launched.get(
                (c.get(TRACE), (c.get("args") or {}).get("correlation")), ()
            )
        ]
        intervals = [(float(o["ts"]), float(o["ts"]) + float(o["dur"])) for o in ops]
        graph = next((c for c in mine if c["name"].startswith(GRAPH_LAUNCH)), None)
        rows.append(
            {
                "host_ms": (end - start) / 1000.0,
                "device_span_ms": (
                    (max(b for _, b in intervals) - min(a for a, _ in intervals))
                    / 1000.0
                    if intervals
                    else None
                ),
                "device_busy_ms": busy_us(intervals) / 1000.0 if intervals else None,
                "graph_launch_ms": (
                    (float(graph["ts"]) - start) / 1000.0 if graph else None
                ),
            }
        )

    def median(key, of=rows):
        values = [r[key] for r in of if r[key] is not None]
        return round(statistics.median(values), 4) if values else None

    graphs = [r for r in rows if r["graph_launch_ms"] is not None]
    return {
        "prefill_forwards": len(rows),
        "graph_forwards": len(graphs),
        "with_device_ops": sum(r["device_span_ms"] is not None for r in rows),
        **{key: median(key) for key in ("host_ms", "device_span_ms", "device_busy_ms")},
        "graph_launch_ms": median("graph_launch_ms", graphs),
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
                summary["forwards"] = prefill_forwards(events)
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
