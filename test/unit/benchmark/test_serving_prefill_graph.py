"""benchmark/serving_prefill_graph.py's model: the config sglang is served with
resolves as the published Qwen3-Next-80B-A3B-FP8 checkpoint does (sglang's own
ModelConfig dtype and quantization resolution, on CPU)."""

import json
from pathlib import Path

import pytest
import torch
from benchmark_modules import load_benchmark
from transformers import AutoConfig

from sglang.srt.configs.model_config import _get_and_verify_dtype


def test_served_model_is_bfloat16_with_fp8_blocks(tmp_path):
    """Without a config dtype sglang's "auto" serves float16, which is not the
    published model and crashed sglang's breakable prefill graph on the mamba
    track copy (bf16 conv state, fp16 activations)."""
    bench = load_benchmark("serving_prefill_graph")
    bench.qwen3_next_80b_a3b_fp8(tmp_path, layers=4)
    config = AutoConfig.from_pretrained(tmp_path)
    assert _get_and_verify_dtype(config, "auto") == torch.bfloat16
    assert config.quantization_config["weight_block_size"] == [128, 128]
    assert config.num_hidden_layers == 4 and config.full_attention_interval == 4


def test_served_qwen3_5_is_the_published_text_model_and_fits_an_h100(tmp_path):
    """Qwen3.5-35B-A3B as its servers read it (sglang's ModelConfig and model
    registry): the text model sglang serves, bfloat16 with FP8 blocks but for the
    GDN b/a projections and the shared-expert gates, 30 GDN and 10 attention
    layers of the published dimensions, rotary base 1e7 in sglang's own field;
    its full mode resolves to the full graph on a simulated H100 (the card it is
    for: its FP8 weights fit one)."""
    from resolution import prefill_backend, resolved

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.models.registry import ModelRegistry

    bench = load_benchmark("serving_prefill_graph")
    bench.MODELS["qwen3.5-35b-a3b-fp8"](tmp_path)
    model = ModelConfig(str(tmp_path), context_length=8192)
    config = model.hf_config
    assert type(config).__module__ == "sglang.srt.configs.qwen3_5"
    assert model.dtype == torch.bfloat16 and model.quantization == "fp8"
    assert len(config.linear_layer_ids) == 30
    assert config.full_attention_layer_ids == list(range(3, 40, 4))
    assert (config.num_experts, config.num_experts_per_tok) == (256, 8)
    assert (config.linear_num_key_heads, config.linear_num_value_heads) == (16, 32)
    assert (config.head_dim, config.vocab_size) == (256, 248320)
    assert config.rope_theta == 1e7 and config.partial_rotary_factor == 0.25
    ModelRegistry.resolve_model_cls(config.architectures)
    args = resolved(str(tmp_path), gpu="h100", cuda_graph_backend_prefill="full")
    assert prefill_backend(args) == Backend.FULL


@pytest.mark.parametrize("model", ["qwen3-next-80b-a3b-fp8", "qwen3.5-35b-a3b-fp8"])
def test_served_fp8_keeps_what_is_smaller_than_a_block_unquantized(tmp_path, model):
    """The FP8 models' quantization_config as sglang's loader reads it (its own
    quantization config with the model class's fused-module mapping), asked for
    each layer's linear method: the GDN b/a projection (2 x 32 outputs) and the
    shared-expert gate (1) stay bfloat16, where [128, 128] blocks would stop the
    server while it builds the model; the GDN qkvz projection is FP8."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.linear import MergedColumnParallelLinear
    from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
    from sglang.srt.model_loader.loader import _get_quantization_config

    bench = load_benchmark("serving_prefill_graph")
    bench.MODELS[model](tmp_path)
    config = ModelConfig(str(tmp_path))
    quant = _get_quantization_config(config, LoadConfig(load_format="dummy"))
    # get_quant_method asks only the layer's class before the prefix.
    layer = object.__new__(MergedColumnParallelLinear)
    for i in range(config.hf_config.num_hidden_layers):
        for name in ("linear_attn.in_proj_ba", "mlp.shared_expert_gate"):
            method = quant.get_quant_method(layer, f"model.layers.{i}.{name}")
            assert isinstance(method, UnquantizedLinearMethod), (i, name)
    qkvz = quant.get_quant_method(layer, "model.layers.0.linear_attn.in_proj_qkvz")
    assert isinstance(qkvz, Fp8LinearMethod)


def test_served_qwen3_5_builds_in_sglang_and_fits_an_h100(tmp_path):
    """sglang's own Qwen3_5MoeForCausalLM built for the served config at full
    depth (meta device, in a subprocess: build_served_model.py), with the
    quantization config its loader reads: it builds (block-quantized modules of
    fewer outputs than a block stop the build, as a server's would), with FP8
    experts and projections and bfloat16 embeddings, norms and the small
    modules, about 36 GB of weights in all: an H100 holds them."""
    from meta_subprocess import run_meta_script

    script = Path(__file__).resolve().parent / "build_served_model.py"
    sizes = run_meta_script(script, "qwen3.5-35b-a3b-fp8", str(tmp_path), "40")
    assert set(sizes) == {"torch.float8_e4m3fn", "torch.bfloat16", "torch.float32"}
    assert 33e9 < sizes["torch.float8_e4m3fn"] < 34e9
    assert 2e9 < sizes["torch.bfloat16"] < 2.2e9
    assert 35e9 < sum(sizes.values()) < 37e9


def test_served_falcon_h1_full_mode_is_what_users_get(tmp_path, monkeypatch):
    """The Mamba2 serving model resolves through sglang's resolution (on a
    simulated H200) with the flags every mode gets: its full mode runs as
    breakable as shipped (route_mamba2_full_prefill_to_breakable: what a user
    asking for full gets), and captures the full graph once
    MAMBA2_FULL_BEATS_BREAKABLE is on (as the test probe sets it); without the
    flags that graph is refused (sglang picks fa3 there)."""
    from resolution import prefill_backend, resolved

    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    bench = load_benchmark("serving_prefill_graph")
    bench.falcon_h1_7b(tmp_path, layers=2)
    flags = bench.SERVER_ARGS["falcon-h1-7b"]
    assert flags == ["--attention-backend", "flashinfer"]

    def full(**kwargs):
        return resolved(
            str(tmp_path), gpu="h200", cuda_graph_backend_prefill="full", **kwargs
        )

    assert prefill_backend(full(attention_backend=flags[1])) == Backend.BREAKABLE
    monkeypatch.setattr(capability, "MAMBA2_FULL_BEATS_BREAKABLE", True)
    assert prefill_backend(full(attention_backend=flags[1])) == Backend.FULL
    with pytest.raises(ValueError, match="set --attention-backend flashinfer"):
        full()
    command = bench.server_command(tmp_path, "full", 1, _Args("falcon-h1-7b"))
    assert command[-2:] == flags


def _served(bench, model, path):
    """``--model model`` as written for its servers, as sglang's ModelConfig reads
    it, and its full mode resolved with the flags every mode gets (on a
    simulated H200)."""
    from resolution import resolved

    from sglang.srt.configs.model_config import ModelConfig

    bench.MODELS[model](path)
    flags = bench.SERVER_ARGS[model]
    assert flags == ["--attention-backend", "flashinfer"]
    args = resolved(
        str(path), cuda_graph_backend_prefill="full", attention_backend=flags[1]
    )
    return ModelConfig(str(path), context_length=8192), args


def test_served_granite_is_a_dense_hybrid_its_full_mode_keeps(tmp_path):
    """The Granite-4.0-H-Micro layout as sglang reads it: 36 Mamba2 and 4
    attention layers (32 / 8 heads), a dense MLP of 8192 and no experts, no
    position embedding, Mamba2 of 64 heads of 64 in one group with state 128;
    its full mode resolves to the full graph, and (as the capability model reads
    sglang's layer scan) sglang's breakable would turn its prefill graph off."""
    from resolution import prefill_backend

    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang_graphfix.srt.full_prefill_graph_capability import (
        mamba2_config,
        prefill_graph_turned_off,
    )

    bench = load_benchmark("serving_prefill_graph")
    model, args = _served(bench, "granite-4.0-h-micro", tmp_path)
    config = model.hf_config
    assert [i for i, t in enumerate(config.layer_types) if t != "mamba"] == [
        5,
        15,
        25,
        35,
    ]
    assert (config.num_local_experts, config.shared_intermediate_size) == (0, 8192)
    assert (config.num_attention_heads, config.num_key_value_heads) == (32, 8)
    assert config.position_embedding_type == "nope"
    assert (config.embedding_multiplier, config.logits_scaling) == (12.0, 8.0)
    mamba = mamba2_config(model)
    assert (mamba.mamba_n_heads, mamba.mamba_d_head, mamba.mamba_n_groups) == (
        64,
        64,
        1,
    )
    assert (mamba.mamba_d_state, mamba.mamba_chunk_size) == (128, 256)
    assert bench.default_context_length(tmp_path) == bench.CONTEXT_LENGTH
    assert prefill_backend(args) == Backend.FULL
    assert prefill_graph_turned_off(model, "breakable", 90) is not None


def test_served_lfm2_is_short_conv_its_full_mode_keeps(tmp_path):
    """The LFM2-2.6B layout as sglang reads it: 22 short-conv and 8 attention
    layers, hidden 2048, 32 / 8 heads, an MLP of 10752 (no auto-adjust); its
    full mode resolves to the full graph, and sglang's breakable would turn its
    prefill graph off (as the capability model reads sglang's layer scan)."""
    from resolution import prefill_backend

    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang_graphfix.srt.full_prefill_graph_capability import (
        prefill_graph_turned_off,
    )

    bench = load_benchmark("serving_prefill_graph")
    model, args = _served(bench, "lfm2-2.6b", tmp_path)
    config = model.hf_config
    assert config.full_attention_layer_ids == [2, 5, 9, 13, 17, 21, 24, 27]
    assert len(config.linear_layer_ids) == 22
    assert (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
    ) == (2048, 32, 8)
    assert (config.intermediate_size, config.block_auto_adjust_ff_dim) == (10752, False)
    assert prefill_backend(args) == Backend.FULL
    assert prefill_graph_turned_off(model, "breakable", 90) is not None


def test_servers_get_a_context_the_model_holds(tmp_path):
    """Nemotron-H-8B's config sets 8192 positions; sglang refuses a longer
    --context-length than the model's, so its servers get 8192 unless told."""
    from sglang.srt.configs.model_config import ModelConfig

    bench = load_benchmark("serving_prefill_graph")
    for build, context in ((bench.nemotron_h_8b, 8192), (bench.falcon_h1_7b, 20480)):
        path = tmp_path / build.__name__
        build(path)
        assert bench.default_context_length(path) == context
        config = ModelConfig(str(path), context_length=context)
        assert config.context_len == context
    with pytest.raises(ValueError, match="greater than the derived context_length"):
        ModelConfig(
            str(tmp_path / "nemotron_h_8b"), context_length=bench.CONTEXT_LENGTH
        )


def test_main_serves_nemotron_h_8b_within_its_positions(tmp_path, monkeypatch):
    """Without --context-length, main() gives Nemotron-H-8B's servers its 8192
    positions (every mode's server command), and plans no run beyond them."""
    import sys

    bench = load_benchmark("serving_prefill_graph")
    commands = []

    def run_mode(model_dir, mode, args, log_dir, entry, save):
        commands.append(bench.server_command(model_dir, mode, 1, args))
        entry["planned"] = [
            r[0] for r, _ in bench.plan_runs(args.workloads, args.context_length)[0]
        ]
        save()

    monkeypatch.setattr(bench, "run_mode", run_mode)
    monkeypatch.setattr(bench, "client_import_error", lambda module=None: None)
    monkeypatch.setattr(bench, "exit_on_sigterm", lambda: None)
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(
        bench.tempfile, "mkdtemp", lambda prefix: str(tmp_path / prefix)
    )
    (tmp_path / "nemotron-h-8b_").mkdir()
    (tmp_path / "serving_logs").mkdir()
    output = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", [
        "serving_prefill_graph.py", "--model", "nemotron-h-8b", "--modes",
        "full,breakable", "--workloads", "long", "--output", str(output),
    ])  # fmt: skip
    bench.main()
    assert len(commands) == 2
    for command in commands:
        assert command[command.index("--context-length") + 1] == "8192"
    planned = json.loads(output.read_text())["modes"]["full"]["planned"]
    assert "long 8k-16k" not in planned and "1 x 4k-8k tokens" in planned


def test_runs_beyond_the_context_are_skipped_with_the_reason():
    """At Nemotron-H-8B's 8192-token context the 8k-16k prompts would be
    rejected: the plan leaves them out (their warm-up too, replaced by the
    longest run that fits) and says why; at 20480 every run is planned."""
    bench = load_benchmark("serving_prefill_graph")
    workloads = ["burst", "long"]
    plan, skipped = bench.plan_runs(workloads, 20480)
    assert skipped == {}
    assert [r[0] for r, warmup in plan if warmup] == [
        bench.WARMUP[w] for w in workloads
    ]
    assert [r for r, warmup in plan if not warmup] == [
        run for w in workloads for run in bench.WORKLOADS[w]
    ]
    plan, skipped = bench.plan_runs(workloads, 8192)
    assert list(skipped) == ["long 8k-16k"]
    assert "--context-length 8192" in skipped["long 8k-16k"]
    assert [r[0] for r, warmup in plan if warmup] == [
        "8 x 64 tokens",
        "1 x 4k-8k tokens",
    ]
    measured = [r[0] for r, warmup in plan if not warmup]
    assert "long 8k-16k" not in measured and "1 x 2k-4k tokens" in measured
    # 8000 + 8 tokens: in at a context of 8010, out at 8009 (sglang's limits).
    assert "1 x 4k-8k tokens" not in bench.plan_runs(["long"], 8010)[1]
    assert "1 x 4k-8k tokens" in bench.plan_runs(["long"], 8009)[1]
    assert bench.plan_runs(["long"], 1024) == ([], {
        run[0]: f"prompts of up to {run[1]} tokens and {run[2]} output tokens "
        "exceed the servers' --context-length 1024"
        for run in bench.WORKLOADS["long"]
    })  # fmt: skip


def test_the_size_sweep_fits_and_is_told_apart_from_the_other_runs():
    """The "sizes" workload (one prompt of 512-3072 tokens, four of 512 or 1024)
    is left out of the default workloads, fits Nemotron-H-8B's context whole,
    and each run has its own label and its own sglang.benchmark.serving
    parameters, by which --recover finds it."""
    bench = load_benchmark("serving_prefill_graph")
    assert "sizes" not in bench.DEFAULT_WORKLOADS.split(",")
    assert set(bench.DEFAULT_WORKLOADS.split(",")) < set(bench.WORKLOADS)
    plan, skipped = bench.plan_runs(["sizes"], 8192)
    assert skipped == {}
    assert [r[0] for r, warmup in plan if warmup] == ["4 x 1024 tokens"]
    assert [r[0] for r, warmup in plan if not warmup] == [
        "1 x 512 tokens", "1 x 768 tokens", "1 x 1024 tokens", "1 x 1536 tokens",
        "1 x 2048 tokens", "1 x 3072 tokens", "4 x 512 tokens", "4 x 1024 tokens",
    ]  # fmt: skip
    runs = [run for runs in bench.WORKLOADS.values() for run in runs]
    assert len({run[0] for run in runs}) == len(runs)
    assert len({run[1:6] for run in runs}) == len(runs)


def test_crossover_is_the_last_prompt_length_before_full_first_lost(
    tmp_path, capsys, monkeypatch
):
    """--crossover reads the sizes runs of full and breakable and names the most
    tokens per request up to which full never lost (the runs from the first
    loss on, four-request runs included, stay above it), and that first loss;
    None when full lost none; runs a mode lacks are left out."""
    bench = load_benchmark("serving_prefill_graph")

    def report(full):
        return {
            "modes": {
                mode: {
                    "runs": {
                        f"{n} x {t} tokens": {"median_ttft_ms": ms}
                        for (n, t), ms in times.items()
                    }
                }
                for mode, times in (("full", full), ("breakable", BREAKABLE))
            }
        }

    BREAKABLE = {(1, 512): 60.0, (1, 768): 70.0, (1, 1024): 80.0, (1, 1536): 90.0,
                 (1, 2048): 100.0, (1, 3072): 120.0, (4, 512): 150.0, (4, 1024): 300.0}  # fmt: skip
    wins = {k: v / 2 for k, v in BREAKABLE.items()}
    assert bench.crossover(report(wins))["bound"] is None
    assert bench.crossover(report(wins))["first_loss"] is None
    # Lost at 1 x 1536, won at 2048 again, lost at 3072: the bound stops at the
    # first loss, 1024 (4 x 1024 won as well).
    later = {**wins, (1, 1536): 91.0, (1, 2048): 99.0, (1, 3072): 130.0}
    result = bench.crossover(report(later))
    assert result["bound"] == 1024
    assert [r["tokens_per_request"] for r in result["runs"]] == [
        512, 512, 768, 1024, 1024, 1536, 2048, 3072
    ]  # fmt: skip
    # Four requests of 1024 lost: 1024 is out, whatever one request did.
    assert bench.crossover(report({**later, (4, 1024): 301.0}))["bound"] == 768
    assert bench.crossover(report({**wins, (1, 512): 61.0}))["bound"] == 0
    # Without breakable's 1 x 1536 run the first loss is at 3072.
    partial = report(later)
    del partial["modes"]["breakable"]["runs"]["1 x 1536 tokens"]
    result = bench.crossover(partial)
    assert (result["bound"], len(result["runs"])) == (2048, 7)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report(later)))
    monkeypatch.setattr(
        "sys.argv", ["serving_prefill_graph.py", "--crossover", str(path)]
    )
    bench.main()
    printed = json.loads(capsys.readouterr().out)
    assert (printed["first_loss"], printed["bound"]) == (1536, 1024)


def test_crossover_against_routed_eager_reads_the_runs_that_server_sent_eager(
    tmp_path, capsys, monkeypatch
):
    """--crossover FILE --routed FILE2: the base of a run is FILE2's full server
    where that run's prefill batches were mostly eager (its bound below the
    run), not breakable; runs that replayed the graph there are left out."""
    bench = load_benchmark("serving_prefill_graph")

    def run(ms, graph=0, eager=14):
        return {
            "median_ttft_ms": ms,
            "prefill_batches": {"graph": graph, "eager": eager},
        }

    graph = {"1 x 512 tokens": 30.0, "1 x 768 tokens": 44.0, "1 x 1024 tokens": 53.0,
             "4 x 1024 tokens": 141.0,
             "1 x 1536 tokens": 66.0, "1 x 2048 tokens": 81.0, "1 x 3072 tokens": 105.0}  # fmt: skip
    report = {
        "modes": {
            "full": {"runs": {k: run(v, graph=16, eager=0) for k, v in graph.items()}},
            # Faster than full everywhere: against it the bound would be 0.
            "breakable": {"runs": {k: run(v - 10) for k, v in graph.items()}},
        }
    }
    routed = {
        "modes": {
            "full": {
                "runs": {
                    "1 x 512 tokens": run(20.0, graph=16, eager=0),  # replayed there
                    "1 x 768 tokens": run(10.0, graph=7, eager=7),  # not mostly eager
                    "1 x 1024 tokens": run(71.0, graph=2),
                    "4 x 1024 tokens": run(149.0, graph=0, eager=26),
                    "1 x 1536 tokens": run(80.0, graph=2),
                    "1 x 2048 tokens": run(78.0, graph=2),
                    "1 x 3072 tokens": run(100.0, graph=2),
                }
            }
        }
    }
    assert bench.crossover(report)["bound"] == 0
    result = bench.crossover(report, base="routed eager", routed=routed)
    assert (result["first_loss"], result["bound"]) == (2048, 1536)
    assert [r["label"] for r in result["runs"]][0] == "1 x 1024 tokens"
    paths = tmp_path / "graph.json", tmp_path / "routed.json"
    for path, content in zip(paths, (report, routed)):
        path.write_text(json.dumps(content))
    monkeypatch.setattr(
        "sys.argv",
        ["serving_prefill_graph.py", "--crossover", str(paths[0]), "--routed", str(paths[1])],
    )  # fmt: skip
    bench.main()
    printed = json.loads(capsys.readouterr().out)
    assert (printed["base"], printed["bound"]) == ("routed eager", 1536)
    # Nothing ran eager there (the files swapped): an error, not "never lost".
    with pytest.raises(ValueError, match="ran eager"):
        bench.crossover(routed, base="routed eager", routed=report)
    monkeypatch.setattr("sys.argv", ["serving_prefill_graph.py", "--routed", "x.json"])
    with pytest.raises(SystemExit):
        bench.main()


class _Args:
    def __init__(self, model):
        self.model, self.context_length, self.mem_fraction_static = model, 4096, 0.8
        self.server_args = []


def _row(mode, inp, outp, ratio, rate, conc, ttft):
    return {
        "random_input_len": inp,
        "random_output_len": outp,
        "random_range_ratio": ratio,
        "request_rate": rate,
        "max_concurrency": conc,
        "server_info": {"cuda_graph_backend_prefill": mode},
        "median_ttft_ms": ttft,
    }


@pytest.mark.parametrize("gzipped", [False, True], ids=["as_written", "compacted"])
def test_recover_rebuilds_a_mode_cut_short_from_the_jsonl_rows(tmp_path, gzipped):
    """A mode whose report entry was never written gets its runs back from
    sglang.benchmark.serving's JSONL rows, each matched to its workload by its
    parameters and to its mode by the server's prefill backend; warm-up rows
    and runs already in the report are left as they are. The same from a
    committed folder, whose logs and rows benchmark/compact_results.sh gzipped."""
    import gzip
    import json

    def write(path, text):
        if gzipped:
            with gzip.open(f"{path}.gz", "wt") as f:
                f.write(text)
        else:
            path.write_text(text)

    bench = load_benchmark("serving_prefill_graph")
    logs = tmp_path / "logs"
    logs.mkdir()
    report = {
        "modes": {"breakable": {"runs": {"1 x 16 tokens": {"median_ttft_ms": 48.0}}}}
    }
    (tmp_path / bench.RESULT).write_text(json.dumps(report))
    rows = {
        "bench_1_a.jsonl": _row("full", 16, 1, 1.0, float("inf"), 1, 26.0),
        "bench_1_b.jsonl": _row("full", 512, 32, 1 / 32, 8.0, None, 45.0),
        "bench_1_warmup_c.jsonl": _row("full", 64, 1, 1.0, float("inf"), 8, 999.0),
        "bench_2_d.jsonl": _row("breakable", 16, 1, 1.0, float("inf"), 1, 1.0),
    }
    for name, row in rows.items():
        row["ttfts"], row["errors"] = [0.026, 0.0], ["", "server gone"]
        write(logs / name, json.dumps({"ignored": 1}) + "\n" + json.dumps(row))
    write(
        logs / "server_full.log",
        "[2026-12-01 20:05:24] sglang-graphfix 0.1.0: applied 20 patches\n"
        "[2026-12-01 20:07:38] The server is fired up and ready to roll!\n",
    )
    recovered = bench.recover(tmp_path)["modes"]
    full = recovered["full"]
    assert list(full["runs"]) == ["chat rate 8", "1 x 16 tokens"]  # WORKLOADS order
    assert full["runs"]["1 x 16 tokens"]["median_ttft_ms"] == 26.0
    # Each request's (--output-details), a failed one as None, not sglang's 0.
    assert full["runs"]["1 x 16 tokens"]["ttfts_ms"] == [26.0, None]
    assert full["recovered_from_jsonl"] == ["1 x 16 tokens", "chat rate 8"]
    assert full["server_log"]["ready_s"] == 134.0
    assert full["server_log"]["graphfix_line"].endswith("applied 20 patches")
    assert recovered["breakable"]["runs"]["1 x 16 tokens"]["median_ttft_ms"] == 48.0


def test_prefill_batches_counts_sglangs_per_batch_graph_flag():
    bench = load_benchmark("serving_prefill_graph")
    log = "\n".join(
        [
            "[t] Prefill batch, #new-seq: 35, #new-token: 1111, cuda graph: False, x",
            "[t] Prefill batch, #new-seq: 16, #new-token: 402, cuda graph: True, x",
            "[t] Decode batch, #running-req: 2, cuda graph: True",
            "[t] Prefill batch, #new-seq: 1, #new-token: 1, cuda graph: False, x",
        ]
    )
    assert bench.prefill_batches(log) == {
        "graph": 1,
        "eager": 2,
        "eager_requests_max": 35,
    }


def test_every_run_draws_its_own_prompts():
    bench = load_benchmark("serving_prefill_graph")
    labels = [run[0] for runs in bench.WORKLOADS.values() for run in runs]
    seeds = [bench.run_seed(label) for label in labels]
    seeds += [bench.run_seed(label, warmup=True) for label in labels]
    assert len(set(seeds)) == len(seeds)
    assert set(bench.WARMUP) == set(bench.WORKLOADS)
    assert all(
        label in {run[0] for run in bench.WORKLOADS[w]}
        for w, label in bench.WARMUP.items()
    )


# A stand-in for sglang.benchmark.serving: cli_main reads its argv as the real
# one does (sys.argv), writes one JSONL row to --output-file, or fails on seed 7.
FAKE_SERVING = """
import json, os, sys

def cli_main():
    argv = sys.argv[1:]
    seed = argv[argv.index("--seed") + 1]
    if seed == "7":
        raise RuntimeError("server gone")
    path = argv[argv.index("--output-file") + 1]
    with open(path, "a") as f:
        row = {"median_ttft_ms": float(seed), "client_pid": os.getpid()}
        if "--output-details" in argv:
            row["ttfts"] = [0.0123456, 0.5]
        f.write(json.dumps(row) + "\\n")
    print("benchmark done", seed)
"""


def test_one_client_process_runs_every_benchmark_of_a_server(tmp_path, monkeypatch):
    """bench() sends its sglang.benchmark.serving command line to one client
    process, which runs cli_main on it: every run in the same process, a failed
    run reported without ending the client."""
    (tmp_path / "fake_serving.py").write_text(FAKE_SERVING)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    bench = load_benchmark("serving_prefill_graph")
    client = bench.BenchClient("fake_serving")
    try:
        pids = []
        for seed in (1, 2):
            out = tmp_path / f"run{seed}.jsonl"
            argv = ["--seed", str(seed), "--output-file", str(out)]
            status, output = client.run(argv, timeout=60)
            assert (status, output.strip()) == ("ok", f"benchmark done {seed}")
            pids.append(json.loads(out.read_text())["client_pid"])
        assert pids[0] == pids[1] == client.proc.pid
        status, _ = client.run(["--seed", "7"], timeout=60)
        assert status == "RuntimeError: server gone"
        status, _ = client.run(["--seed", "3", "--output-file", str(out)], timeout=60)
        assert status == "ok"
        # bench() on the client: the run's row, its command as the CLI's
        run = ("1 x 16 tokens", 16, 1, 1.0, float("inf"), 1, 40)
        cmd, result = bench.bench(tmp_path, 1234, run, 1.0, tmp_path, client=client)
        assert cmd[1:3] == ["-m", "sglang.benchmark.serving"]
        assert result["median_ttft_ms"] == bench.run_seed("1 x 16 tokens")
        # Each request's time to first token (--output-details), in ms.
        assert "--output-details" in cmd and result["ttfts_ms"] == [12.35, 500.0]
    finally:
        client.close()
    assert client.proc.poll() is not None


def test_profiled_falcon_h1_is_the_served_one_and_captures_the_full_graph(
    monkeypatch, tmp_path
):
    """benchmark/prefill_graph_latency.py --models falcon-h1-7b profiles the
    checkpoint and flags the serving run measured, with the switch that keeps
    its full graph (which sglang-graphfix runs as breakable as shipped) set in
    this process and handed to the engines through the test probe; its engine
    kwargs then resolve to a full prefill graph and to breakable."""
    from resolution import prefill_backend, resolved

    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    serving = load_benchmark("serving_prefill_graph")
    latency = load_benchmark("prefill_graph_latency")
    monkeypatch.setattr(
        latency.tempfile, "mkdtemp", lambda prefix: str(tmp_path / prefix)
    )
    monkeypatch.setattr(capability, "MAMBA2_FULL_BEATS_BREAKABLE", False)
    monkeypatch.setattr(capability, "MAMBA2_REQUEST_BUCKETS_CAPTURED", False)
    spec = latency._specs()["falcon-h1-7b"]()
    served = tmp_path / "served"
    serving.falcon_h1_7b(served)
    model = json.loads((tmp_path / "falcon_h1_7b" / "config.json").read_text())
    assert model == json.loads((served / "config.json").read_text())
    assert spec["kwargs"]["attention_backend"] == serving.SERVER_ARGS["falcon-h1-7b"][1]
    assert latency.switches(spec) == {
        "GRAPHFIX_PROBE_MAMBA2_FULL_BEATS_BREAKABLE": "1",
        "GRAPHFIX_PROBE_MAMBA2_REQUEST_BUCKETS_CAPTURED": "1",
    }
    assert capability.MAMBA2_FULL_BEATS_BREAKABLE is True
    assert capability.MAMBA2_REQUEST_BUCKETS_CAPTURED is True
    for name, backend in (("full", Backend.FULL), ("breakable", Backend.BREAKABLE)):
        kwargs = latency._engine_kwargs(spec, latency.PREFILL[name])
        path = kwargs.pop("model_path")
        assert prefill_backend(resolved(path, gpu="h200", **kwargs)) == backend


def test_a_client_that_does_not_import_stops_the_run_before_any_server(
    tmp_path, monkeypatch
):
    """On the 2026-12-03 H200 bundle sglang.benchmark.serving did not import (no
    datasets): every run failed, each after its server had started. main() now
    names the import error and starts no server."""
    (tmp_path / "broken_serving.py").write_text("import datasets_missing_here\n")
    (tmp_path / "fake_serving.py").write_text(FAKE_SERVING)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    bench = load_benchmark("serving_prefill_graph")
    assert bench.client_import_error("fake_serving") is None
    error = bench.client_import_error("broken_serving")
    assert "No module named 'datasets_missing_here'" in error

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(bench, "BENCH_MODULE", "broken_serving")
    monkeypatch.setattr(bench, "run_mode", no_server)
    monkeypatch.setattr(bench, "MODELS", {"tiny": no_server})
    monkeypatch.setattr("sys.argv", ["serving_prefill_graph.py", "--model", "tiny"])
    with pytest.raises(SystemExit) as stopped:
        bench.main()
    assert "broken_serving does not import" in str(stopped.value)
    assert "datasets_missing_here" in str(stopped.value)


# run_mode under exit_on_sigterm, with a stand-in server (its own session, as
# launch_server's) that writes its pid and sleeps, a wait_ready that sleeps, and
# no benchmark client: the test signals the script as `timeout` does.
SIGTERM_SCRIPT = """
import json, os, sys, time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, sys.argv[1])
from benchmark_modules import load_benchmark

bench = load_benchmark("serving_prefill_graph")
folder = Path(sys.argv[2])
server = "import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(300)"
bench.server_command = lambda *a: [sys.executable, "-c", server % str(folder / "pid")]


def wait_ready(proc, port, timeout):
    (folder / "waiting").write_text("")
    time.sleep(300)


bench.wait_ready = wait_ready
bench.BenchClient = lambda: SimpleNamespace(close=lambda: None)
bench.exit_on_sigterm()
entry = {}
args = SimpleNamespace(
    workloads=["burst"], ready_timeout=300, scale=1.0, context_length=20480
)
bench.run_mode(
    folder, "full", args, folder, entry,
    lambda: (folder / "report.json").write_text(json.dumps(entry)),
)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_stops_the_server_and_records_why(tmp_path):
    """`timeout` around the script sends SIGTERM to it and then to its process
    group. The script must stop the server it started in the server's own
    session (killed by the default handler, it left the server holding the
    GPU: the next engine found no memory), and say in the report why the mode
    ended."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "run.py"
    script.write_text(SIGTERM_SCRIPT)
    test_dir = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, str(script), str(test_dir), str(tmp_path)],
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = None
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "waiting").exists() or not (tmp_path / "pid").exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the stand-in server never started"
            time.sleep(0.1)
        server = int((tmp_path / "pid").read_text())
        assert _alive(server)
        os.kill(proc.pid, signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(90) == 128 + signal.SIGTERM, proc.stderr.read()
        assert not _alive(server)
        report = json.loads((tmp_path / "report.json").read_text())
        assert report["error"] == "stopped by a signal (exit status 143)"
        assert "server_log" in report
    finally:
        for pid in (proc.pid, server):
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_profiled_run_runs_once_more_after_the_measured_ones(tmp_path, monkeypatch):
    """--profile LABEL: the server starts with sglang's profiler directory, the
    run's measured timing stays the unprofiled one, and the same run goes once
    more after every measured run with sglang.benchmark.serving's --profile into
    a folder of its own (recorded beside its timing); a label no workload has
    stops the script before any server."""
    from types import SimpleNamespace

    bench = load_benchmark("serving_prefill_graph")
    started, runs = [], []

    class Server:
        pid, returncode = 4321, 0

        def poll(self):
            return None

    def popen(cmd, env=None, **kwargs):
        started.append(env)
        return Server()

    def fake_bench(model_dir, port, run, scale, out_dir, warmup=False, client=None,
                   profile_dir=None):  # fmt: skip
        runs.append((run[0], warmup, profile_dir))
        return ["cmd"], {
            "median_ttft_ms": 99.0 if profile_dir else 60.0,
            "completed": 12,
        }

    monkeypatch.setattr(bench.subprocess, "Popen", popen)
    monkeypatch.setattr(bench, "wait_ready", lambda proc, port, timeout: 1.0)
    monkeypatch.setattr(
        bench, "BenchClient", lambda: SimpleNamespace(close=lambda: None)
    )
    monkeypatch.setattr(bench, "bench", fake_bench)
    monkeypatch.setattr(bench, "stop_server", lambda proc: None)
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    args = SimpleNamespace(
        model="nemotron-h-8b", workloads=["sizes"], context_length=8192, scale=1.0,
        ready_timeout=1, mem_fraction_static=0.8, server_args=[],
        profile=["1_x_2048_tokens"],  # a label's slug, as run_block.sh passes it
    )  # fmt: skip
    entry = {}
    bench.run_mode(tmp_path, "full", args, tmp_path, entry, lambda: None)
    profile_dir = tmp_path / "profile_full"
    assert started[0]["SGLANG_TORCH_PROFILER_DIR"] == str(profile_dir)
    # Device ops and runtime calls only: no Python tracer, no shapes.
    assert started[0]["SGLANG_PROFILE_WITH_STACK"] == "0"
    assert started[0]["SGLANG_PROFILE_RECORD_SHAPES"] == "0"
    assert runs[-1] == ("1 x 2048 tokens", False, profile_dir / "1_x_2048_tokens")
    assert all(p is None for _, _, p in runs[:-1]) and len(runs) == 10
    assert entry["runs"]["1 x 2048 tokens"]["median_ttft_ms"] == 60.0
    profiled = entry["profiled"]["1 x 2048 tokens"]
    assert (profiled["median_ttft_ms"], profiled["trace_dir"]) == (
        99.0,
        "profile_full/1_x_2048_tokens",
    )
    assert profiled["trace_path"] == str(profile_dir / "1_x_2048_tokens")
    assert "prefill_batches" in profiled
    # Without --profile the server gets no profiler settings.
    monkeypatch.delenv("SGLANG_TORCH_PROFILER_DIR", raising=False)
    args.profile = []
    bench.run_mode(tmp_path, "full", args, tmp_path, {}, lambda: None)
    assert "SGLANG_TORCH_PROFILER_DIR" not in started[1]
    assert runs[-1][2] is None
    monkeypatch.setattr(bench, "client_import_error", lambda module=None: None)
    monkeypatch.setattr(
        "sys.argv",
        ["serving_prefill_graph.py", "--workloads", "sizes", "--profile", "1 x 9 tokens"],
    )  # fmt: skip
    with pytest.raises(SystemExit, match="not a run of"):
        bench.main()


def test_bench_asks_for_the_profile_where_the_trace_goes(tmp_path, monkeypatch):
    """bench(profile_dir=...) adds sglang.benchmark.serving's --profile and its
    output folder (the server writes the trace where the client says)."""
    (tmp_path / "fake_serving.py").write_text(FAKE_SERVING)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    bench = load_benchmark("serving_prefill_graph")
    client = bench.BenchClient("fake_serving")
    try:
        run = ("1 x 16 tokens", 16, 1, 1.0, float("inf"), 1, 40)
        cmd, _ = bench.bench(
            tmp_path,
            1234,
            run,
            1.0,
            tmp_path,
            client=client,
            profile_dir=tmp_path / "p",
        )
        assert cmd[-3:] == ["--profile", "--profile-output-dir", str(tmp_path / "p")]
        assert "bench_1234_profile_" in cmd[cmd.index("--output-file") + 1]
    finally:
        client.close()
    # A failed profiled run is not run again (a second trace would join the first).
    _, result = bench.bench(tmp_path, 1234, run, 1.0, tmp_path, profile_dir=tmp_path)
    assert result == {"error": "the profiled run failed (no client)"}


def test_the_probes_graph_memory_split_reaches_the_servers_facts(monkeypatch, caplog):
    """GRAPHFIX_PROBE_GRAPH_MEMORY's wrapper of sglang's capture_prefill_graph
    (test/gpu/probe), with the device's memory counters answered as an H200
    would: one WARNING line splitting the memory the capture took into the
    caching allocator's pool and the rest, with the graphs counted; the
    serving script's log_facts keeps it. The wrapper returns what sglang
    returned (a GraphCapture, or the eager runner its no-bucket branch returns)."""
    import importlib.util
    import logging
    from types import SimpleNamespace

    from sglang.srt.model_executor.model_runner_components import cuda_graph_setup

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location(
        "graphfix_test_probe", root / "test/gpu/probe/graphfix_test_probe.py"
    )
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    gib = 1 << 30
    free = iter([100 * gib, 97 * gib, 50 * gib, 50 * gib])
    reserved = iter([10 * gib, 12.5 * gib, 0, 0])
    allocated = iter([9 * gib, 9.25 * gib, 0, 0])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (next(free), 141 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: next(reserved))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: next(allocated))
    captured = SimpleNamespace(
        runner=SimpleNamespace(
            backend=SimpleNamespace(_graphs=dict.fromkeys(range(58)))
        )
    )
    results = iter([captured, SimpleNamespace(backend=None)])
    # What the capture leaves held (the probe lists tensors of HELD_DEVICE; CPU
    # here): three graphs' outputs, a view of one of them (one storage), and a
    # tensor held from before the capture, which is not the capture's.
    # The walk meets objects that raise on a look: a dead weakref proxy (on
    # __class__) and a tensor whose storage cannot be read; neither stops it.
    import weakref

    monkeypatch.setattr(probe, "HELD_DEVICE", "cpu")
    before = torch.zeros(4096, 1024)

    class Gone:
        pass

    gone = Gone()
    dead = weakref.proxy(gone)
    del gone
    unreadable = torch.zeros(2).to_sparse()

    def capture(**kwargs):
        result = next(results)
        if result is captured:
            outputs = [torch.zeros(16, 1024) for _ in range(3)]
            view = outputs[0][:8]
            captured.runner.held = [view, *outputs, before, torch.zeros(3, 1)]
            captured.runner.odd = [dead, unreadable]
        return result

    monkeypatch.setattr(cuda_graph_setup, "capture_prefill_graph", capture)
    probe._measure_prefill_graph_memory()
    with caplog.at_level(logging.WARNING, logger="graphfix_test_probe"):
        assert cuda_graph_setup.capture_prefill_graph(model_runner=None) is captured
        eager = cuda_graph_setup.capture_prefill_graph(model_runner=None)
    assert eager.backend is None
    bench = load_benchmark("serving_prefill_graph")
    first, second = (r.getMessage() for r in caplog.records)
    facts = bench.log_facts(f"[2026-12-05 01:00:00] {first}\n")
    assert facts["prefill_graph_memory_split"] == {
        "taken_gib": 3.0,
        "allocator_reserved_gib": 2.5,
        "allocator_allocated_gib": 0.25,
        "outside_allocator_gib": 0.5,
        "graphs": 58,
        "backend": "SimpleNamespace",
        "held_after_capture": [
            {"shape": [16, 1024], "dtype": "torch.float32", "count": 3, "mib": 0.188},
            {"shape": [3, 1], "dtype": "torch.float32", "count": 1, "mib": 0.0},
        ],
    }
    assert before.shape == (4096, 1024)  # held across the capture, not listed
    assert json.loads(second.split("memory ", 1)[1])["graphs"] == 0
    assert "prefill_graph_memory_split" not in bench.log_facts("no probe here\n")


def test_a_server_that_died_says_why_in_its_facts():
    """A server that dies leaves Python tracebacks in its log; the report keeps
    the exception lines that end them, the last three distinct ones (the cause
    beside sglang's wrapper errors). On 2026-12-05 all three servers of a block
    died of a missing FA3 library and the report said only "exited with -9";
    that server's log is committed. Lines that only mention an error are not
    taken for one."""
    bench = load_benchmark("serving_prefill_graph")
    root = Path(__file__).resolve().parents[3]
    died = bench._read_text(
        root / "benchmark/results/gpu/serving_2026-12-05b/qwen3_next_fa3_start_failure"
        "/logs/server_full.log.gz"
    )
    assert bench.log_facts(died)["exceptions"] == [
        "ImportError: cannot import name 'flash_ops' from 'sgl_kernel' "
        "(/tmp/sglang-site/sgl_kernel/__init__.py)",
        "ImportError: Can not import FA3 in sgl_kernel. Please check your installation.",
    ]
    # A logger's traceback (timestamped first line), a bare assertion, a Triton
    # error whose class has no "Error" in its name, then sglang's own wrapper.
    wrapped = (
        "[2026-12-05 03:23:17] Scheduler hit an exception: Traceback (most recent "
        "call last):\n"
        '  File "/site/sglang/srt/managers/scheduler.py", line 9, in run\n'
        "    assert ok\n"
        "AssertionError\n"
        "Traceback (most recent call last):\n"
        '  File "/site/triton/compiler.py", line 1, in f\n'
        "triton.runtime.errors.OutOfResources: out of resource: shared memory\n"
        "[2026-12-05 03:23:18] Rank 0 scheduler died during initialization\n"
        "Traceback (most recent call last):\n"
        '  File "/site/sglang/srt/entrypoints/engine.py", line 2, in g\n'
        "RuntimeError: Initialization failed. Please see the error messages above.\n"
        "Traceback (most recent call last):\n"
        '  File "/site/sglang/srt/entrypoints/engine.py", line 2, in g\n'
        "RuntimeError: Initialization failed. Please see the error messages above.\n"
    )
    assert bench.log_facts(wrapped)["exceptions"] == [
        "AssertionError",
        "triton.runtime.errors.OutOfResources: out of resource: shared memory",
        "RuntimeError: Initialization failed. Please see the error messages above.",
    ]
    healthy = (
        "[2026-12-05 03:40:37] Ignore import error when loading sglang.srt.models."
        "inkling: No module named 'quack'\n"
        "ValueError: a line that mentions an error outside any traceback\n"
        "[2026-12-05 03:41:49] Capture target prefill CUDA graph end. elapsed=67.97 s\n"
    )
    assert bench.log_facts(healthy)["exceptions"] == []


def test_a_mode_whose_server_dies_prints_why(tmp_path, monkeypatch, capsys):
    """run_mode with a server that dies before it is ready (a stand-in raising
    at start-up): the mode's entry records the error and the exception lines,
    and the run's output (a block's SERVING.out, which poll_block.sh shows)
    names the cause."""
    import sys
    from types import SimpleNamespace

    bench = load_benchmark("serving_prefill_graph")
    server = "raise ImportError('Can not import FA3 in sgl_kernel.')"
    monkeypatch.setattr(
        bench, "server_command", lambda *a: [sys.executable, "-c", server]
    )
    monkeypatch.setattr(
        bench, "BenchClient", lambda: SimpleNamespace(close=lambda: None)
    )
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    entry, saved = {}, []
    args = SimpleNamespace(
        workloads=["burst"], ready_timeout=60, scale=1.0, context_length=20480
    )
    bench.run_mode(tmp_path, "full", args, tmp_path, entry, lambda: saved.append(1))
    assert entry["error"].startswith("RuntimeError: server exited with 1 before ready")
    cause = "ImportError: Can not import FA3 in sgl_kernel."
    assert entry["server_log"]["exceptions"] == [cause]
    out = capsys.readouterr().out
    assert (
        out.startswith("full failed: RuntimeError: server exited with 1")
        and cause in out
    )


@pytest.mark.parametrize("model", list(load_benchmark("serving_prefill_graph").MODELS))
def test_server_and_client_encode_the_words_of_the_written_tokenizer(tmp_path, model):
    """Every served model's (MODELS) server (the --tokenizer-path sglang's parser reads
    from server_command, through sglang's get_tokenizer) and benchmark client
    (bench's --tokenizer, through sglang.benchmark's) encode the word-level
    tokenizer's words to their ids, and sglang's warm-up text to some ids. With
    the tokenizer beside Qwen3.5's config, transformers loads Qwen3_5Tokenizer,
    which encodes both to nothing (every server died in warm-up, 2026-12-07c)."""
    import argparse

    from sglang.benchmark.utils import get_tokenizer as client_tokenizer
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    bench = load_benchmark("serving_prefill_graph")
    bench.MODELS[model](tmp_path)
    bench.word_level_tokenizer(tmp_path)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    command = bench.server_command(tmp_path, "full", 1, _Args(model))
    served = parser.parse_args(command[3:])

    class Client:
        def run(self, argv):
            return "not run", ""

    run = ("1 x 16 tokens", 16, 1, 1.0, float("inf"), 1, 40)
    cmd, _ = bench.bench(
        tmp_path, 1, run, 1.0, tmp_path, client=Client(), profile_dir=tmp_path
    )
    tokenizers = {
        "server": get_tokenizer(served.tokenizer_path, trust_remote_code=False),
        "client": client_tokenizer(cmd[cmd.index("--tokenizer") + 1]),
    }
    for side, tokenizer in tokenizers.items():
        assert tokenizer("w3 w1 w4").input_ids == [3, 1, 4], side
        assert tokenizer.decode([3, 1, 4]) == "w3 w1 w4", side
        assert tokenizer("The capital city of France is").input_ids, side
