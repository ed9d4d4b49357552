"""Plugin loading per rank: sglang spawns one scheduler process per TP rank
(``mp.set_start_method("spawn")``), and each one's run_scheduler_process starts
with its own ``load_plugins()``; the engine calls it again in the main process.
Each fresh interpreter must apply every patch exactly once, whichever rank it
serves, however often load_plugins() / register() run in it."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from sglang_graphfix.patches import PATCHES

ROOT = Path(__file__).resolve().parents[2]

# One scheduler process's start (run_scheduler_process: load_plugins() first),
# then the engine's defensive second call and a direct register(); reports
# every target's hook depth after the first load and at the end.
CHILD = r"""
import json, logging, sys
logging.getLogger("sglang_graphfix").setLevel(logging.INFO)
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("sglang_graphfix").addHandler(Keep())

from sglang.srt.plugins import load_plugins
import sglang_graphfix
from sglang_graphfix.patches import PATCHES, _lookup

def depths():
    out = {}
    for patch in PATCHES:
        fn, n = _lookup(patch.target), 0
        while hasattr(fn, "__wrapped__"):
            fn, n = fn.__wrapped__, n + 1
        out[patch.target] = n
    return out

upstream = depths()  # some upstream functions are decorated themselves
load_plugins()
first = depths()
load_plugins()
sglang_graphfix.register()
print(json.dumps({"upstream": upstream, "first": first, "last": depths(),
                  "applied": [m for m in records if "applied" in m],
                  "registered": sglang_graphfix._registered,
                  "module": sglang_graphfix.__file__}))
"""


def _spawn_rank(rank):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "python"), str(ROOT / "sgl-kernel" / "python")]
        ),
        "SGLANG_PLUGINS": "graphfix",
        # What a TP rank's process differs in; register() must not read it.
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "CUDA_VISIBLE_DEVICES": str(rank),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_every_rank_process_applies_every_patch_once():
    children = [_spawn_rank(rank) for rank in (0, 1)]
    reports = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for report in reports:
        assert report["registered"]
        assert Path(report["module"]).is_relative_to(ROOT / "python")
        # One wrapper per patch on every target (two on PrefillCudaGraphRunner.
        # capture), after the first load and at the end: the second
        # load_plugins() and register() wrap nothing again.
        per_target = Counter(patch.target for patch in PATCHES)
        one_more = {t: n + per_target[t] for t, n in report["upstream"].items()}
        assert report["first"] == report["last"] == one_more
        assert report["applied"] == [
            f"sglang-graphfix: applied {len(PATCHES)} patches to sglang"
        ]
    assert reports[0] == {**reports[1], "module": reports[0]["module"]}
