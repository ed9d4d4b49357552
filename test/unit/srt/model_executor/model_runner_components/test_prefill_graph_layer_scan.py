"""sglang's prefill graph setup (capture_prefill_graph) turns the prefill graph
off for a model with a layer it finds no attention module in; the capability
model predicts that from the config (layer_gap) to refuse the
full graph with the Mamba2 switch on, and explain shows upstream running those
prefills eagerly. Here the prediction meets sglang's own scan on sglang's own
model classes (scan_prefill_graph_layers.py, in a subprocess: it builds a gloo
process group)."""

from pathlib import Path

from meta_subprocess import run_meta_script
from tiny_configs import FAMILIES, _nemotron_h

from sglang.srt.arg_groups.overrides import model_config_of
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.srt import full_prefill_graph_capability as capability

SCRIPT = Path(__file__).with_name("scan_prefill_graph_layers.py")
# NemotronH patterns: tiny_configs' "M*M-" (an MLP layer), Mamba2 and attention
# only, and a MoE layer.
NEMOTRON_H = {"nemotron_h": "M*M-", "nemotron_h_no_mlp": "M*M", "nemotron_h_moe": "M*ME"}  # fmt: skip
OTHERS = ("falcon_h1", "granite_moe_hybrid")


def _write(tmp_path) -> dict:
    dirs = {}
    for name, pattern in NEMOTRON_H.items():
        config = _nemotron_h(hybrid_override_pattern=pattern)
        config.architectures = ["NemotronHForCausalLM"]
        dirs[name] = config
    for name in OTHERS:
        factory, arch, _ = FAMILIES[name]
        dirs[name] = factory()
        dirs[name].architectures = [arch]
    for name, config in dirs.items():
        config.save_pretrained(tmp_path / name)
    return {name: str(tmp_path / name) for name in dirs}


def test_layer_gap_matches_sglangs_own_scan(tmp_path):
    dirs = _write(tmp_path)
    kept = run_meta_script(SCRIPT, *dirs.values())
    sglang = {name: kept[path] for name, path in dirs.items()}
    assert sglang == {
        "nemotron_h": False,
        "nemotron_h_no_mlp": True,
        "nemotron_h_moe": False,
        "falcon_h1": True,
        "granite_moe_hybrid": False,
    }
    ours = {
        name: capability.prefill_graph_turned_off(
            model_config_of(ServerArgs(model_path=path)), "full", 90
        )
        is None
        for name, path in dirs.items()
    }
    assert ours == sglang
