"""keep_full_prefill_graph_across_mamba2_layer_gaps through sglang's own
capture_prefill_graph (capture_prefill_graph_layers.py, in subprocesses: each
builds a gloo process group and a served model's context): sglang's own model
classes of tiny NemotronH and GraniteMoeHybrid configs, a full prefill graph
resolved with sglang-graphfix, only the GPU capture and the memory probe
stubbed. Upstream turns the graph off for every one of them (their layers
without attention: test_prefill_graph_layer_scan.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from tiny_configs import FAMILIES, _nemotron_h

SCRIPT = Path(__file__).with_name("capture_prefill_graph_layers.py")
ROOT = Path(__file__).resolve().parents[5]


def _write(tmp_path) -> dict:
    configs = {}
    # One group, bfloat16: what MAMBA2_CHECKED admits. "M*M-": an MLP layer;
    # "M-M*-": two; "M--*": two in as many layers as "M*M-".
    patterns = {"mlp": "M*M-", "two_mlp": "M-M*-", "other_mlp": "M--*"}
    for name, pattern in patterns.items():
        config = _nemotron_h(hybrid_override_pattern=pattern, mamba_n_groups=1)
        config.architectures = ["NemotronHForCausalLM"]
        configs[name] = config
    factory, arch, _ = FAMILIES["granite_moe_hybrid"]
    configs["granite"] = factory()
    configs["granite"].architectures = [arch]
    for name, config in configs.items():
        config.dtype = torch.bfloat16
        config.save_pretrained(tmp_path / name)
    return {name: str(tmp_path / name) for name in configs}


def test_full_graph_kept_for_the_served_models_layer_gaps(tmp_path):
    """With MAMBA2_LAYER_GAPS_CAPTURED on, capture_prefill_graph reaches the full
    prefill runner for the served model whose layers without attention are the
    ones the capability model counted. Upstream's verdict stands with the switch
    off, under a breakable graph, for a model with other gaps than the served
    one's (as many layers, or more), and for a scan of part of the model (a
    later pipeline stage's layers). (NemotronH with a MoE layer is refused
    before capture: test_full_prefill_graph_capability.py.)"""
    d = _write(tmp_path)
    runs = {
        (d["mlp"], "full"): [
            ("mlp", "on"), ("mlp", "off"), ("two_mlp", "on"), ("other_mlp", "on"),
        ],
        (d["mlp"], "breakable"): [("mlp", "on")],
        (d["two_mlp"], "full"): [("two_mlp", "on"), ("two_mlp", "on", "1")],
        (d["granite"], "full"): [("granite", "on"), ("granite", "off")],
    }  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            str(ROOT / p) for p in ("python", "sgl-kernel/python", "test")
        ),
    }
    procs = {
        run: subprocess.Popen(
            [
                sys.executable, str(SCRIPT), *run,
                *(",".join([d[case[0]], *case[1:]]) for case in cases),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run, cases in runs.items()
    }  # fmt: skip
    kept = {}
    name = {path: key for key, path in d.items()}
    for (served, backend), proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        for case, value in json.loads(out.strip().splitlines()[-1]).items():
            built, *rest = case.split(",")
            kept[(name[served], backend, name[built], *rest)] = value
    assert kept == {
        ("mlp", "full", "mlp", "on"): True,
        ("mlp", "full", "mlp", "off"): False,
        ("mlp", "full", "two_mlp", "on"): False,
        ("mlp", "full", "other_mlp", "on"): False,
        ("mlp", "breakable", "mlp", "on"): False,
        ("two_mlp", "full", "two_mlp", "on"): True,
        ("two_mlp", "full", "two_mlp", "on", "1"): False,
        ("granite", "full", "granite", "on"): True,
        ("granite", "full", "granite", "off"): False,
    }
