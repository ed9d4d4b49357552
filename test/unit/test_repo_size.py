"""The working tree stays small enough to travel beside a GPU bundle part.

Every device call carries the whole working tree (tracked files, untracked ones
git does not ignore) plus the paths it names, 64 MiB in all; a GPU block's
bundle goes in parts of 45 MB, one a call (test/gpu/resplit_bundle.sh). On
2026-12-07 the tracked tree was 20.7 MB, 16.9 MB of it raw server logs and
sglang.benchmark.serving JSONL rows, which left 1.4 MB before every part's
call would be refused: those files are committed gzipped now
(benchmark/compact_results.sh)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE_CALL_LIMIT = 64 * 2**20  # the device tool's working tree plus carry
# Room left for what travels untracked (results unpacked but not yet
# committed, a helper's notes) and for the tree's growth between sessions.
UNTRACKED_ROOM = 8 * 2**20


def tracked_files():
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tracked tree to measure")
    return [ROOT / name for name in out.decode().split("\0") if name]


def bundle_part_bytes():
    """resplit_bundle.sh's default part size."""
    script = (ROOT / "test/gpu/resplit_bundle.sh").read_text()
    sizes = {int(n) for n in re.findall(r"bytes=\$\{3:-(\d+)\}", script)}
    assert len(sizes) == 1, sizes
    return sizes.pop()


def test_results_keep_their_logs_and_rows_gzipped():
    raw = [
        str(path.relative_to(ROOT))
        for path in tracked_files()
        if path.is_relative_to(ROOT / "benchmark/results")
        and path.suffix in (".log", ".jsonl")
        and path.exists()
        and path.stat().st_size > 16 * 2**10
    ]
    assert not raw, f"run `bash benchmark/compact_results.sh` and commit: {raw}"


def test_tracked_tree_leaves_room_for_a_bundle_part():
    tree = sum(path.stat().st_size for path in tracked_files() if path.is_file())
    part = bundle_part_bytes()
    assert tree + part + UNTRACKED_ROOM <= DEVICE_CALL_LIMIT, (
        f"tracked tree {tree / 1e6:.1f} MB + bundle part {part / 1e6:.1f} MB leaves "
        f"under {UNTRACKED_ROOM / 2**20:.0f} MiB of the device call's "
        f"{DEVICE_CALL_LIMIT / 2**20:.0f} MiB: compact or drop results, or re-split "
        "the bundle in smaller parts (test/gpu/resplit_bundle.sh PART_BYTES)"
    )
