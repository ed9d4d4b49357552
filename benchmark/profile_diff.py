"""Where two prefill-graph backends' forwards differ, device op by device op, from
the JSON of `benchmark/prefill_graph_latency.py --profile` (each shape's "kernels":
every device op, ms and calls per forward) or of benchmark/trace_summary.py (served
runs, per request; also "host_runtime", the CUDA runtime's calls: --ops):

    python3 benchmark/profile_diff.py PROFILE.json [--a full] [--b breakable]
        [--model M] [--shape 8192x1] [--top 25] [--ops host_runtime]

Per model and shape that both backends ran: their wall, device-busy and
device-op counts per forward, then the device ops whose time differs most (a
minus b, with each side's calls), and the time of the ops only one side runs.
"""

import argparse
import json
import sys
from pathlib import Path


def op_differences(a: dict, b: dict) -> list:
    """[(name, ms_a, ms_b, calls_a, calls_b)] for every device op of either
    "kernels" map, the largest |ms_a - ms_b| first (ties: by name)."""
    rows = []
    for name in set(a) | set(b):
        ms_a, calls_a = a.get(name, (0.0, 0.0))
        ms_b, calls_b = b.get(name, (0.0, 0.0))
        rows.append((name, ms_a, ms_b, calls_a, calls_b))
    return sorted(rows, key=lambda r: (-abs(r[1] - r[2]), r[0]))


def only_one_side_ms(rows: list) -> tuple:
    """(ms of the ops only side a runs, ms of those only side b runs)."""
    only_a = sum(r[1] for r in rows if r[4] == 0)
    only_b = sum(r[2] for r in rows if r[3] == 0)
    return round(only_a, 4), round(only_b, 4)


def forward_lines(fa: dict, fb: dict) -> list:
    """trace_summary's per-prefill-forward medians of both sides, a line each
    (none where neither side has them)."""
    if not (fa or fb):
        return []

    def count(f):
        return f"{f.get('prefill_forwards')} ({f.get('graph_forwards')} replayed)"

    return [f"  prefill forwards: {count(fa)} vs {count(fb)}"] + [
        f"  per prefill forward, {label}: {fa.get(key)} vs {fb.get(key)}"
        for label, key in (
            ("host ms", "host_ms"),
            ("device span ms", "device_span_ms"),
            ("device busy ms", "device_busy_ms"),
            ("graph launched after ms", "graph_launch_ms"),
        )
    ]


def report(
    profile: dict, a: str, b: str, model=None, shape=None, top=25, ops="kernels"
) -> str:
    lines = []
    for model_name, backends in profile["models"].items():
        if (model and model_name != model) or a not in backends or b not in backends:
            continue
        for shape_name in backends[a]:
            wa, wb = backends[a][shape_name], backends[b].get(shape_name)
            if (shape and shape_name != shape) or wb is None:
                continue
            if ops not in wa or ops not in wb:
                lines.append(f"{model_name} {shape_name}: no {ops} list")
                continue
            rows = op_differences(wa[ops], wb[ops])
            only_a, only_b = only_one_side_ms(rows)
            lines += [
                f"{model_name} {shape_name}: {a} vs {b}",
                *(
                    f"  {label}: {wa[key]} vs {wb[key]}"
                    for label, key in (
                        ("wall ms (profiled)", "wall_ms"),
                        ("wall ms (unprofiled)", "wall_ms_unprofiled"),
                        ("device busy ms", "device_busy_ms"),
                        ("device ops per forward", "device_ops_per_forward"),
                    )
                ),
                *forward_lines(wa.get("forwards") or {}, wb.get("forwards") or {}),
                f"  ops only {a} runs: {only_a} ms; only {b} runs: {only_b} ms",
                f"  {'delta ms':>9} {a + ' ms':>10} {b + ' ms':>10} {'calls':>13}  op",
            ]
            for name, ms_a, ms_b, calls_a, calls_b in rows[:top]:
                calls = f"{calls_a:g}/{calls_b:g}"
                lines.append(
                    f"  {ms_a - ms_b:>+9.4f} {ms_a:>10.4f} {ms_b:>10.4f} {calls:>13}  {name}"
                )
    return "\n".join(lines) or f"no model/shape has both {a} and {b}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--a", default="full")
    parser.add_argument("--b", default="breakable")
    parser.add_argument("--model")
    parser.add_argument("--shape")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--ops",
        default="kernels",
        help="which per-op table: kernels (device ops), or host_runtime (the CUDA "
        "runtime's calls, benchmark/trace_summary.py's served profiles)",
    )
    args = parser.parse_args(argv)
    profile = json.loads(args.profile.read_text())
    print(report(profile, args.a, args.b, args.model, args.shape, args.top, args.ops))


if __name__ == "__main__":
    sys.exit(main())
