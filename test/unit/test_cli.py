"""``sglang-graphfix explain``: sglang's real resolution, as on an H200, printed for
upstream sglang 0.5.23 and with sglang-graphfix."""

import importlib.metadata
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from tiny_configs import FAMILIES, write_config

import sglang_graphfix
from sglang.srt.arg_groups.overrides import model_config_of
from sglang.srt.server_args import ServerArgs
from sglang_graphfix import cli
from sglang_graphfix.srt.full_prefill_graph_capability import family_label

ROOT = Path(__file__).resolve().parents[2]
# The README's demos: the full prefill graph on a hybrid linear-attention model,
# and LoRA on DeepSeek-V3.2's indexer weights_proj.
DEMO = ["explain", "--cuda-graph-backend-prefill", "full"]
DSA_DEMO = [
    "explain",
    "--sample",
    "deepseek-v3.2",
    "--enable-lora",
    "--lora-target-modules",
    "weights_proj",
    "--max-lora-rank",
    "16",
]
TRITON = ["--cuda-graph-backend-prefill", "full", "--attention-backend", "triton"]
UPSTREAM = "upstream sglang 0.5.23:"
GRAPHFIX = "with sglang-graphfix:"
INDEX_ERROR = (
    "crashes at prefill graph capture: IndexError: list index out of range in "
    "HybridLinearAttnBackend._replay_metadata"
)


def explain(capsys, *argv):
    status = cli.main(["explain", *argv])
    return status, capsys.readouterr().out


def outcomes(out):
    """The two outcome lines, unwrapped: {label: text}."""
    block = " ".join(out.split("\n\nplan")[0].split("\n\n")[-1].split())
    upstream, graphfix = block.split(GRAPHFIX)
    return {
        UPSTREAM: upstream.split(UPSTREAM)[1].strip(),
        GRAPHFIX: graphfix.strip(),
    }


@pytest.fixture
def plugin_on(monkeypatch):
    """As sglang serve would load sglang-graphfix: its entry point is installed
    (pip install; CI does) and no switch turns it off."""
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv("SGLANG_GRAPHFIX", raising=False)
    assert cli.graphfix_state().applied, "install the package: pip install -e ."


def test_default_plan_on_the_sample_qwen3_next(capsys, plugin_on):
    status, out = explain(capsys)
    assert status == 0
    first, second = out.splitlines()[:2]
    assert first.startswith("sglang-graphfix: active")
    assert "sglang 0.5.23, as on an NVIDIA H200 (sm90" in second
    assert (
        "Qwen3NextForCausalLM" in out
        and "linear attention GDN (prefill kernel flashinfer where sglang picks it "
        "on SM90, else triton)"
        in out
    )
    assert "attention  prefill fa3, decode fa3" in out
    runs = "runs: prefill CUDA graph breakable, decode CUDA graph full"
    assert outcomes(out) == {UPSTREAM: runs, GRAPHFIX: runs}
    assert "prefill CUDA graph  breakable" in out and "decode CUDA graph   full" in out
    assert "full prefill graph  can capture here" in out
    assert "_attention_backend_default  attention_backend=fa3" in out


def test_demo_full_prefill_graph_on_qwen3_next(capsys, plugin_on):
    """Upstream crashes at capture (GDN under a full prefill graph); with the
    plugin the GDN extend is captured."""
    status, out = explain(capsys, *DEMO[1:])
    assert status == 0
    seen = outcomes(out)
    assert (
        seen[UPSTREAM]
        == INDEX_ERROR + " (GDN linear attention under a full prefill graph)"
    )
    assert seen[GRAPHFIX] == (
        "runs: prefill CUDA graph full, decode CUDA graph full; GDN extend captured "
        "in the full prefill graph (prefill kernel flashinfer where sglang picks it "
        "on SM90, else triton)"
    )
    assert "plan (with sglang-graphfix)" in out
    assert (
        "prefill CUDA graph  full" in out
        and "request slots 16 (sglang's rule), at most 16 requests a prefill batch"
        in out
        and "full prefill graph  can capture here" in out
    )
    assert "_cap_prefill_batches_at_request_slots  prefill_max_requests=16" in out


def test_dsa_weights_proj_lora(capsys, plugin_on):
    """Upstream refuses at startup (its breakable prefill capture raises
    GRAPH_WEIGHTS_PROJ_LORA_ERROR); with the plugin it runs under the breakable
    prefill graph."""
    from sglang.srt.layers.attention.dsa.dsa_prefill_cuda_graph import (
        GRAPH_WEIGHTS_PROJ_LORA_ERROR,
    )

    status, out = explain(capsys, *DSA_DEMO[1:])
    assert status == 0
    assert (
        "DeepseekV32ForCausalLM" in out and "attention  prefill dsa, decode dsa" in out
    )
    seen = outcomes(out)
    assert seen[UPSTREAM] == (
        "refuses at startup, capturing the breakable prefill CUDA graph: "
        f"RuntimeError: {GRAPH_WEIGHTS_PROJ_LORA_ERROR}"
    )
    assert seen[GRAPHFIX].startswith(
        "runs: prefill CUDA graph breakable, decode CUDA graph full; weights_proj "
        "LoRA applied in the DSA indexer split op's head gate"
    )


@pytest.mark.parametrize(
    "flags, upstream, graphfix",
    [
        # Without weights_proj among the targets both run.
        (["--lora-target-modules", "q_b_proj"], "runs", "runs"),
        # 'all' covers the indexer's projections (auto_detect_lora_target_modules).
        (["--lora-target-modules", "all"], "refuses at startup, capturing the breakable prefill", "runs"),
        # No prefill graph: nothing captures the indexer.
        (["--lora-target-modules", "weights_proj", "--cuda-graph-backend-prefill", "disabled"], "runs", "runs"),
        # The breakable decode graph: upstream's raise, and the path the plugin does not cover.
        (
            ["--lora-target-modules", "weights_proj", "--cuda-graph-backend-prefill", "disabled", "--cuda-graph-backend-decode", "breakable"],
            "refuses at startup, capturing the breakable decode CUDA graph: RuntimeError: DSA indexer weights_proj LoRA is incompatible",
            "refuses at startup, capturing the breakable decode CUDA graph: RuntimeError: DSA indexer LoRA on indexer.weights_proj is not supported for DECODE batches",
        ),
    ],
)  # fmt: skip
def test_dsa_lora_paths(capsys, plugin_on, flags, upstream, graphfix):
    argv = ["--sample", "deepseek-v3.2", "--enable-lora", "--max-lora-rank", "16"]
    status, out = explain(capsys, *argv, *flags)
    seen = outcomes(out)
    assert seen[UPSTREAM].startswith(upstream), seen
    assert seen[GRAPHFIX].startswith(graphfix), seen
    assert status == (0 if graphfix == "runs" else 1)


def test_dsa_indexer_fusion_refuses_indexer_lora_in_both(capsys, plugin_on, tmp_path):
    """With indexer Q/K fusion (interleaved indexer RoPE) sglang's LoRA manager
    refuses indexer LoRA at model load, with or without the plugin."""
    config = json.loads(
        (cli.SAMPLE_CONFIGS / "deepseek-v3.2" / "config.json").read_text()
    )
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "indexer_rope_interleave": True})
    )
    status, out = explain(capsys, "--model-path", str(tmp_path), *DSA_DEMO[3:])
    assert status == 1
    seen = outcomes(out)
    assert seen[UPSTREAM] == seen[GRAPHFIX]
    assert seen[GRAPHFIX].startswith(
        "refuses at model load: ValueError: LoRA targets the DSA indexer"
    )
    assert "SGLANG_DISABLE_DSA_INDEXER_FUSION=1" in seen[GRAPHFIX]


def test_full_prefill_graph_on_triton_is_refused(capsys, plugin_on):
    status, out = explain(capsys, *TRITON)
    assert status == 1
    seen = outcomes(out)
    assert seen[UPSTREAM] == (
        "crashes at prefill graph capture: ValueError: Invalid forward mode EXTEND "
        "for CUDA Graph replay"
    )
    assert seen[GRAPHFIX].startswith(
        "refuses at startup, before loading weights: ValueError"
    )
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


def test_the_slot_floor_and_its_prefix_chunks_are_listed(capsys):
    """Kimi-Linear (MLA) at chunked prefill 512: the decisions name the raised
    request slots and the cached-prefix chunk tokens that go with them."""
    status, out = explain(
        capsys, "--sample", "kimi-linear", "--cuda-graph-backend-prefill", "full",
        "--attention-backend", "fa3", "--chunked-prefill-size", "512",
    )  # fmt: skip
    assert status == 0
    decisions = out.split("decisions")[1].split("\nlog")[0]
    assert (
        "_hybrid_full_prefill_request_slots     full_prefill_max_req=8; "
        "full_prefill_prefix_chunk_tokens=4096" in decisions
    ), decisions


def test_model_path(tmp_path, capsys, plugin_on):
    path = write_config("nemotron_h", tmp_path)
    status, out = explain(
        capsys, "--model-path", path, "--cuda-graph-backend-prefill", "full"
    )
    assert status == 1
    assert f"NemotronHForCausalLM  ({path})" in out
    # tiny_configs' NemotronH "M*M-" has an MLP-only layer: sglang's prefill
    # graph setup turns the graph off before any capture.
    assert outcomes(out)[UPSTREAM] == (
        "runs: every prefill eager (sglang turns the full prefill CUDA graph off at "
        "startup: no attention module in NemotronH's MLP ('-') layers: 'some layers "
        "do not apply Standard GQA'), decode CUDA graph full"
    )
    # The scan's hook keeps the graph for that layer (MAMBA2_LAYER_GAPS_CAPTURED,
    # on), and its 8 groups (as NemotronH's published checkpoints) are checked:
    # what refuses it is sglang's default attention backend here.
    joined = " ".join(out.split())
    assert "captures no prefill graph for this model" not in joined
    assert "Mamba2 layers have 8" not in joined
    assert "with the flashinfer attention backend only, not fa3" in joined


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sample_configs_are_the_tiny_configs(family):
    """The configs shipped for explain describe the same models as the tests'."""
    sample = cli.SAMPLE_CONFIGS / family.replace("_", "-")
    assert json.loads((sample / "config.json").read_text())["architectures"] == [
        FAMILIES[family][1]
    ]
    model_config = model_config_of(ServerArgs(model_path=str(sample)))
    assert family_label(model_config) == FAMILIES[family][2]
    assert cli.samples() == sorted(
        [f.replace("_", "-") for f in FAMILIES] + ["deepseek-v3.2"]
    )


def test_deepseek_v32_sample_is_a_dsa_model():
    """The DSA sample is what sglang's DSA paths key on (is_deepseek_dsa: the
    architecture and index_topk), with DeepSeek-V3.2's own indexer shape and RoPE
    (no indexer_rope_interleave: sglang's indexer Q/K fusion stays off)."""
    from sglang.srt.configs.model_config import is_deepseek_dsa

    sample = cli.SAMPLE_CONFIGS / "deepseek-v3.2"
    hf_config = model_config_of(ServerArgs(model_path=str(sample))).hf_config
    assert hf_config.architectures == ["DeepseekV32ForCausalLM"]
    assert is_deepseek_dsa(hf_config)
    assert (
        hf_config.index_n_heads,
        hf_config.index_head_dim,
        hf_config.index_topk,
    ) == (64, 128, 2048)
    assert not getattr(hf_config, "indexer_rope_interleave", False)


def test_console_script_is_declared():
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [ep.value for ep in scripts if ep.name == "sglang-graphfix"] == [
        "sglang_graphfix.cli:main"
    ]


def _fresh_process(argv, plugins):
    # The working tree's package and kernels, whatever copy pip installed.
    path = os.pathsep.join(str(ROOT / d) for d in ("python", "sgl-kernel/python"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    env.pop("SGLANG_PLUGINS", None)
    env.pop("SGLANG_GRAPHFIX", None)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    return subprocess.run(
        [sys.executable, "-m", "sglang_graphfix.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "demo, plugins",
    [(DEMO, None), (DEMO, "none"), (DSA_DEMO, "none")],
    ids=["qwen3-next", "qwen3-next-plugins-none", "deepseek-v3.2-plugins-none"],
)
def test_demo_in_a_fresh_process(demo, plugins, capsys, plugin_on):
    """The README's demos as a user runs them, on a machine without a GPU.
    Without SGLANG_PLUGINS sglang's loader applies the plugin and the output is
    this process's. With SGLANG_PLUGINS=none the plugin is never applied in that
    process, so its upstream plan is upstream sglang's own: the same two
    outcomes as here (where the upstream plan is resolved with the plugin's hooks
    taken off), but the first line says it is off, the details are upstream's
    and the exit status is upstream's failure."""
    done = _fresh_process(demo, plugins)
    status, here = explain(capsys, *demo[1:])
    assert status == 0
    if plugins is None:
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout == here
        return
    assert done.returncode == 1, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith(
        "sglang-graphfix: OFF (SGLANG_PLUGINS=none); a server started here gets "
        "upstream's plan\n"
    )
    assert here.startswith("sglang-graphfix: active, a server started here gets")
    assert outcomes(out) == outcomes(here)
    assert not outcomes(out)[UPSTREAM].startswith("runs")
    assert outcomes(out)[GRAPHFIX].startswith("runs")
    assert "plan (upstream sglang)" in out and "plan (with sglang-graphfix)" in here


@pytest.mark.parametrize(
    "switch, why",
    [
        ({"SGLANG_GRAPHFIX": "0"}, "OFF (SGLANG_GRAPHFIX=0)"),
        ({"SGLANG_PLUGINS": "smg-servicer,smg-zmq"}, "OFF (SGLANG_PLUGINS=smg-servicer,smg-zmq)"),
    ],
)  # fmt: skip
def test_plugin_off_says_so_first(capsys, monkeypatch, plugin_on, switch, why):
    for name, value in switch.items():
        monkeypatch.setenv(name, value)
    status, out = explain(capsys, *DEMO[1:])
    assert out.splitlines()[0] == (
        f"sglang-graphfix: {why}; a server started here gets upstream's plan"
    )
    assert status == 1  # upstream's crash at capture
    assert outcomes(out)[UPSTREAM].startswith(INDEX_ERROR)
    assert outcomes(out)[GRAPHFIX].startswith("runs: prefill CUDA graph full")
    assert "plan (upstream sglang)" in out and "full prefill graph  can" not in out


def test_other_sglang_version_says_not_applied(capsys, monkeypatch, plugin_on):
    monkeypatch.setattr(sglang_graphfix, "installed_sglang", lambda: "0.5.24")
    status, out = explain(capsys, *DEMO[1:])
    why = "NOT applied: it supports sglang==0.5.23 only, found sglang==0.5.24"
    assert out.splitlines()[0] == (
        f"sglang-graphfix: {why}; a server started here gets upstream's plan"
    )
    assert status == 1
    flat = " ".join(out.split())
    assert f"with sglang-graphfix: not available ({why})" in flat


def test_upstream_plan_puts_the_hooks_back(monkeypatch):
    """The upstream plan is resolved with every hook of sglang-graphfix taken
    off, also in modules that imported a patched function by name, and put back
    afterwards."""
    from sglang.srt.arg_groups import cuda_graph_hook
    from sglang_graphfix.patches import PATCHES, _lookup

    before = {p.target: _lookup(p.target) for p in PATCHES}
    # As `from sglang.srt.arg_groups.cuda_graph_hook import validate_cuda_graph_config`
    # after the plugin applied (HookRegistry propagates its wrapper there too).
    validate = cuda_graph_hook.validate_cuda_graph_config
    importer = types.ModuleType("imports_validate_cuda_graph_config")
    importer.validate_cuda_graph_config = validate
    monkeypatch.setitem(sys.modules, importer.__name__, importer)
    argv = ["--model-path", str(cli.SAMPLE_CONFIGS / "qwen3-next"), *DEMO[1:]]
    with cli.graphfix_hooks_removed():
        ours = {patch.hook for patch in PATCHES}
        for patch in PATCHES:
            current = _lookup(patch.target)
            # upstream's function: below every hook of ours on the target (two
            # wrap PrefillCudaGraphRunner.capture), and none of ours above it
            inner, wrapped = [], before[patch.target].__wrapped__
            while wrapped is not None:
                inner.append(wrapped)
                wrapped = getattr(wrapped, "__wrapped__", None)
            assert current in inner, patch.target
            assert cli._around_hook(current)[0] not in ours, patch.target
        # A module that imported a patched function by name sees upstream's too.
        assert importer.validate_cuda_graph_config is (
            cuda_graph_hook.validate_cuda_graph_config
        )
        upstream = cli.resolve(argv, graphfix=False)
    assert {p.target: _lookup(p.target) for p in PATCHES} == before
    assert importer.validate_cuda_graph_config is validate
    assert upstream.outcome.text.startswith(INDEX_ERROR)
    assert cli.resolve(argv).outcome.runs
    assert cli.resolve(argv, graphfix=False).outcome.text.startswith(INDEX_ERROR)


@pytest.mark.parametrize("switch", [False, True])
def test_granite_full_prefill_graph_in_both_mamba2_switch_states(
    capsys, plugin_on, monkeypatch, switch
):
    """GraniteMoeHybrid: upstream runs every prefill eagerly (its prefill graph
    setup finds no attention module in the Mamba2 layers); sglang-graphfix
    refuses the explicit full graph of the sample (float16, fa3), with the
    family's switch off as for the whole family, with it on naming the settings
    to change (the layer scan's hook keeps the graph for the Mamba2 layers; with
    MAMBA2_LAYER_GAPS_CAPTURED off it would name the scan)."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    monkeypatch.setattr(capability, "MAMBA2_FULL_PREFILL_GRAPH", switch)
    status, out = explain(
        capsys, "--sample", "granite-moe-hybrid", "--cuda-graph-backend-prefill", "full"
    )
    assert status == 1
    result = outcomes(out)
    assert result[UPSTREAM].startswith("runs: every prefill eager")
    assert "GraniteMoeHybrid's Mamba2 layers" in result[UPSTREAM]
    assert result[GRAPHFIX].startswith("refuses at startup")
    assert ("has no capturable extend" in result[GRAPHFIX]) == (not switch)
    assert "captures no prefill graph for this model" not in result[GRAPHFIX]
    fixes = "set --dtype bfloat16; set --attention-backend flashinfer"
    assert (fixes in " ".join(result[GRAPHFIX].split())) == switch


@pytest.mark.parametrize(
    "flags, kernel",
    [
        # sglang's own choice where FlashInfer's capture is validated (SM90)
        ([], "flashinfer where sglang picks it on SM90, else triton"),
        # elsewhere the graph captures Triton
        (["--gpu", "a100"], "triton"),
        # an explicit kernel is the one captured
        (["--linear-attn-prefill-backend", "triton"], "triton"),
    ],
)
def test_the_captured_gdn_prefill_kernel_is_named(capsys, plugin_on, flags, kernel):
    status, out = explain(capsys, *DEMO[1:], *flags)
    assert status == 0
    assert outcomes(out)[GRAPHFIX].endswith(
        f"GDN extend captured in the full prefill graph (prefill kernel {kernel})"
    )


@pytest.mark.parametrize("gaps_captured", [False, True])
def test_nemotron_h_with_mlp_layers_and_the_layer_gaps_switch(
    capsys, plugin_on, monkeypatch, tmp_path, gaps_captured
):
    """NemotronH with MLP layers (one group, bfloat16, flashinfer): upstream runs
    every prefill eagerly (its prefill graph setup finds no attention module in
    those layers); sglang-graphfix refuses the explicit full graph naming the
    layer scan with MAMBA2_LAYER_GAPS_CAPTURED off, and with it on (as shipped)
    runs the full graph (the scan's hook keeps it). With a MoE layer too, not
    checked on a GPU: refused either way, naming the layers it keeps."""
    import torch
    from tiny_configs import _nemotron_h

    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    def explained(pattern):
        path = tmp_path / pattern
        config = _nemotron_h(hybrid_override_pattern=pattern, mamba_n_groups=1)
        config.architectures = ["NemotronHForCausalLM"]
        config.dtype = torch.bfloat16
        config.save_pretrained(path)
        return explain(
            capsys, "--model-path", str(path), "--cuda-graph-backend-prefill",
            "full", "--attention-backend", "flashinfer",
        )  # fmt: skip

    monkeypatch.setattr(capability, "MAMBA2_LAYER_GAPS_CAPTURED", gaps_captured)
    status, out = explained("M-M*E")
    result = outcomes(out)
    assert result[UPSTREAM].startswith("runs: every prefill eager")
    assert "NemotronH's MLP ('-') and MoE ('E') layers" in result[UPSTREAM]
    assert status == 1 and "captures no prefill graph" in result[GRAPHFIX]
    covered = "keeps a full prefill graph across NemotronH's MLP layers"
    assert (covered in " ".join(result[GRAPHFIX].split())) == gaps_captured
    status, out = explained("M-M*-")
    result = outcomes(out)
    assert result[UPSTREAM].startswith("runs: every prefill eager")
    assert "NemotronH's MLP ('-') layers" in result[UPSTREAM]
    if gaps_captured:
        assert status == 0
        assert result[GRAPHFIX].startswith(
            "runs: prefill CUDA graph full, decode CUDA graph"
        )
        assert result[GRAPHFIX].endswith(
            "Mamba2 extend (MambaMixer2) captured in the full prefill graph"
        )
    else:
        assert status == 1
        assert result[GRAPHFIX].startswith("refuses at startup")
        assert "captures no prefill graph for this model" in result[GRAPHFIX]


@pytest.mark.parametrize("buckets_captured", [True, False])
def test_the_plan_names_the_request_buckets_of_a_mamba2_full_graph(
    capsys, plugin_on, monkeypatch, tmp_path, buckets_captured
):
    """A Mamba2 model whose full prefill graph runs as full (NemotronH with MLP
    layers) lists the request buckets its runner captures
    (MAMBA2_REQUEST_BUCKETS_CAPTURED, on as shipped: those below the slots, none
    with one slot); the switch off, a breakable graph on the same model, a
    Mamba2 full graph that runs as breakable (Falcon-H1) or a GDN model's full
    graph list none."""
    import torch
    from tiny_configs import _nemotron_h

    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    path = tmp_path / "nemotron_h"
    config = _nemotron_h(hybrid_override_pattern="M-M*-", mamba_n_groups=1)
    config.architectures = ["NemotronHForCausalLM"]
    config.dtype = torch.bfloat16
    config.save_pretrained(path)
    monkeypatch.setattr(capability, "MAMBA2_REQUEST_BUCKETS_CAPTURED", buckets_captured)

    def plan(*flags):
        status, out = explain(
            capsys, "--model-path", str(path), "--attention-backend", "flashinfer",
            *flags,
        )  # fmt: skip
        assert status == 0
        return " ".join(out.split("plan (with sglang-graphfix)")[1].split())

    def listed(counts, slots):
        return (
            f"request buckets token buckets up to 512 also have graphs over {counts} "
            "request slots (those below the bucket's tokens); a batch of fewer "
            f"requests than the {slots} slots replays the smallest that holds it"
        )

    full = plan("--cuda-graph-backend-prefill", "full")
    assert "prefill CUDA graph full" in full
    assert (listed("1/2/4/8", 16) in full) == buckets_captured
    assert "DP attention" not in full
    for slots, counts in ((4, "1/2"), (1, None)):
        config = {"prefill": {"backend": "full", "full_prefill_max_req": slots}}
        text = plan("--cuda-graph-config", json.dumps(config))
        assert f"request slots {slots}," in text
        if counts and buckets_captured:
            assert listed(counts, slots) in text
        else:
            assert "request buckets" not in text
    assert "request buckets" not in plan("--cuda-graph-backend-prefill", "breakable")
    dp = plan(
        "--cuda-graph-backend-prefill", "full", "--tp", "2", "--dp", "2",
        "--enable-dp-attention",
    )  # fmt: skip
    gathered = "request buckets none under DP attention"
    assert (gathered in dp) == buckets_captured
    assert "also have graphs" not in dp
    # As shipped, sglang's default buckets above REQUEST_BUCKET_MAX_TOKENS up to
    # 1536 (MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS) have one over one slot.
    shipped = "; token buckets above 512 up to 1536 also have a graph over 1 request"
    assert (shipped in full) == buckets_captured
    # Without those: only buckets above REQUEST_BUCKET_MAX_TOKENS, none; a request
    # pool of two requests: the runner's slots are two, so one request bucket.
    monkeypatch.setattr(capability, "MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS", 0)
    large = {"prefill": {"backend": "full", "bs": [1024, 2048]}}
    assert "request buckets" not in plan("--cuda-graph-config", json.dumps(large))
    # With single-request graphs above the bound, those buckets have one over
    # one slot.
    monkeypatch.setattr(capability, "MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS", 1024)
    single = (
        "request buckets token buckets above 512 up to 1024 also have a graph over "
        "1 request slot, which a batch of one request replays"
    )
    assert (single in plan("--cuda-graph-config", json.dumps(large))) == (
        buckets_captured
    )
    both = plan("--cuda-graph-config", json.dumps({"prefill": {
        "backend": "full", "bs": [256, 512, 1024, 2048]}}))  # fmt: skip
    if buckets_captured:
        assert listed("1/2/4/8", 16) in both
        assert "; token buckets above 512 up to 1024 also have a graph over 1" in both
    # The largest such bucket, within the long-prefill bound (1536 as shipped:
    # 2048 is above it), the context length (sglang's capture batch of 2048
    # tokens is two requests at 1024) and only with more than one slot.
    monkeypatch.setattr(capability, "MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS", 2048)
    three = {"prefill": {"backend": "full", "bs": [1024, 2048, 4096]}}
    assert "up to 2048 also have a graph" not in plan(
        "--cuda-graph-config", json.dumps(three)
    )
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", None)
    if buckets_captured:
        assert "above 512 up to 2048 also have a graph" in plan(
            "--cuda-graph-config", json.dumps(three)
        )
        short = plan(
            "--cuda-graph-config", json.dumps(three), "--context-length", "1024"
        )
        assert "above 512 up to 1024 also have a graph" in short
    one = plan("--cuda-graph-config", json.dumps(three), "--max-running-requests", "1")
    assert "also have a graph over 1" not in one
    monkeypatch.setattr(capability, "MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS", 0)
    text = plan("--cuda-graph-backend-prefill", "full", "--max-running-requests", "2")
    if buckets_captured:
        assert listed("1", 2).replace("1 request slots", "1 request slot") in text
    # sglang-graphfix off: upstream's plan has no request buckets.
    monkeypatch.setenv("SGLANG_GRAPHFIX", "0")
    status, out = explain(
        capsys, "--model-path", str(path), "--attention-backend", "flashinfer",
        "--cuda-graph-backend-prefill", "full",
    )  # fmt: skip
    assert "plan (upstream sglang)" in out and "request buckets" not in out
    monkeypatch.delenv("SGLANG_GRAPHFIX")
    # LFM2's short conv captures no request buckets (Mamba2 only).
    status, out = explain(
        capsys, "--sample", "lfm2", "--cuda-graph-backend-prefill", "full",
        "--attention-backend", "flashinfer", "--dtype", "bfloat16",
    )  # fmt: skip
    assert status == 0 and "prefill CUDA graph  full" in out
    assert "request buckets" not in out
    assert "short-conv extend (sglang's conv kernel) captured" in " ".join(out.split())
    assert "MambaMixer2" not in out
    status, out = explain(
        capsys, "--sample", "falcon-h1", "--cuda-graph-backend-prefill", "full",
        "--attention-backend", "flashinfer",
    )  # fmt: skip
    assert status == 0 and "prefill CUDA graph  breakable" in out
    assert "request buckets" not in out
    status, out = explain(capsys, *DEMO[1:])
    assert status == 0 and "prefill CUDA graph  full" in out
    assert "request buckets" not in out


def test_the_plan_names_the_long_prefill_limit_of_a_mamba2_full_graph(
    capsys, plugin_on, monkeypatch, tmp_path
):
    """With MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST set (1536 as shipped), a Mamba2
    model whose full graph runs as full says which batches run eager; its
    breakable graph, LFM2's full graph and the limit unset say nothing."""
    import torch
    from tiny_configs import _nemotron_h

    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    path = tmp_path / "nemotron_h"
    config = _nemotron_h(hybrid_override_pattern="M-M*-", mamba_n_groups=1)
    config.architectures = ["NemotronHForCausalLM"]
    config.dtype = torch.bfloat16
    config.save_pretrained(path)

    def plan(*flags):
        status, out = explain(capsys, *flags, "--attention-backend", "flashinfer")
        assert status == 0
        return " ".join(out.split("plan (with sglang-graphfix)")[1].split())

    nemotron = ("--model-path", str(path), "--cuda-graph-backend-prefill")
    line = (
        "long prefills a batch of more than {} new tokens per request on average "
        "runs eager"
    )
    assert line.format(1536) in plan(*nemotron, "full")
    # Buckets of up to 512 tokens hold no batch above the bound: no line, as the
    # runner logs none.
    assert "long prefills" not in plan(
        *nemotron, "full", "--chunked-prefill-size", "512"
    )
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", None)
    assert "long prefills" not in plan(*nemotron, "full")
    monkeypatch.setattr(capability, "MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST", 1024)
    assert line.format(1024) in plan(*nemotron, "full")
    assert "long prefills" not in plan(*nemotron, "breakable")
    lfm2 = plan(
        "--sample", "lfm2", "--cuda-graph-backend-prefill", "full", "--dtype",
        "bfloat16",
    )  # fmt: skip
    assert "prefill CUDA graph full" in lfm2 and "long prefills" not in lfm2
    dp = plan(
        *nemotron, "full", "--tp", "2", "--dp", "2", "--enable-dp-attention",
    )  # fmt: skip
    assert "long prefills not routed under DP attention" in dp
    assert "runs eager" not in dp.split("long prefills")[1].split("decode")[0]


def test_falcon_h1_sample_runs_breakable_for_a_full_graph(
    capsys, plugin_on, monkeypatch
):
    """The shipped Falcon-H1 config (bfloat16, one group) with the Mamba2-checked
    attention backend: upstream crashes at capture; sglang-graphfix runs the
    breakable graph, faster there (route_mamba2_full_prefill_to_breakable), and
    says why; with MAMBA2_FULL_BEATS_BREAKABLE on it names the extend the full
    graph captures."""
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    flags = ("--sample", "falcon-h1", "--cuda-graph-backend-prefill", "full",
             "--attention-backend", "flashinfer")  # fmt: skip
    status, out = explain(capsys, *flags)
    assert status == 0
    result = outcomes(out)
    assert result[UPSTREAM].startswith(INDEX_ERROR)
    assert (
        result[GRAPHFIX] == "runs: prefill CUDA graph breakable, decode CUDA graph full"
    )
    joined = " ".join(out.split())
    assert "median time to first token was below the full graph's" in joined
    assert (
        "full prefill graph can capture here; asked for, it runs as breakable on "
        "this model, faster here (the warning below)"
    ) in joined
    assert "sglang_graphfix:mamba2_full_prefill_to_breakable" in joined
    monkeypatch.setattr(capability, "MAMBA2_FULL_BEATS_BREAKABLE", True)
    status, out = explain(capsys, *flags)
    assert status == 0
    assert outcomes(out)[GRAPHFIX] == (
        "runs: prefill CUDA graph full, decode CUDA graph full; Mamba2 extend "
        "(MambaMixer2) captured in the full prefill graph"
    )


def test_the_inkling_sample_is_explained(capsys, plugin_on):
    """Inkling's full prefill graph (its model default) on the default GPU: the
    plan's Mamba2 lines read no Mamba2 config of it (its short conv is its own
    family), so explain prints the plan instead of failing on sglang's
    unpublished runtime context."""
    status, out = explain(capsys, "--sample", "inkling")
    assert status == 0 and "prefill CUDA graph  full" in out
    assert "request buckets" not in out and "long prefills" not in out
