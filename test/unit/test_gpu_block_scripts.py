"""test/gpu/run_block.sh and poll_block.sh, the scripts a GPU session's block
runs, on this machine with stand-ins for python3 and nvidia-smi: a script bug
found on the device costs device time the session rarely has.

The stand-in python3 records its arguments and the environment a serving run
was given, and writes a report, a log and a profiler trace where the serving
script would; a Triton autotuning choice sits in sglang's Triton cache."""

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "test" / "gpu"

FAKE_PYTHON = """#!/usr/bin/env bash
# python3 for the block scripts: pytest and the serving script leave a trace.
if [ "$1" = -m ] && [ "$2" = pytest ]; then
  echo "pytest $*" >>"$BLOCK_CALLS"
  # Until the clocks' logger has started (the block kills it when it ends).
  for _ in $(seq 100); do [ -e "$BLOCK_CALLS.smi" ] && break; sleep 0.1; done
  exit 0
fi
if [ "$1" = benchmark/serving_prefill_graph.py ]; then
  shift
  echo "serving [$*] FOO=${FOO:-unset}" >>"$BLOCK_CALLS"
  echo "env ${GRAPHFIX_PROBE_MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST:-unset}" \
    "${GRAPHFIX_PROBE_GRAPH_MEMORY:-unset}" \
    "${GRAPHFIX_PROBE_MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS:-unset}" \
    "${GRAPHFIX_PROBE_MAMBA2_SNAPSHOT_KERNEL:-unset}" \
    "load=${SGLANG_TRITON_LOAD_WARNING_THRESHOLD_GB:-unset}" \
    "compile=${SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS:-unset} $PYTHONPATH" \
    >>"$BLOCK_CALLS.env"
  echo "gdn ${GRAPHFIX_PROBE_GDN_SINGLE_REQUEST_GRAPHS:-unset}" \
    "${GRAPHFIX_PROBE_GDN_TRACK_SNAPSHOT_KERNEL:-unset}" \
    "${GRAPHFIX_PROBE_GDN_TABLES_ONCE_PER_FORWARD:-unset}" >>"$BLOCK_CALLS.gdn"
  mkdir -p "$OUT/logs"
  case " $* " in
    *" --profile "*) echo '{"modes": {"full": {"profiled": {}}}}' ;;
    *) echo '{"modes": {}}' ;;
  esac >"$OUT/serving_prefill_graph.json"
  {
    echo server
    # sglang's load watch: a late load is logged below its free-memory threshold.
    [ -n "${SGLANG_TRITON_LOAD_WARNING_THRESHOLD_GB:-}" ] \
      && echo "Triton kernel 'k' device-loaded after serving started (free device mem: 70.00 GiB)."
  } >"$OUT/logs/server_full.log"
  head -c 4096 /dev/urandom >"$OUT/logs/rank0.trace.json.gz"
  exit 0
fi
if [ "$1" = -c ] && [ "$2" = "from sgl_kernel import flash_ops" ]; then
  echo "fa3 check" >>"$BLOCK_CALLS"
  if [ "${FAKE_FA3_RC:-0}" != 0 ]; then
    echo "Traceback (most recent call last):"
    echo "ImportError: Can not import FA3 in sgl_kernel."
  fi
  exit "${FAKE_FA3_RC:-0}"
fi
case "$1" in benchmark/trace_summary.py | benchmark/profile_diff.py)
  echo "post $*" >>"$BLOCK_CALLS"
  echo '{}'
  if [ "$1" = benchmark/trace_summary.py ] && [ -n "${FAKE_SUMMARY_FAILS:-}" ]; then
    echo "ValueError: a profiled run has no trace" >&2
    exit 1
  fi
  exit 0
esac
echo "unexpected python3 $*" >>"$BLOCK_CALLS"
exit 3
"""

# nvidia-smi as a driver that knows the clock reasons by their older name only
# (a query with the newer name fails whole, as a real one does); the logger's
# command line is recorded once it has written its first line.
FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
case "$*" in
  *clocks_event_reasons*) exit 6 ;;
  *-lms*) echo timestamp; echo "$*" >>"$BLOCK_CALLS.smi" ;;
esac
exit 0
"""


@pytest.fixture
def block(tmp_path):
    for tool in ("bash", "tar", "split", "find", "cp", "timeout"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not on this machine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("python3", FAKE_PYTHON),
        ("nvidia-smi", FAKE_NVIDIA_SMI),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    home = tmp_path / "home"
    tuned = home / ".cache" / "sglang" / "triton" / "ab12"
    tuned.mkdir(parents=True)
    (tuned / "_chunk_scan_fwd_kernel.autotune.json").write_text('{"key": [128]}')
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRITON_", "SGLANG_CACHE", "RES", "OUT", "POST", "PRE"))
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        HOME=str(home),
        BLOCK_CALLS=str(tmp_path / "calls.log"),
        RES=str(tmp_path / "res"),
        GRAPHFIX_COMMIT="abc1234",
    )
    return tmp_path, env


def _run(script, args, env, timeout=60):
    return subprocess.run(
        ["bash", str(GPU / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_run_block_runs_each_step_and_keeps_what_it_needs(block):
    tmp, env = block
    env["POST"] = 'echo "post $OUT" >"$OUT/post.txt"'
    done = _run(
        "run_block.sh",
        [
            "first_module.py",
            "",
            "FOO=1 --model nemotron-h-8b --modes full",
            "--model granite-4.0-h-micro",
        ],
        env,
    )
    assert done.returncode == 0, done.stderr
    res = tmp / "res"
    calls = (tmp / "calls.log").read_text().splitlines()
    assert calls[0].startswith("pytest -m pytest first_module.py")
    # A run's leading NAME=value words are its environment, not its flags.
    assert calls[1] == "serving [--model nemotron-h-8b --modes full] FOO=1"
    assert calls[2] == "serving [--model granite-4.0-h-micro] FOO=unset"
    progress = (res / "progress.log").read_text()
    for line in (
        "start abc1234",
        "first rc=0",
        "serving (FOO=1 --model nemotron-h-8b --modes full) rc=0",
        "serving_2 (--model granite-4.0-h-micro) rc=0",
        "post rc=0",
    ):
        assert line in progress
    assert (res / "serving" / "serving_prefill_graph.json").exists()
    assert (res / "serving_2" / "serving_prefill_graph.json").exists()
    assert (res / "post" / "post.txt").read_text() == f"post {res}/post\n"
    # Triton's cached choice, from sglang's cache folder, under its own path.
    kept = res / "triton_autotune" / "ab12" / "_chunk_scan_fwd_kernel.autotune.json"
    assert kept.read_text() == '{"key": [128]}'
    assert (res / "DONE").exists()
    # The GPU's clocks every 100 ms, with the clock reasons the driver answers.
    logger = (tmp / "calls.log.smi").read_text()
    assert "-lms 100" in logger and ",clocks_throttle_reasons.active " in logger
    assert "clocks_event_reasons" not in logger
    assert (res / "gpu_clocks.csv").read_text() == "timestamp\n"


def test_a_failing_step_is_logged_and_the_block_goes_on(block):
    tmp, env = block
    env["PRE"] = "exit 7"
    done = _run("run_block.sh", ["", "", "--model tiny"], env)
    assert done.returncode == 0, done.stderr
    progress = (tmp / "res" / "progress.log").read_text()
    assert "pre rc=7" in progress
    assert "serving (--model tiny) rc=0" in progress
    assert (tmp / "res" / "DONE").exists()


def test_poll_block_hands_back_everything_with_the_traces_last(block):
    tmp, env = block
    assert _run("run_block.sh", ["", "", "--model tiny"], env).returncode == 0
    out = tmp / "out"
    env["OUT"] = str(out)
    polled = _run("poll_block.sh", ["5"], env)
    assert polled.returncode == 0, polled.stderr
    assert "serving (--model tiny) rc=0" in polled.stdout
    assert "1 part(s)" in polled.stdout
    parts = sorted(out.glob("res.tgz.*"))
    assert [p.name for p in parts] == ["res.tgz.000"]
    with tarfile.open(parts[0]) as archive:
        names = archive.getnames()
    assert "res/serving/serving_prefill_graph.json" in names
    assert "res/progress.log" in names
    # Where an archive runs past what comes back, the cut falls in the traces.
    assert names[-1] == "res/serving/logs/rank0.trace.json.gz"
    assert all(not n.endswith(".trace.json.gz") for n in names[:-1])


def test_poll_block_says_when_parts_would_not_come_back(block):
    tmp, env = block
    res = tmp / "res"
    res.mkdir()
    (res / "DONE").touch()
    # Nine parts of 8 MiB: incompressible bytes.
    with open(res / "big.trace.json.gz", "wb") as f:
        f.write(os.urandom(8 * 2**20 * 8 + 1))
    env["OUT"] = str(tmp / "out")
    polled = _run("poll_block.sh", ["5"], env)
    assert polled.returncode == 0, polled.stderr
    assert "9 parts, only the first 8 come back" in polled.stdout


def test_the_late_compile_grep_matches_sglangs_load_watch():
    """The lines POST greps for in the full servers' logs are the ones sglang's
    load watch writes, and the environment step 1 sets is the one it reads
    (read in the installed sglang: the stand-in server above only copies them)."""
    import inspect

    from sglang.srt.environ import envs
    from sglang.srt.utils import triton_load_watch

    source = inspect.getsource(triton_load_watch)
    script = (GPU / "next_block.sh").read_text()
    for phrase in (
        "to compile after serving started",
        "device-loaded after serving started",
    ):
        assert phrase in source and f"-e '{phrase}'" in script
    for name in (
        "SGLANG_TRITON_LOAD_WARNING_THRESHOLD_GB",
        "SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS",
    ):
        assert hasattr(envs, name) and f"envs.{name}.get()" in source
        assert f" {name}=" in script


def test_next_block_runs_the_planned_steps_and_summarises_them(block):
    """next_block.sh: the planned serving steps through run_block.sh (the first
    two with the test probe on the path, the second without the one-slot
    graphs), then each report's traces summarised and the servers diffed into
    RES/post."""
    tmp, env = block
    env["PYTHONPATH"] = "/site"
    done = _run("next_block.sh", [], env)
    assert done.returncode == 0, done.stderr
    res = tmp / "res"
    calls = (tmp / "calls.log").read_text().splitlines()
    # No PRE since the snapshot kernel's and the no-buffer engine's GPU tests
    # passed (2026-12-07): no pytest, and the serving steps first.
    assert not any(c.startswith("pytest") for c in calls)
    assert calls[0].startswith("serving [--model nemotron-h-8b")
    assert "pre rc=" not in (res / "progress.log").read_text()
    serving = [c for c in calls if c.startswith("serving")]
    assert serving == [
        "serving [--model nemotron-h-8b --context-length 8192 --modes "
        "full,breakable --workloads sizes --profile "
        "1_x_1024_tokens,1_x_1536_tokens] FOO=unset",
        "serving [--model nemotron-h-8b --context-length 8192 --modes full "
        "--workloads sizes --profile 1_x_1024_tokens,1_x_1536_tokens] FOO=unset",
        "serving [--model nemotron-h-8b --context-length 8192 --modes full "
        "--workloads sizes --profile 1_x_1024_tokens,1_x_1536_tokens] FOO=unset",
        "serving [--model granite-4.0-h-micro --modes full,breakable --workloads "
        "burst,long --profile 1_x_16_tokens,8_x_64_tokens] FOO=unset",
    ]
    first, second, third, fourth = (tmp / "calls.log.env").read_text().splitlines()
    # As shipped in the first step's server; without the one-slot graphs in
    # the second's; with the snapshot kernel in the third's.
    # Step 1's servers log every Triton kernel first loaded after start-up.
    assert (
        first
        == f"env unset 1 unset unset load=1000000 compile=0 {ROOT}/test/gpu/probe:/site"
    )
    assert (
        second
        == f"env unset 1 0 unset load=unset compile=unset {ROOT}/test/gpu/probe:/site"
    )
    assert (
        third
        == f"env unset 1 unset 1 load=unset compile=unset {ROOT}/test/gpu/probe:/site"
    )
    assert fourth == "env unset unset unset unset load=unset compile=unset /site"
    for run in ("serving", "serving_2", "serving_3", "serving_4"):
        report = res / run / "serving_prefill_graph.json"
        # Summarised once, right after its serving run (before the next one):
        # POST finds the summary and diffs it.
        summary = calls.index(f"post benchmark/trace_summary.py {report}")
        assert calls.count(calls[summary]) == 1
        assert calls[summary - 1].startswith("serving [") and (
            run == "serving_4" or calls[summary + 1].startswith("serving [")
        )
        profile = res / "post" / f"{run}_profile.json"
        assert profile.read_text() == "{}\n"
        assert f"{run} profile summary rc=0" in (res / "progress.log").read_text()
        diff = f"post benchmark/profile_diff.py {profile} --a full --b breakable"
        assert f"{diff} --ops host_runtime" in calls
        assert (res / "post" / f"{run}_full_vs_breakable_kernels.txt").exists()
    # The one-slot graphs' full server against the 16-slot one, across reports,
    # last.
    reports = [res / r / "serving_prefill_graph.json" for r in ("serving", "serving_2")]
    assert f"post benchmark/trace_summary.py {reports[0]} {reports[1]}" in calls
    both = res / "post" / "one_slot_vs_16_profile.json"
    assert calls[-1] == (
        f"post benchmark/profile_diff.py {both} --a full --b full (serving_2) "
        "--ops kernels"
    )
    assert (res / "post" / "one_slot_vs_16_kernels.txt").exists()
    # The full servers' Triton compiles and first loads after start-up: the one
    # step 1's stand-in logged.
    assert (res / "post" / "full_late_compiles.txt").read_text() == (
        "Triton kernel 'k' device-loaded after serving started "
        "(free device mem: 70.00 GiB).\n"
    )
    assert "post rc=0" in (res / "progress.log").read_text()
    assert (res / "DONE").exists()


KIMI_SLOT_FLOOR = (
    "pytest -m pytest test/gpu/test_kimi_linear_full_prefill_graph.py -k "
    "slot_floor -q -rA -p no:cacheprovider"
)
QWEN3_5_ENGINE = (
    "pytest -m pytest test/gpu/test_hybrid_full_prefill_graph.py -k qwen3_5_moe "
    "-q -rA -p no:cacheprovider"
)
GDN_EXTEND = (
    "pytest -m pytest test/gpu/test_gdn_extend_kernel.py -k 1slot or track_kernel "
    "or shared_tables "
    "-q -rA -p no:cacheprovider"
)


QWEN3_NEXT_SECOND = (
    "--modes breakable,full --workloads burst --quick -- --chunked-prefill-size 512"
)
QWEN3_5_SECOND = (
    "--modes full --workloads burst,long --quick --profile long_8k-16k,4_x_256_tokens"
)


@pytest.mark.parametrize(
    "name, model, engine_test, second",
    [
        ("qwen3-next", "qwen3-next-80b-a3b-fp8", KIMI_SLOT_FLOOR, QWEN3_NEXT_SECOND),
        ("qwen3.5", "qwen3.5-35b-a3b-fp8", QWEN3_5_ENGINE, QWEN3_5_SECOND),
    ],
)
def test_next_block_gdn_serves_issue_13s_runs(block, name, model, engine_test, second):
    """next_block.sh qwen3-next and qwen3.5: the servers at sglang's default
    chunking with their long prompts profiled, the probe on their path, then
    qwen3-next's breakable and full at a chunked prefill of 512 (the flag after
    --, for sglang); qwen3.5's full server with each of its three switches (the
    probe's, one a server: one-slot graphs, tables once a forward, the snapshot
    kernel), profiled as the first, then the disabled server last; one summary
    of every report and each later full server, and the disabled one, diffed
    against step 1's. qwen3-next runs the Kimi-Linear slot-floor engine test
    after them; qwen3.5 runs the captured extend's GPU cases of the switches
    first (PRE), and its tiny Qwen3.5 MoE engine's graph vs eager and control
    after the servers (POST)."""
    tmp, env = block
    env["PYTHONPATH"] = "/site"
    done = _run("next_block.sh", [name], env)
    assert done.returncode == 0, done.stderr
    res = tmp / "res"
    calls = (tmp / "calls.log").read_text().splitlines()
    serving = [c for c in calls if c.startswith("serving")]
    qwen3_5 = name == "qwen3.5"
    runs = "--workloads chat,burst,long --quick --profile long_8k-16k,4_x_256_tokens"
    if qwen3_5:  # disabled last, after the switches' servers
        assert serving == [
            f"serving [--model {model} --modes breakable,full {runs}] FOO=unset",
            *[f"serving [--model {model} {second}] FOO=unset"] * 3,
            f"serving [--model {model} --modes disabled {runs}] FOO=unset",
        ]
    else:
        assert serving == [
            f"serving [--model {model} --modes breakable,full,disabled {runs}] "
            "FOO=unset",
            f"serving [--model {model} {second}] FOO=unset",
        ]
    probe = (
        f"env unset 1 unset unset load=unset compile=unset {ROOT}/test/gpu/probe:/site"
    )
    assert (tmp / "calls.log.env").read_text().splitlines() == (
        [probe] * 5
        if qwen3_5
        else [probe, "env unset unset unset unset load=unset compile=unset /site"]
    )
    none = "gdn unset unset unset"
    assert (tmp / "calls.log.gdn").read_text().splitlines() == (
        [none, "gdn 1 unset unset", "gdn unset unset 1", "gdn unset 1 unset", none]
        if qwen3_5
        else [none] * 2
    )
    steps = res / "post" / "steps_profile.json"
    later = ("serving_2", "serving_3", "serving_4", "serving_5")
    diffs = {
        "slots_16_vs_one_slot": ("full", "full (serving_2)"),
        "per_layer_vs_once": ("full", "full (serving_3)"),
        "track_gather_vs_kernel": ("full", "full (serving_4)"),
        "full_vs_disabled": ("full", "disabled"),
        "breakable_vs_disabled": ("breakable", "disabled"),
    }
    diff_calls = [
        f"post benchmark/profile_diff.py {steps} --a {a} --b {b} --ops kernels"
        for a, b in diffs.values()
    ]
    if qwen3_5:  # every later server profiled; one summary of all five reports
        for run in later:
            assert (res / "post" / f"{run}_profile.json").exists()
        reports = " ".join(
            str(res / r / "serving_prefill_graph.json") for r in ("serving", *later)
        )
        assert f"post benchmark/trace_summary.py {reports}" in calls
        assert [
            c for c in calls if c.startswith(f"post benchmark/profile_diff.py {steps}")
        ] == diff_calls
        for out in diffs:
            assert (res / "post" / f"{out}_kernels.txt").exists()
    else:  # the chunked-512 run profiles nothing: no summary, no diffs of it
        assert not [c for c in calls if "serving_2" in c and c.startswith("post ")]
        assert not (res / "post" / "serving_2_profile.json").exists()
        assert not steps.exists() and not set(diff_calls) & set(calls)
        assert not (res / "serving_3").exists()
        profile = res / "post" / "serving_profile.json"
        diff = f"post benchmark/profile_diff.py {profile} --a full --b disabled"
        assert f"{diff} --ops kernels" in calls
    gpu_tests = [GDN_EXTEND, engine_test] if qwen3_5 else [engine_test]
    assert [c for c in calls if c.startswith("pytest")] == gpu_tests
    servers = [i for i, c in enumerate(calls) if c.startswith("serving")]
    assert calls.index(engine_test) > servers[-1]
    if qwen3_5:  # the switches' GPU cases first (PRE), before any server
        assert calls.index(GDN_EXTEND) < servers[0]
        assert (res / "pre.log").exists()
    assert "post rc=0" in (res / "progress.log").read_text()
    assert (res / "DONE").exists()


def test_a_cut_qwen3_5_block_summarises_the_steps_that_ran(block):
    """BLOCK_STEPS=3 on qwen3.5: the steps' summary holds the reports of the
    steps that ran (step 1's and the two later full servers'), not the missing
    ones."""
    tmp, env = block
    done = _run("next_block.sh", ["qwen3.5"], {**env, "BLOCK_STEPS": "3"})
    assert done.returncode == 0, done.stderr
    res = tmp / "res"
    calls = (tmp / "calls.log").read_text().splitlines()
    assert len([c for c in calls if c.startswith("serving")]) == 3
    reports = " ".join(
        str(res / r / "serving_prefill_graph.json")
        for r in ("serving", "serving_2", "serving_3")
    )
    assert f"post benchmark/trace_summary.py {reports}" in calls


def test_next_block_qwen3_next_stops_on_a_site_without_fa3(block):
    """Its servers keep sglang's Hopper default (fa3): on a site whose sgl_kernel
    lacks FlashAttention-3 (a NOFA3 bundle) the block stops before any server,
    naming the bundle to carry instead."""
    tmp, env = block
    env["FAKE_FA3_RC"] = "1"
    done = _run("next_block.sh", ["qwen3-next"], env)
    assert done.returncode == 3
    assert "does not import FlashAttention-3" in done.stderr
    assert "(ImportError: Can not import FA3 in sgl_kernel.)" in done.stderr
    assert "without NOFA3=1" in done.stderr
    assert (tmp / "calls.log").read_text().splitlines() == ["fa3 check"]
    # In the background the block's stderr goes to a log nobody polls: the
    # reason is where poll_block.sh reads, and DONE ends the polling.
    res = tmp / "res"
    assert "without NOFA3=1" in (res / "progress.log").read_text()
    assert (res / "DONE").exists()
    done = _run("poll_block.sh", ["1"], {**env, "OUT": str(tmp / "out")})
    assert done.returncode == 0, done.stderr
    assert "does not import FlashAttention-3" in done.stdout
    # The mamba2 block serves on FlashInfer and does not ask.
    done = _run("next_block.sh", ["mamba2"], env)
    assert done.returncode == 0, done.stderr
    assert "fa3 check" not in (tmp / "calls.log").read_text().splitlines()[1:]


def test_a_summary_that_fails_is_not_kept_nor_tried_again(block):
    """A profiled run's summary that fails (or times out) right after its
    serving run leaves its error, no partial summary for POST's diffs to read,
    and POST does not spend the block's time on it again."""
    tmp, env = block
    env["FAKE_SUMMARY_FAILS"] = "1"
    done = _run("next_block.sh", ["mamba2"], env)
    assert done.returncode == 0, done.stderr
    post = tmp / "res" / "post"
    for run in ("serving", "serving_2", "serving_3", "serving_4"):
        assert not (post / f"{run}_profile.json").exists()
        assert not (post / f"{run}_profile.partial").exists()
        assert "no trace" in (post / f"{run}_profile.err").read_text()
    calls = (tmp / "calls.log").read_text().splitlines()
    summaries = [c for c in calls if "trace_summary.py" in c]
    # Once per run; not the mamba2 block's summary across two reports, whose
    # traces did not parse.
    assert len(summaries) == 4 and all(c.count(".json") == 1 for c in summaries)
    assert not (post / "one_slot_vs_16_profile.json").exists()
    assert not (post / "one_slot_vs_16_profile.json.partial").exists()
    assert not [c for c in calls if "profile_diff.py" in c]
    progress = (tmp / "res" / "progress.log").read_text()
    assert "serving profile summary rc=1" in progress


def test_block_steps_runs_the_first_steps_then_post(block):
    """BLOCK_STEPS=N (a session left with less device time than a block): the
    first N serving steps as planned, then POST (its diffs of what ran); the
    later steps are not started. Not a number: refused
    before anything runs."""
    tmp, env = block
    done = _run("next_block.sh", ["mamba2"], {**env, "BLOCK_STEPS": "2"})
    assert done.returncode == 0, done.stderr
    calls = (tmp / "calls.log").read_text().splitlines()
    serving = [c for c in calls if c.startswith("serving")]
    assert len(serving) == 2 and "granite" not in " ".join(calls)
    assert serving[0].startswith("serving [--model nemotron-h-8b --context-length 8192")
    assert " --modes full --workloads sizes " in serving[1]
    assert (tmp / "res" / "post" / "one_slot_vs_16_kernels.txt").exists()
    assert calls[0] == serving[0]
    (tmp / "calls.log").unlink()
    done = _run("next_block.sh", ["qwen3-next"], {**env, "BLOCK_STEPS": "1"})
    assert done.returncode == 0, done.stderr
    calls = (tmp / "calls.log").read_text().splitlines()
    serving = [c for c in calls if c.startswith("serving")]
    assert len(serving) == 1 and "--modes breakable,full,disabled" in serving[0]
    assert calls[-1].startswith("pytest -m pytest test/gpu/test_kimi_linear")
    # More steps than planned: all of them.
    (tmp / "calls.log").unlink()
    done = _run("next_block.sh", ["qwen3-next"], {**env, "BLOCK_STEPS": "9"})
    assert done.returncode == 0, done.stderr
    calls = (tmp / "calls.log").read_text().splitlines()
    assert len([c for c in calls if c.startswith("serving")]) == 2
    (tmp / "calls.log").unlink()
    for bad in ("0", "two", "-1"):
        done = _run("next_block.sh", ["mamba2"], {**env, "BLOCK_STEPS": bad})
        assert (
            done.returncode == 2 and "BLOCK_STEPS takes a whole number" in done.stderr
        )
    assert not (tmp / "calls.log").exists()


def test_next_block_refuses_a_block_it_does_not_plan(block):
    tmp, env = block
    done = _run("next_block.sh", ["qwen3"], env)
    assert done.returncode == 2
    assert "no block named 'qwen3' (mamba2, qwen3-next, qwen3.5)" in done.stderr
    # A block takes no flags of its own: refused rather than dropped.
    done = _run("next_block.sh", ["qwen3-next", "--quick"], env)
    assert done.returncode == 2 and "one block name at most" in done.stderr
    assert not (tmp / "calls.log").exists()
