# SPDX-License-Identifier: Apache-2.0
"""Every patch guarded: for each ``PATCHES`` entry, replace its hook by a
pass-through to the original and run the CPU unit tests; the patch is guarded
when some test then fails (a real failure, pytest exit status 1).

    python3 test/mutate_patches.py [--only HOOK ...] [--full] [--jobs N]

The tests mirroring the hook's module run first (``test/unit/srt/<path>/test_<module>.py``);
when none fails there, the whole unit suite runs. ``--full`` always runs the whole
suite. Writes ``test/mutate_patches.json`` (per patch: verdict, failing tests,
how long; provenance: commit, dirty flag, sglang and torch versions, date) and
exits 1 when any patch is unguarded (or a run errored).

The same file is the pytest plugin that does the swap (``-p mutate_patches`` with
``GRAPHFIX_MUTATE=<hook name>``): it rewrites ``sglang_graphfix.patches.PATCHES``
before the tests' conftest registers the patches.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "test" / "mutate_patches.json"
ENV = "GRAPHFIX_MUTATE"
# Tests that run in a fresh process, where the swap (made in the pytest process)
# does not reach: they cannot see a mutation, take minutes, and under load may
# time out, which would read as a failure.
FRESH_PROCESS_TESTS = [
    "--ignore=test/unit/sgl_kernel",  # Triton interpreter in a subprocess
    "-k",
    "not stops_server_args_and_engine and not sglang_serve_log_shows"
    " and not version_names_ours and not demo_command_in_a_fresh_process",
]


def _pass_through_for(hook):
    """A hook that only calls the original; it keeps the real hook's name and
    (through __wrapped__) its header, so only behaviour differs."""

    @functools.wraps(hook)
    def pass_through(original, *args, **kwargs):
        return original(*args, **kwargs)

    return pass_through


def _swap_in_pass_through(name: str) -> None:
    from sglang_graphfix import patches

    hooks = [p.hook.__name__ for p in patches.PATCHES]
    if name not in hooks:
        raise SystemExit(f"{ENV}={name}: no such hook in PATCHES ({', '.join(hooks)})")
    patches.PATCHES = tuple(
        p._replace(hook=_pass_through_for(p.hook)) if p.hook.__name__ == name else p
        for p in patches.PATCHES
    )


# pytest plugin mode: loaded with -p before conftest, so the swap precedes register().
if os.environ.get(ENV) and __name__ != "__main__":
    sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel" / "python")]
    _swap_in_pass_through(os.environ[ENV])


def _git(*args) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()


def _versions() -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlib.metadata import version as v; print(v('sglang'), v('torch'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return {
        "sglang": out[0] if out else None,
        "torch": out[1] if len(out) > 1 else None,
    }


def _patches() -> list:
    """(hook name, hook module) of every PATCHES entry, read in a subprocess so
    this script needs no sglang import itself."""
    code = (
        "import json, sglang_graphfix.patches as p; "
        "print(json.dumps([[x.hook.__name__, x.hook.__module__] for x in p.PATCHES]))"
    )
    env = dict(os.environ, PYTHONPATH=_pythonpath())
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pythonpath() -> str:
    parts = [ROOT / "python", ROOT / "sgl-kernel" / "python", ROOT / "test"]
    extra = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(p) for p in parts] + ([extra] if extra else []))


def mirrored_tests(module: str) -> list:
    """test/unit/srt/<path>/test_<name>.py for sglang_graphfix.srt.<path>.<name>."""
    parts = module.split(".")[1:]  # drop sglang_graphfix
    path = ROOT / "test" / "unit" / Path(*parts[:-1]) / f"test_{parts[-1]}.py"
    return [str(path.relative_to(ROOT))] if path.exists() else []


def run_tests(hook: str, targets: list) -> dict:
    """pytest over ``targets`` with ``hook`` a pass-through; its exit status and
    the failing tests."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        env = dict(os.environ, PYTHONPATH=_pythonpath(), **{ENV: hook})
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                "-p",
                "mutate_patches",
                f"--junitxml={junit}",
                *targets,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        failed = []
        if junit.exists():
            for case in ET.parse(junit).getroot().iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(f"{case.get('classname')}::{case.get('name')}")
    return {
        "targets": targets,
        "exit_status": done.returncode,
        "failed": failed,
        "seconds": round(time.monotonic() - started, 1),
        "tail": done.stdout.strip().splitlines()[-3:],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="hook names to mutate (default: all)")
    parser.add_argument(
        "--full", action="store_true", help="always run the whole unit suite"
    )
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--jobs", type=int, default=1, help="pytest runs at a time")
    args = parser.parse_args(argv)

    def mutate(hook, module):
        runs = []
        first = [] if args.full else mirrored_tests(module)
        full = ["test/unit", *FRESH_PROCESS_TESTS]
        for targets in ([first] if first else []) + [full]:
            run = run_tests(hook, targets)
            runs.append(run)
            if run["exit_status"] != 0:
                break
        last = runs[-1]
        # Guarded only on a real test failure (1); 0 = every test passed with the
        # pass-through; anything else (collection error, interrupted) is an error.
        verdict = {0: "UNGUARDED", 1: "guarded"}.get(last["exit_status"], "error")
        shown = ", ".join(last["failed"][:2]) or last["tail"][-1:]
        print(f"{verdict:<10} {hook}  ({shown})", flush=True)
        return hook, {"verdict": verdict, "module": module, "runs": runs}

    # What was tested: read before the runs (the tree may change meanwhile).
    tested = {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }
    chosen = [(h, m) for h, m in _patches() if not args.only or h in args.only]
    results = {}

    def write(done: bool):
        report = {
            "what": "each PATCHES hook replaced by a pass-through to the original; "
            "guarded = some CPU unit test fails (the tests mirroring the hook's "
            "module first, else test/unit without the tests that run in a fresh "
            "process, which the swap does not reach)",
            "complete": done and len(results) == len(chosen),
            "provenance": {
                **tested,
                **_versions(),
                "python": sys.version.split()[0],
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"
                ),
                "command": "python3 test/mutate_patches.py "
                + " ".join(argv if argv is not None else sys.argv[1:]),
            },
            "summary": {
                v: sorted(h for h, r in results.items() if r["verdict"] == v)
                for v in ("guarded", "UNGUARDED", "error")
            },
            "not_run_yet": [h for h, _ in chosen if h not in results],
            "patches": {h: results[h] for h, _ in chosen if h in results},
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    def mutate_and_record(hook_module):
        hook, result = mutate(*hook_module)
        results[hook] = result
        write(done=False)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(mutate_and_record, chosen))
    write(done=True)
    print(f"wrote {args.out}")
    return 0 if all(r["verdict"] == "guarded" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
