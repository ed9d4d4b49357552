"""``sglang-graphfix explain``: sglang's real resolution, as on an H200, printed."""

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_configs import FAMILIES, write_config

from sglang.srt.arg_groups.overrides import model_config_of
from sglang.srt.server_args import ServerArgs
from sglang_graphfix import cli
from sglang_graphfix.srt.full_prefill_graph_capability import family_label

ROOT = Path(__file__).resolve().parents[2]
DEMO = [
    "explain",
    "--cuda-graph-backend-prefill",
    "full",
    "--attention-backend",
    "triton",
]


def explain(capsys, *argv):
    status = cli.main(["explain", *argv])
    return status, capsys.readouterr().out


def test_default_plan_on_the_sample_qwen3_next(capsys):
    status, out = explain(capsys)
    assert status == 0
    assert "as on an NVIDIA H200 (sm90" in out and "sglang-graphfix (active)" in out
    assert (
        "Qwen3NextForCausalLM" in out
        and "linear attention GDN (prefill kernel triton)" in out
    )
    assert "attention  prefill fa3, decode fa3" in out
    assert "prefill CUDA graph  breakable" in out and "decode CUDA graph   full" in out
    assert "full prefill graph  can capture here" in out
    assert "_attention_backend_default  attention_backend=fa3" in out


def test_demo_full_prefill_graph_on_triton_is_refused(capsys):
    status, out = explain(capsys, *DEMO[1:])
    assert status == 1
    assert "the server refuses to start (before loading any weights)" in out
    flat = " ".join(out.split())
    assert "full-attention backend triton" in flat
    assert (
        "Use --cuda-graph-backend-prefill breakable or --cuda-graph-backend-prefill disabled"
        in flat
    )
    assert "_parse_cuda_graph_config  prefill graph full, decode graph full" in out


def test_every_rule_that_fired_is_listed(capsys):
    """Inkling on an A100: its model default selects the full graph, its model
    override then picks triton, and the recheck downgrades it, with one warning."""
    status, out = explain(capsys, "--sample", "inkling", "--gpu", "a100")
    assert status == 0
    assert "prefill CUDA graph  breakable" in out
    decisions = out.split("decisions")[1].split("\nlog")[0]
    order = [
        "_apply_inkling_prefill_cuda_graph_default  cuda_graph_backend_prefill=full",
        "_parse_cuda_graph_config ",
        "_inkling_overrides ",
        "sglang_graphfix:full_prefill_graph_rules   prefill graph breakable",
    ]
    positions = [decisions.index(line) for line in order]
    assert positions == sorted(positions), decisions
    log = out.split("\nlog")[1]
    assert log.count("WARNING  sglang_graphfix.srt.arg_groups.cuda_graph_hook") == 1
    assert "experimental" in log  # upstream's own warning is shown too


def test_model_path(tmp_path, capsys):
    path = write_config("nemotron_h", tmp_path)
    status, out = explain(
        capsys, "--model-path", path, "--cuda-graph-backend-prefill", "full"
    )
    assert status == 1
    assert f"NemotronHForCausalLM  ({path})" in out
    assert "Mamba2/short-conv linear attention has no capturable extend" in " ".join(
        out.split()
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sample_configs_are_the_tiny_configs(family):
    """The configs shipped for explain describe the same models as the tests'."""
    sample = cli.SAMPLE_CONFIGS / family.replace("_", "-")
    assert json.loads((sample / "config.json").read_text())["architectures"] == [
        FAMILIES[family][1]
    ]
    model_config = model_config_of(ServerArgs(model_path=str(sample)))
    assert family_label(model_config) == FAMILIES[family][2]
    assert cli.samples() == sorted(f.replace("_", "-") for f in FAMILIES)


def test_console_script_is_declared():
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [ep.value for ep in scripts if ep.name == "sglang-graphfix"] == [
        "sglang_graphfix.cli:main"
    ]


@pytest.mark.parametrize("plugins", [None, "none"])
def test_demo_command_in_a_fresh_process(plugins):
    """The README's demo as a user runs it, on a machine without a GPU: sglang's
    plugin loader applies the installed sglang-graphfix (no test conftest), and
    SGLANG_PLUGINS without graphfix turns it off (upstream's plan: full, which
    then fails at capture)."""
    # The working tree's package and kernels, whatever copy pip installed.
    path = os.pathsep.join(str(ROOT / d) for d in ("python", "sgl-kernel/python"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    env.pop("SGLANG_PLUGINS", None)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    done = subprocess.run(
        [sys.executable, "-m", "sglang_graphfix.cli", *DEMO],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    if plugins is None:
        assert done.returncode == 1, done.stderr[-3000:]
        assert "sglang-graphfix (active)" in out
        assert "refuses to start" in out and "full-attention backend triton" in out
    else:
        assert done.returncode == 0, done.stderr[-3000:]
        assert "sglang-graphfix (NOT loaded: upstream sglang's plan)" in out
        assert "prefill CUDA graph  full" in out
