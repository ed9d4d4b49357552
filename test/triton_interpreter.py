"""Run a script under Triton's CPU interpreter and read its JSON lines: the CPU
tests' way to run sglang's (and this package's) Triton kernels."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(script, *, timeout: float, **env) -> list:
    """``script`` in a fresh process (TRITON_INTERPRET must be set before triton
    is imported) on this process's import path inside the repository (pytest's
    pythonpath: python/, sgl-kernel/python, test/), with ``env`` added to the
    environment; one dict per line it prints. Fails the test on a non-zero exit."""
    repo_path = [p for p in sys.path if p and Path(p).resolve().is_relative_to(ROOT)]
    inherited = os.environ.get("PYTHONPATH")
    run = subprocess.run(
        [sys.executable, str(script)],
        env={
            **os.environ,
            "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join(
                repo_path + ([inherited] if inherited else [])
            ),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return [json.loads(line) for line in run.stdout.splitlines()]
