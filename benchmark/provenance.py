"""Where a measurement comes from, recorded by the script that measured it: every
benchmark writes ``"provenance": provenance()`` into its benchmark/results/*.json,
and benchmark/render_results.py prints it beside the numbers.

The commit comes from ``GRAPHFIX_COMMIT`` where the tree was shipped with it
(``GRAPHFIX_COMMIT=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo -dirty)``:
a shipped copy may carry a stale .git, as the GPU machine's did), else from git;
else it is recorded as unknown (None), never guessed."""

from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Distribution names whose versions decide the numbers.
PACKAGES = ("sglang", "torch", "triton", "flashinfer-python")


def _git(*args: str) -> str | None:
    try:
        run = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def _commit() -> tuple[str | None, bool | None, str]:
    """(commit, dirty, where it came from); dirty: tracked files differ from it."""
    shipped = os.environ.get("GRAPHFIX_COMMIT")
    commit = _git("rev-parse", "HEAD")
    if shipped:
        sha, dirty = shipped.removesuffix("-dirty"), shipped.endswith("-dirty")
        if commit is not None and commit != sha:
            return sha, dirty, f"GRAPHFIX_COMMIT (the .git here says {commit})"
        return sha, dirty, "GRAPHFIX_COMMIT"
    if commit is not None:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return commit, None if status is None else bool(status), "git"
    return None, None, "unknown (no git checkout, GRAPHFIX_COMMIT unset)"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _device() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def provenance() -> dict:
    """Commit + dirty flag, package versions, CUDA device (None without one), UTC
    date and the command line of this run."""
    commit, dirty, source = _commit()
    return {
        "commit": commit,
        "dirty": dirty,
        "commit_source": source,
        "versions": {
            "python": ".".join(map(str, sys.version_info[:3])),
            **{name: _version(name) for name in PACKAGES},
        },
        "device": _device(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": shlex.join(["python3", *sys.argv]),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(provenance(), indent=2))
