"""benchmark/profile_diff.py on a hand-made profile JSON of the shape
benchmark/prefill_graph_latency.py --profile writes."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "profile_diff", ROOT / "benchmark" / "profile_diff.py"
)
profile_diff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_diff)


def _window(kernels, wall):
    return {
        "wall_ms": wall,
        "wall_ms_unprofiled": wall - 1,
        "device_busy_ms": wall - 2,
        "device_ops_per_forward": sum(calls for _, calls in kernels.values()),
        "kernels": kernels,
    }


PROFILE = {
    "models": {
        "m": {
            "full": {
                "8192x1": _window(
                    {"gdn": [5.0, 36], "masked_fill": [2.4, 36], "mm": [9.0, 96]}, 30
                ),
                "16x1": _window({"mm": [1.0, 96]}, 5),
            },
            "breakable": {
                "8192x1": _window({"gdn_cp": [1.4, 36], "mm": [9.1, 96]}, 25),
            },
        }
    }
}


def test_ops_ordered_by_the_time_they_differ():
    rows = profile_diff.op_differences(
        PROFILE["models"]["m"]["full"]["8192x1"]["kernels"],
        PROFILE["models"]["m"]["breakable"]["8192x1"]["kernels"],
    )
    assert [r[0] for r in rows] == ["gdn", "masked_fill", "gdn_cp", "mm"]
    assert rows[2] == ("gdn_cp", 0.0, 1.4, 0.0, 36)
    assert profile_diff.only_one_side_ms(rows) == (7.4, 1.4)


def test_report_names_each_shape_both_backends_ran(tmp_path, capsys):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    profile_diff.main([str(path), "--top", "2"])
    out = capsys.readouterr().out
    assert "m 8192x1: full vs breakable" in out
    assert "16x1" not in out  # breakable did not run it
    assert "wall ms (profiled): 30 vs 25" in out
    assert "ops only full runs: 7.4 ms; only breakable runs: 1.4 ms" in out
    lines = out.splitlines()
    first = lines.index("m 8192x1: full vs breakable") + 7
    assert lines[first].split()[0] == "+5.0000" and lines[first].endswith("gdn")
    assert len(lines) == first + 2  # --top 2
    assert profile_diff.report(PROFILE, "full", "disabled") == (
        "no model/shape has both full and disabled"
    )
