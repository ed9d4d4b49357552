"""For the CPU tests that build sglang's own model classes on the meta device:
those builds run in a subprocess (a gloo rank and meta_models.py's stubs stay out
of the test process), each a script that prints one JSON object last."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# meta_models.py, which every such script imports first.
META_MODELS = ROOT / "test/unit/srt/model_executor/model_runner_components"


def run_meta_script(script: Path, *args: str):
    """``script``'s JSON object, with this checkout's packages, test helpers and
    benchmarks importable; the script's stderr tail on failure."""
    paths = [ROOT / p for p in ("python", "sgl-kernel/python", "test", "benchmark")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(p) for p in [*paths, META_MODELS]),
    }
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
