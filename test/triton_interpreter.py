"""Run a script under Triton's CPU interpreter and read its JSON lines: the CPU
tests' way to run sglang's (and this package's) Triton kernels."""

import json
import os
import subprocess
import sys


def run_interpreted(script, *, timeout: float, **env) -> list:
    """``script`` in a fresh process (TRITON_INTERPRET must be set before triton
    is imported) with ``env`` added to the environment; one dict per line it
    prints. Fails the test on a non-zero exit."""
    run = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "TRITON_INTERPRET": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return [json.loads(line) for line in run.stdout.splitlines()]
