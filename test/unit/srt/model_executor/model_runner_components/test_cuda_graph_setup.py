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
    # "M-M*-": two; "M*ME": a MoE layer.
    for name, pattern in (("mlp", "M*M-"), ("two_mlp", "M-M*-"), ("moe", "M*ME")):
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
    """With MAMBA2_LAYER_GAPS_CAPTURED on, capture_prefill_graph builds the full
    prefill runner for the served model whose layers without attention are the
    ones the capability model counted; with it off, or for a model with other
    gaps than the served one's (a draft model, say), upstream's verdict stands."""
    d = _write(tmp_path)
    runs = {
        d["mlp"]: [f"{d['mlp']},on", f"{d['mlp']},off", f"{d['two_mlp']},on"],
        d["moe"]: [f"{d['moe']},on"],
        d["granite"]: [f"{d['granite']},on", f"{d['granite']},off"],
    }
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            str(ROOT / p) for p in ("python", "sgl-kernel/python", "test")
        ),
    }
    procs = {
        served: subprocess.Popen(
            [sys.executable, str(SCRIPT), served, *cases],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for served, cases in runs.items()
    }
    kept = {}
    for served, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        kept.update(json.loads(out.strip().splitlines()[-1]))
    name = {path: key for key, path in d.items()}
    assert {(name[c.split(",")[0]], c.split(",")[1]): v for c, v in kept.items()} == {
        ("mlp", "on"): True,
        ("mlp", "off"): False,
        ("two_mlp", "on"): False,
        ("moe", "on"): True,
        ("granite", "on"): True,
        ("granite", "off"): False,
    }
