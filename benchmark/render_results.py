"""Render the committed measurements (benchmark/results/) into
benchmark/RESULTS.md, between its results markers, each with the provenance its
script recorded (benchmark/provenance.py), and README.md's speed-up tables
(README_TABLES), between their table markers.

    python3 benchmark/render_results.py            # print the markdown
    python3 benchmark/render_results.py --write    # replace it in RESULTS.md,
                                                   # and README.md's tables
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmark" / "results"
TARGET = ROOT / "benchmark" / "RESULTS.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _load(name):
    return json.loads((RESULTS / name).read_text())


def _device(report) -> str:
    """The device the script recorded (provenance; older files: a "device" key)."""
    return (report.get("provenance") or {}).get("device") or report.get("device", "?")


def provenance_line(report) -> str:
    """What the script recorded about the run; a note typed in by hand afterwards
    (a "*_note_hand_written" key) is shown as such, never as recorded."""
    rec = report.get("provenance")
    if isinstance(rec, dict):
        commit = (rec["commit"] or "unknown")[:10]
        dirty = {
            True: " (uncommitted changes)",
            False: "",
            None: " (dirty flag unknown)",
        }
        versions = ", ".join(f"{k} {v}" for k, v in rec["versions"].items() if v)
        return (
            f"Recorded by the script: commit {commit}{dirty[rec['dirty']]}, {versions}, "
            f"{rec['device'] or 'no CUDA device'}, {rec['date_utc']}, `{rec['command']}`."
        )
    notes = [v for k, v in report.items() if k.endswith("_note_hand_written")]
    if notes:
        text = notes[0]["text"]
        if isinstance(text, dict):
            text = "; ".join(f"{k}: {v}" for k, v in text.items())
        return (
            "Provenance not recorded by the script (written before "
            f"benchmark/provenance.py); a note typed in by hand, unverified: {text}."
        )
    return "Provenance not recorded by the script (written before benchmark/provenance.py)."


def _diverged(report):  # test/gpu/engine_utils.py::diverged
    return bool(report["mismatches"] or report["near_tie_splits"])


def _steps(batches):
    return (
        max(b["max_logprob_diff"] for b in batches),
        sum(len(b["mismatches"]) for b in batches),
        sum(b["compared_steps"] for b in batches),
    )


def gdn_latency() -> list:
    report = _load("prefill_graph_latency.json")
    rows = []
    for name, entry in report["models"].items():
        backends = entry["prefill_backend"]
        keys = list(backends["full"])
        rows += [
            f"GDN prefill forward, {entry['description']} ({_device(report)}; "
            f"{report['workload']}; ms inside the scheduler, device-synchronised):",
            "",
            "| prompt tokens x batch | " + " | ".join(keys) + " |",
            "| --- |" + " --- |" * len(keys),
        ]
        for backend, cells in backends.items():
            rows.append(
                f"| {backend} | "
                + " | ".join(str(cells[k]["forward_ms"]) for k in keys)
                + " |"
            )
        for other in ("breakable", "disabled"):
            ratios = [
                backends[other][k]["forward_ms"] / backends["full"][k]["forward_ms"]
                for k in keys
            ]
            rows.append(
                f"| full vs {other} | " + " | ".join(f"{r:.1f}x" for r in ratios) + " |"
            )
        rows.append("")
    note = (
        "The Qwen3-Next-dimension model's config (test/tiny_configs.py) had no dtype "
        'then, so sglang\'s dtype "auto" served it in float16; it is bfloat16 now, '
        "not re-measured."
    )
    return rows + [note, "", provenance_line(report), ""]


def kimi_latency() -> list:
    report = _load("kimi_linear_prefill_graph.json")
    rows = [
        f"KDA prefill, {report['model']} ({_device(report)}; {report['workload']}):",
        "",
        "| prefill CUDA graph | device memory GiB | prefill graph GiB | prefill capture s | forward ms 16 / 64 / 256 tokens |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in report["prefill_backend"].items():
        if "error" in r:
            rows.append(
                f"| {name} | refused at startup: {r['error'].split(': ', 1)[0]} (sglang's breakable rules exclude KDA off GLM-5.3 Flash) | | | |"
            )
            continue
        ttft = " / ".join(str(r["ttft"][k]["forward_ms"]) for k in ("16", "64", "256"))
        rows.append(
            f"| {name} | {r['device_memory_gib']} | {r['graph_memory_gib']['prefill']} | "
            f"{r['capture_s']['prefill']:.1f} | {ttft} |"
        )
    extra = report["full_vs_decode_only_memory"]
    rows += [
        "",
        f"Full prefill + decode graphs vs decode graphs only: +{extra['extra_gib']} GiB "
        f"(+{extra['extra_percent']}% of this tiny engine's footprint; goal {extra['goal_percent']}%).",
        "",
        provenance_line(report),
        "",
    ]
    return rows


def _merged(dsa) -> str:
    kernels = dsa.get("graph_kernels")
    if not kernels or "merged" not in next(iter(kernels.values())):
        return "path not recorded"
    return ", ".join(f"{k['merged']} per {name} batch" for name, k in kernels.items())


def correctness() -> list:
    kernel = _load("gpu/gdn_extend_kernel.json")["max_abs_diff"]
    kernel_bad = _load("gpu/gdn_extend_kernel_wrong_state.json")["max_abs_diff"]
    gdn = _load("gpu/hybrid_gdn_full_prefill_vs_eager.json")
    gdn_bad = _load("gpu/hybrid_gdn_full_prefill_wrong_state.json")["batches"]
    kimi = _load("gpu/kimi_linear_full_prefill_vs_eager.json")
    kimi_bad = _load("gpu/kimi_linear_full_prefill_wrong_state.json")["batches"]
    kimi_before = _load("gpu/kimi_linear_full_prefill_vs_eager_before_beta_fix.json")
    gate_kernel = _load("gpu/lora_head_gate_kernel.json")
    llama = _load("gpu/llama_full_prefill_vs_eager.json")
    dsa = _load("gpu/dsa_lora_graph_vs_eager.json")
    mixed = _load("gpu/dsa_lora_mixed_batch.json")
    dsa_effect = _load("gpu/dsa_lora_adapter_effect.json")["graph_without_vs_with"]
    dsa_path = _load("gpu/dsa_lora_graph_path.json")
    dsa_start = _load("gpu/dsa_lora_startup.json")
    base_gdn = _load("gpu/upstream_baseline_qwen3_next_full_prefill.json")
    base_dsa = _load("gpu/dsa_lora_upstream_baseline.json")
    refused = {
        p.stem.removeprefix("full_prefill_config_refused_"): json.loads(p.read_text())
        for p in sorted((RESULTS / "gpu").glob("full_prefill_config_refused_*.json"))
    }

    worst_kernel = max(
        max(d["output"], d["conv_state"], d["ssm_state"]) for d in kernel.values()
    )
    gdn_diff, gdn_bad_n, gdn_steps = _steps(gdn["batches"])
    gdn_first = gdn.get("first_token_topk") or gdn["first_token_top20"]  # older runs
    gdn_top = max(f["max_logprob_diff"] for f in gdn_first)
    lengths = ", ".join("/".join(map(str, b)) for b in gdn["prompt_lengths"])
    kimi_diff, kimi_bad_n, kimi_steps = _steps(kimi["batches"])
    kimi_top = max(f["max_logprob_diff"] for f in kimi["first_token_topk"])
    kimi_lengths = ", ".join("/".join(map(str, b)) for b in kimi["prompt_lengths"])
    kimi_before_bad = sum(_diverged(b) for b in kimi_before["batches"])
    gate_err = max(r["adapter_rows_max_rel_error"] for r in gate_kernel.values())
    gate_vs = max(
        r["vs_sglang_unfused_adapter_rows_max_rel_error"] for r in gate_kernel.values()
    )
    gate_swapped = min(
        r["swapped_adapters_max_rel_error"] for r in gate_kernel.values()
    )
    whole = {k: r for k, r in gate_kernel.items() if "-full-" in k}
    gate_exact = all(
        r["other_rows_bit_identical"] for k, r in gate_kernel.items() if k not in whole
    )
    gate_note = f"delta: other rows bit-identical: {gate_exact}"
    if whole:
        worst = max(r["other_rows_max_rel_error"] for r in whole.values())
        gate_note += f"; whole gate ({len(whole)} cases): rows without an adapter vs x Wᵀ max rel error {worst:.2g}"
    two = _load("gpu/dsa_lora_two_adapter_batch.json")
    csgmv = {
        name: _load(f"gpu/dsa_lora_csgmv/dsa_lora_{name}.json")
        for name in ("graph_vs_eager", "mixed_batch", "two_adapter_batch")
        if (RESULTS / f"gpu/dsa_lora_csgmv/dsa_lora_{name}.json").exists()
    }
    llama_diff, llama_bad, llama_steps = _steps(llama["batches"])
    control = llama["control_rotated_prompts"]
    return [
        'Correctness on the H200 (graph engine vs the same engine with the prefill graph disabled, greedy, tolerance 0.05 on logprobs; each check has a can-fail control). The GPU tests\' files (results/gpu/) record no provenance; the runs are listed under "How these were produced":',
        "",
        "| check | graph vs eager | control |",
        "| --- | --- | --- |",
        f"| GDN extend kernels, one captured bucket replayed for {len(kernel)} batches (output, conv and SSM state, prefix-cache tracking) | max abs diff {worst_kernel} | wrong state slot: output diff {kernel_bad['output']:.3g}, SSM state diff {kernel_bad['ssm_state']:.3g} |",
        f"| GDN hybrid engine (tiny Qwen3-Next), full prefill graph, prompts {lengths} (chunked at 256, radix hits), {sum(gdn['graph_replays'])} replays | {gdn_bad_n} mismatches over {gdn_steps} steps, max logprob diff {gdn_diff:.2g}; first token's top-20 logprobs max diff {gdn_top:.2g} | replays on the padding state slot: {sum(_diverged(b) for b in gdn_bad)} of {len(gdn_bad)} batches diverge |",
        f"| KDA hybrid engine (tiny Kimi-Linear, MLA on fa3), full prefill graph, prompts {kimi_lengths} (two chunks at 256, a radix hit), {sum(kimi['graph_replays'])} replays | {kimi_bad_n} mismatches over {kimi_steps} steps, max logprob diff {kimi_diff:.2g}; first token's top-20 logprobs max diff {kimi_top:.2g} (before `kda_graph_extend_applies_beta_sigmoid`: {kimi_before_bad} of {len(kimi_before['batches'])} batches diverged) | replays on the padding state slot: {sum(_diverged(b) for b in kimi_bad)} of {len(kimi_bad)} batches diverge |",
        f"| LoRA head-gate kernels (sgl-kernel: delta on cuBLAS, split-K or not; whole gate), bf16, hidden 7168, 64 heads, csgmv and triton batch info, eager and graph, pool rank 16 and 64 ({len(gate_kernel)} cases) | adapter rows vs fp32 reference max rel error {gate_err:.2g}, vs sglang's shrink+expand {gate_vs:.2g}; {gate_note} | adapters swapped: rel error {gate_swapped:.3g} or more |",
        f"| Llama, full prefill graph (flashinfer), {llama['prefill_batches_on_graph']} prefill batches on the graph | {llama_bad} mismatches over {llama_steps} steps, max logprob diff {llama_diff:.2g} | outputs of other prompts: {len(control['tokens']['mismatches'])} mismatches |",
        f"| DSA weights_proj LoRA ({dsa.get('lora_backend', 'triton')} LoRA backend), breakable prefill graph, adapters of rank 8 (weights_proj) and 16 (+ q_b_proj, o_proj); every request on the adapter: merged-weight GEMM ({_merged(dsa)}); head gate in the split op: {dsa_start['capture_head_gate_calls']} calls at capture, {dsa_path['graph_adapter_batch_head_gate_calls']} per adapter batch, {dsa_path['eager_engine_head_gate_calls']} eager | {len(dsa['mismatches'])} mismatches over {dsa['compared_steps']} steps, max logprob diff {dsa['max_logprob_diff']:.2g} | without the adapter: {len(dsa_effect['mismatches'])} mismatches |",
        f"| DSA mixed batch (adapter, none, other adapter in one forward: GEMM + delta kernel, {mixed.get('mixed_batch_kernels', {}).get('delta', '?')} launches) vs each request alone | {len(mixed['mixed_vs_alone']['mismatches'])} mismatches over {mixed['mixed_vs_alone']['compared_steps']} steps, max logprob diff {mixed['mixed_vs_alone']['max_logprob_diff']:.2g} | adapters swapped: {len(mixed['control_swapped_adapters']['mismatches'])} mismatches |",
        f"| DSA batch of two adapters (every request on one: whole-gate kernel, {two['kernels']['full']} launches) vs each request alone (merged weight) | {len(two['vs_alone']['mismatches'])} mismatches over {two['vs_alone']['compared_steps']} steps, max logprob diff {two['vs_alone']['max_logprob_diff']:.2g} | adapters swapped: {len(two['control_swapped_adapters']['mismatches'])} mismatches |",
        *(
            [
                f"| The DSA checks above on sglang's csgmv LoRA backend (tolerance {csgmv['graph_vs_eager']['tol']}) | graph vs eager: {len(csgmv['graph_vs_eager']['mismatches'])} mismatches, max diff {csgmv['graph_vs_eager']['max_logprob_diff']:.2g}; mixed vs alone: {len(csgmv['mixed_batch']['mixed_vs_alone']['mismatches'])}, {csgmv['mixed_batch']['mixed_vs_alone']['max_logprob_diff']:.2g}; two adapters vs alone: {len(csgmv['two_adapter_batch']['vs_alone']['mismatches'])}, {csgmv['two_adapter_batch']['vs_alone']['max_logprob_diff']:.2g} | adapters swapped: {len(csgmv['mixed_batch']['control_swapped_adapters']['mismatches'])} / {len(csgmv['two_adapter_batch']['control_swapped_adapters']['mismatches'])} mismatches |"
            ]
            if len(csgmv) == 3
            else []
        ),
        "",
        "Refusals and upstream baselines (engine processes checked to run without / with sglang-graphfix):",
        "",
        *[
            f"* {name}: `ValueError` after {r['seconds']:.2f} s, before any weights load."
            for name, r in refused.items()
        ],
        f"* Upstream, plugin excluded: tiny Qwen3-Next + full prefill graph reproduces the `IndexError` at capture ({base_gdn['reproduced_index_error']}); DSA + weights_proj adapter fails at startup with `GRAPH_WEIGHTS_PROJ_LORA_ERROR` ({base_dsa['upstream_error']}).",
    ]


def _dsa_overhead_fused(report) -> list:
    """benchmark/dsa_head_gate.py's results since the fused LoRA delta kernel:
    no_lora against each LoRA variant the run had (older runs lack some)."""
    summary = report["summary"]
    verdict = "met" if summary["meets_goal"] else "not met"
    checks = "pass" if summary["checks_pass"] else "FAIL"
    variants = report["variants"]
    merged = "lora_adapter_whole_gate" in variants
    if merged:
        adapter = "one adapter for every request: merged-weight GEMM"
    elif "lora_adapter_gemm_plus_delta" in variants:
        adapter = "every request with an adapter: whole gate"
    else:
        adapter = "adapter, fused"
    extra = [
        (v, title)
        for v, title in (
            ("lora_adapter_whole_gate", "several adapters: whole gate"),
            (
                "lora_adapter_gemm_plus_delta",
                "same batch, GEMM + delta (the mixed-batch path)",
            ),
        )
        if v in variants
    ]
    rows = [
        "",
        f"DSA indexer head gate with a weights_proj adapter ({_device(report)}, hidden {report['shapes']['hidden']}, {report['shapes']['index_heads']} index heads; {report['timing']}). "
        "Overhead against the same split-op core without LoRA (q/k projections, act_quant, gate, fp8 MQA logits); "
        f"GPU-bound: {report['throughput_calls']} calls queued back to back (what a request pays behind the graph segment); latency: one call from an idle GPU, launch gaps included. "
        + provenance_line(report),
        "",
        f"| LoRA backend | rank | tokens | core ms, no LoRA (GPU-bound) | {adapter}: GPU-bound / latency |"
        + "".join(f" {title}: GPU-bound |" for _, title in extra)
        + " adapter, unfused (before): GPU-bound / latency | no adapter in batch: GPU-bound |",
        "| --- | --- | --- | --- | --- |" + " --- |" * len(extra) + " --- | --- |",
    ]
    for r in report["results"]:
        core = r["split_op_core"]
        thr, lat = core["throughput_overhead_pct"], core["latency_overhead_pct"]
        rows.append(
            f"| {r['backend']} | {r['rank']} | {r['tokens']} | {core['throughput_ms']['no_lora']} | "
            f"{thr['lora_adapter']}% / {lat['lora_adapter']}% | "
            + "".join(f"{thr[v]}% | " for v, _ in extra)
            + f"{thr['unfused_reference']}% / {lat['unfused_reference']}% | "
            f"{thr['lora_no_adapter']}% |"
        )
    rows += [
        "",
        f"Goal ({adapter}, split-op core GPU-bound, at most {report['goal_pct']}%): {verdict}, "
        f"worst {summary['worst_split_op_core_throughput_overhead_pct_lora_adapter']}% "
        f"(latency-based worst {summary['worst_split_op_core_latency_overhead_pct_lora_adapter']}%)"
        + (
            f"; several adapters (whole gate): worst {summary['worst_split_op_core_throughput_overhead_pct']['lora_adapter_whole_gate']}%"
            if merged
            else ""
        )
        + f". Checks at 2048 tokens (against the fp32 reference; rows without an adapter bit-identical on the delta path; kernel launches per path; both backends): {checks}.",
    ]
    return rows + _dsa_kernel_sweep()


def _dsa_kernel_sweep() -> list:
    path = RESULTS / "dsa_head_gate_kernel_sweep.json"
    if not path.exists():
        return []
    sweep = json.loads(path.read_text())
    rows = [
        "",
        f"The gate's kernels alone (`benchmark/dsa_head_gate_kernel_sweep.py`, {_device(sweep)}, GPU time of 20 calls in one CUDA graph, triton batch info, one request per 2048 tokens, every request with the adapter; 'default' is the heuristic of the commit that ran; µs). "
        + provenance_line(sweep),
        "",
        "| rank | tokens | base GEMM (cuBLAS, no LoRA) | + delta, best tiles | whole gate, best tiles | whole gate, that commit's heuristic | best whole-gate tiles |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]

    def us(ms):
        return "failed" if ms is None else f"{1000 * ms:.1f}"

    for r in sweep["rows"]:
        best_delta, best_full = r["best_delta_ms"], r["best_full_gate_ms"]
        # The delta was timed with a copy of the base before it.
        delta = None if best_delta is None else best_delta[0] - r["base_copy_ms"]
        rows.append(
            f"| {r['rank']} | {r['tokens']} | {us(r['base_gemm_ms'])} | "
            f"{us(None if delta is None else r['base_gemm_ms'] + delta)} | "
            f"{us(best_full and best_full[0])} | {us(r['full_gate_ms']['default'].get('ms'))} | "
            f"{best_full[1] if best_full else '-'} |"
        )
    return rows


def dsa_overhead() -> list:
    return _dsa_overhead_fused(_load("dsa_head_gate.json"))


def merged_gate_precision() -> list:
    report = _load("merged_gate_precision.json")
    heads, hidden, rank, tokens = report["shapes"]
    return [
        "",
        "How much of a weights_proj adapter's effect the merged weight keeps "
        f"(`benchmark/merged_gate_precision.py`, CPU, {heads} heads x hidden {hidden}, "
        f"rank {rank}, {tokens} tokens): error of the gate against x(W + ΔW)ᵀ in fp32, "
        "as a share of the adapter's move. " + provenance_line(report),
        "",
        "| adapter moves the gate by | merged weight (two bf16 halves) | one bf16 merged weight |",
        "| --- | --- | --- |",
        *(
            f"| {r['adapter_moves_gate_by']:.1%} | {r['merged_weights_proj_error_share']:.3%} "
            f"| {r['one_bf16_error_share']:.1%} |"
            for r in report["rows"]
        ),
    ]


def plugin_and_fallback() -> list:
    """The start-up guard, the eager fallback, the device-side table fill and the
    merged-gate reservation on the GPU (test/gpu; results/gpu/)."""
    refusal = _load("gpu/plugin_partial_patch_set_refusal.json")
    serves = _load("gpu/plugin_default_engine_serves.json")
    fallback = _load("gpu/full_prefill_fallback.json")
    tables = _load("gpu/linear_prefill_tables_kernel.json")["host_time"]
    memory = _load("gpu/dsa_lora_merged_gate_memory.json")
    default = fallback["eager_batch_first_token_vs_default"]["max_logprob_diff"]
    triton = fallback["eager_batch_first_token_vs_triton"]["max_logprob_diff"]
    return [
        "",
        "Plugin start-up, eager fallback, device-side tables, merged-gate memory "
        "(H200, test/gpu; these files were written before test/gpu recorded "
        "provenance: the commit that added them names the run):",
        "",
        "| check | result |",
        "| --- | --- |",
        f"| a patch target held by another plugin (`{refusal['held_target'].rsplit('.', 2)[-2]}"
        f".{refusal['held_target'].rsplit('.', 1)[-1]}`), `sglang.Engine` start "
        f"| {refusal['refusal'][0].split(':', 1)[0]} (before any weights load) |",
        f"| every patch applied, default engine | starts and serves "
        f"({serves['seconds']:.0f} s cold) |",
        "| full prefill graph, batch above `full_prefill_max_req` (eager) vs sglang's "
        f"default eager, first token's top-20 | max logprob diff {default:g} "
        f"(control, Triton eager: {triton:.3f}) |",
        "| linear-attention table fill, host µs per fill at 1 / 4 / 8 / 16 / 32 "
        "requests: device (ours) vs sglang's host fill | "
        + " / ".join(f"{v['device_fill_host_us']:.0f}" for v in tables.values())
        + " vs "
        + " / ".join(f"{v['sglang_host_fill_us']:.0f}" for v in tables.values())
        + " |",
        f"| DSA merged weights_proj reserved with the LoRA pool, before KV sizing "
        f"| {memory['reserved_before_kv_sizing']}: "
        f"`{memory['reserved_line'].split('] ', 1)[-1].split(' (', 1)[0]}` |",
    ]


def _gdn_extend_kernel_runs(folder: str):
    """test_gdn_extend_kernel.py's files in ``folder``: per kernel and value-head
    count, (kernel, heads, per-batch diffs, the wrong-state control's diffs)."""
    for kernel in ("flashinfer", "triton"):
        for hv in (4, 32):
            name = f"gdn_extend_kernel_{kernel}_hv{hv}"
            batches = list(_load(f"{folder}{name}.json")["max_abs_diff"].values())
            bad = _load(f"{folder}{name}_wrong_state.json")["max_abs_diff"]
            yield kernel, hv, batches, bad


def gdn_prefill_accuracy() -> list:
    """The GDN extend captured with FlashInfer's prefill (as shipped on SM90) and
    with Triton: per kernel against sglang's eager extend, and per engine against
    eager on the same kernels and an fp32 reference (results/gpu/gdn_prefill_accuracy_2026-12-01/;
    the earlier run with NaN, before the rows past the batch were zeroed:
    results/gpu/flashinfer_gdn_capture/)."""
    folder = "gpu/gdn_prefill_accuracy_2026-12-01/"
    rows = [
        "",
        "GDN prefill kernels in the full prefill graph (H200; FlashInfer's is captured "
        "on SM90 as shipped, Triton with `--linear-attn-prefill-backend triton`):",
        "",
        "| check | result |",
        "| --- | --- |",
    ]
    for kernel, hv, batches, bad in _gdn_extend_kernel_runs(folder):
        rows.append(
            f"| {kernel} kernel, {hv} value heads: 256-token bucket replayed for "
            f"{len(batches)} batches vs sglang's eager extend | output max diff "
            + " / ".join(f"{b['output']:g}" for b in batches)
            + "; rows past the batch and the padding slot finite: "
            + str(all(b["padding_slot_finite"] for b in batches))
            + f"; wrong state slot (control): {bad['output']:.3f} |"
        )
    flashinfer_fp32 = _load(folder + "gdn_prefill_1024_full_flashinfer_fp32.json")
    lengths, errors = flashinfer_fp32["prompt_lengths"], flashinfer_fp32["fp32_error"]
    triton_graph = _load(folder + "gdn_prefill_1024_full_fp32.json")["fp32_error"][
        "full"
    ]
    same = {
        "flashinfer": _load(
            folder + "gdn_prefill_1024_full_flashinfer_vs_default.json"
        ),
        "triton": _load(folder + "gdn_prefill_1024_full_vs_triton.json"),
    }
    wrong = _load(folder + "gdn_prefill_1024_wrong_state.json")["batches"]

    def errs(values):
        return " / ".join("NaN" if e != e else f"{e:.3f}" for e in values)

    for kernel, report in same.items():
        rows.append(
            f"| hidden-1024 Qwen3-Next, fa3, graph ({kernel}) vs eager on the same "
            f"kernels, first token at {' / '.join(map(str, lengths))} tokens | "
            + " / ".join(
                "split (near tie)"
                if b["near_tie_splits"]
                else f"{b['max_logprob_diff']:.4f}"
                for b in report["batches"]
            )
            + " |"
        )
    rows += [
        f"| same model, first-token logprob error vs fp32 transformers at "
        f"{' / '.join(map(str, lengths))} tokens | graph (FlashInfer) "
        f"{errs(errors['full_flashinfer'])}; sglang default eager "
        f"{errs(errors['default'])}; graph (Triton) {errs(triton_graph)}; Triton "
        f"eager {errs(errors['triton'])} |",
        f"| wrong-state control (graph with every replay on the padding slot) | "
        f"diverges at {sum(map(_diverged, wrong))} of {len(wrong)} lengths |",
        "",
        provenance_line(flashinfer_fp32),
    ]
    return rows


def masked_state_copy() -> list:
    """The GDN extend captured with the masked state copy (padding request slots
    move no state), against sglang's eager extend (results/gpu/suite_2026-12-02/)."""
    folder = "gpu/suite_2026-12-02/"
    rows = [
        "",
        "GDN extend in the full prefill graph with the masked state copy (H200; "
        "padding request slots neither read nor write SSM state):",
        "",
        "| check | result |",
        "| --- | --- |",
    ]
    for kernel, hv, batches, bad in _gdn_extend_kernel_runs(folder):
        rows.append(
            f"| {kernel} kernel, {hv} value heads, 4 request slots: "
            f"{len(batches)} batches vs sglang's eager extend | output max diff "
            + " / ".join(f"{b['output']:g}" for b in batches)
            + "; padding slot's SSM state untouched by every replay: "
            + str(all(b["padding_slot_untouched"] for b in batches))
            + f" | wrong state slot: output {bad['output']:.3f}, padding slot "
            f"untouched: {bad['padding_slot_untouched']} |"
        )
    engine = _load(folder + "hybrid_gdn_full_prefill_vs_eager_default.json")
    steps = sum(b["compared_steps"] for b in engine["batches"])
    mismatches = sum(len(b["mismatches"]) for b in engine["batches"])
    diff = max(b["max_logprob_diff"] for b in engine["batches"])
    ties = sum(b["near_tie_splits"] for b in engine["batches"])
    top = max(t["max_logprob_diff"] for t in engine["first_token_topk"])
    rows += [
        f"| tiny Qwen3-Next engine, FlashInfer's GDN prefill captured, graph vs eager "
        f"on the same kernels, {len(engine['batches'])} batches | {mismatches} "
        f"mismatches over {steps} steps, greedy logprobs within {diff:.4f}, "
        f"{ties} near-tie split(s); first-token top-20 within {top:.4f} | its "
        "wrong-state control did not run (the suite's time limit ended it while "
        "its engine started; README.md there) |",
        "",
        provenance_line(engine),
    ]
    return rows


SUITE_2026_12_03 = "gpu/suite_2026-12-03/"
SUITE_2026_12_03C = "gpu/suite_2026-12-03c/"


def mamba2() -> list:
    """The captured Mamba2 extend on the H200: kernel level (results/gpu/mamba2/)
    and the tiny engines, graph vs eager with a wrong-state control per case
    (results/gpu/mamba2_2026-12-01b/; the first engine run, whose Falcon-H1
    control was too weak: results/gpu/mamba2/), and the models with layers
    without attention (results/gpu/mamba2_2026-12-02/)."""
    folder = "gpu/mamba2_2026-12-01b/"
    rows = [
        "",
        "Mamba2 full prefill graph (H200 unless a row says otherwise; the GDN "
        "row: the engine of the 2026-12-03 block, the same batches):",
        "",
        "| check | result |",
        "| --- | --- |",
        "| kernel level: `Mamba2AttnBackend.forward` captured and replayed for 24 "
        "random padded batches vs sglang's eager extend (outputs, conv/SSM pools) "
        "| `test/gpu/test_mamba2_extend_graph.py`: 27 passed, wrong-metadata "
        "controls included (log in results/gpu/mamba2/) |",
    ]
    names = {
        "nemotron_h_extra_buffer": 'tiny NemotronH "M*M" (bf16), extra buffer',
        "nemotron_h_no_buffer": 'tiny NemotronH "M*M" (bf16), no buffer',
        "falcon_h1_extra_buffer": "tiny Falcon-H1 (bf16, gated RMSNorm), extra buffer",
    }
    gaps = "gpu/mamba2_2026-12-02/"  # layers without attention, switch on
    names = {(folder, case): label for case, label in names.items()}
    names[(gaps, "nemotron_h_mlp_extra_buffer")] = (
        'tiny NemotronH "M-M*-" (bf16, MLP-only layers), extra buffer'
    )
    names[(gaps, "granite_moe_hybrid_extra_buffer")] = (
        "tiny GraniteMoeHybrid (bf16), extra buffer"
    )
    names[("gpu/mamba2_2026-12-03/", "falcon_h1_extra_buffer")] = (
        "tiny Falcon-H1 (bf16), extra buffer, K track rows per bucket (2026-12-03)"
    )
    names[(SUITE_2026_12_03, "nemotron_h_mlp_extra_buffer")] = (
        'tiny NemotronH "M-M*-" (bf16), extra buffer, request buckets, one-token '
        "prompts (a lone one, and a one-token extend on a prefix hit) (2026-12-03)"
    )
    names[(SUITE_2026_12_03C, "granite_moe_hybrid_extra_buffer")] = (
        "tiny GraniteMoeHybrid (bf16), extra buffer, request buckets 1 and 2 "
        "(2026-12-03, sixth run)"
    )
    names[(SUITE_2026_12_03C, "nemotron_h_groups8_extra_buffer")] = (
        'tiny NemotronH "M-M*-" (bf16, 8 groups), extra buffer, 12 request slots, '
        "request buckets 1, 2 and 4 (2026-12-03, sixth run)"
    )
    stems = {
        key: (
            f"mamba2_full_prefill_vs_eager_{key[1]}",
            f"mamba2_full_prefill_wrong_state_{key[1]}",
        )
        for key in names
    }
    # The GDN engine of the same block, FlashInfer's GDN prefill captured.
    key = (SUITE_2026_12_03, "gdn_default")
    names[key] = (
        "GDN: tiny Qwen3-Next, FlashInfer's GDN prefill, the same one-token prompts "
        "(2026-12-03)"
    )
    stems[key] = (
        "hybrid_gdn_full_prefill_vs_eager_default",
        "hybrid_gdn_full_prefill_wrong_state_default",
    )
    # The one-slot graphs (MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS), on an H100.
    key = ("gpu/mamba2_2026-12-07/", "nemotron_h_groups8_extra_buffer")
    names[key] = (
        'tiny NemotronH "M-M*-" (bf16, 8 groups), extra buffer, 4 request slots, '
        "graphs over one slot for token buckets 1024 and 2048, single prompts of "
        "513-3000 tokens (fresh, on a prefix hit, chunked in two), two at once and "
        "one of 300 (request bucket 1) (2026-12-07, on an H100)"
    )
    stems[key] = (
        f"mamba2_one_slot_graph_vs_eager_{key[1]}",
        f"mamba2_one_slot_graph_wrong_state_{key[1]}",
    )
    reports = []
    for (folder, case), label in names.items():
        vs_eager, wrong_state = stems[folder, case]
        report = _load(f"{folder}{vs_eager}.json")
        bad = _load(f"{folder}{wrong_state}.json")["batches"]
        diff, mismatches, steps = _steps(report["batches"])
        ties = sum(b["near_tie_splits"] for b in report["batches"])
        top = max(t["max_logprob_diff"] for t in report["first_token_topk"])
        # Replays per batch; the one-slot report also splits them by graph.
        replays = report["graph_replays"]
        if isinstance(replays, dict):
            replays = replays["mamba2_graph_replay"]
        # The control's batches in the graph run's order: the batches it replayed.
        replayed = [b for b, n in zip(bad, replays) if n]
        bad_ties = sum(
            not b["mismatches"] and b["near_tie_splits"] > 0 for b in replayed
        )
        rows.append(
            f"| {label}, graph vs eager, {len(report['batches'])} batches "
            f"({sum(replays)} replays) | greedy logprobs within "
            f"{diff:{'.4f' if diff >= 1e-3 else '.1e'}} over {steps} steps, {mismatches} mismatches, {ties} "
            f"near-tie splits; first-token top-{report['first_token_topk'][0]['k']} "
            f"within {top:.4f}; wrong-state control diverges on "
            f"{sum(map(_diverged, replayed))} of {len(replayed)} replayed batches "
            f"({bad_ties} of them only at a near tie) |"
        )
        reports.append(report)
    return rows + [""] + [provenance_line(report) for report in reports]


def gdn_prefill_kernel_choice() -> list:
    """benchmark/gdn_prefill_kernel_choice.py: FlashInfer's GDN prefill, one
    layer at Qwen3-Next-80B-A3B's dimensions, eager vs in a CUDA graph
    (results/gpu/gdn_prefill_kernel_choice_2026-12-02/)."""
    report = _load(
        "gpu/gdn_prefill_kernel_choice_2026-12-02/gdn_prefill_kernel_choice.json"
    )
    slots = report["slots"]
    rows = [
        "",
        "FlashInfer GDN prefill kernel choice, one layer at Qwen3-Next-80B-A3B's "
        f"dimensions (H200; ms per call, CUDA events; eager: FlashInfer's own "
        f"choice on the real rows, host work included; graph on {slots} slots: "
        "plain kernel, or context-parallel forced; graph on the real rows: "
        "FlashInfer's own choice):",
        "",
        "| layout | eager | graph, slots, plain | graph, slots, CP | graph, real rows |",
        "| --- | --- | --- | --- | --- |",
    ]
    for layout, case in report["cases"].items():
        cells = [case.get(k, {}).get("ms") for k in ("eager", "graph_plain", "graph_cp", "graph_real")]  # fmt: skip
        rows.append(
            f"| {layout} | "
            + " | ".join("-" if v is None else f"{v:.3f}" for v in cells)
            + " |"
        )
    cp = [int(n) for n, on in report["cp_auto_by_rows"].items() if on]
    rows += [
        "",
        f"FlashInfer picks its context-parallel kernel for {cp} sequence(s) here.",
        "",
        provenance_line(report),
    ]
    return rows


def served_profile() -> list:
    """One full-graph prefill forward of the served 80B-dims model, profiled in
    the scheduler (benchmark/prefill_graph_latency.py --profile --models
    qwen3-next-80b-fp8 --backends full; results/gpu/profile_qwen3_next_80b_fp8_2026-12-01/)."""
    report = _load(
        "gpu/profile_qwen3_next_80b_fp8_2026-12-01/prefill_graph_profile.json"
    )
    shapes = report["models"]["qwen3-next-80b-fp8"]["full"]
    rows = [
        "",
        "Where a full-graph prefill forward's time goes at Qwen3-Next-80B-A3B "
        "dimensions (48 layers, FP8, dummy weights, sglang's defaults, radix cache "
        "off; torch.profiler in the scheduler, per forward; host ms are inflated "
        "by the profiler, the unprofiled wall is not):",
        "",
        "| tokens x prompts | forward wall, unprofiled | GPU busy | GPU idle of "
        "wall | before replay (load_batch) | graph launch (host) | logits |"
        " top kernels, ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape, w in shapes.items():
        markers = w["markers_ms"]
        top = ", ".join(f"{k['name'][:24]} {k['ms']:.2f}" for k in w["top_kernels"][:3])
        rows.append(
            f"| {shape} | {w['wall_ms_unprofiled']:.1f} | {w['device_busy_ms']:.1f} "
            f"| {w['gpu_idle_fraction_unprofiled']:.0%} "
            f"| {markers['runner.load_batch']['ms']:.1f} "
            f"| {markers['graph.replay_full']['ms']:.1f} "
            f"| {markers['logits_processor']['ms']:.1f} | {top} |"
        )
    return rows + ["", provenance_line(report)]


MAMBA2_PROFILE = "gpu/mamba2_2026-12-03/prefill_graph_profile.json"


def mamba2_profile() -> list:
    """Falcon-H1-7B's prefill forward, full vs breakable, profiled in the
    scheduler with the radix cache on (benchmark/prefill_graph_latency.py
    --models falcon-h1-7b --profile --radix; results/gpu/mamba2_2026-12-03/):
    per shape the forward and the device ops only the full graph adds most."""
    report = _load(MAMBA2_PROFILE)
    model = report["models"]["falcon-h1-7b"]
    rows = [
        "",
        "Falcon-H1-7B (issue 16): one prefill forward, full graph (K track rows per "
        "bucket) vs breakable, profiled in the scheduler (44 layers, dummy weights, "
        "flashinfer attention, radix cache on, 16 request slots; torch.profiler per "
        "forward, the unprofiled wall from forwards without it):",
        "",
        "| tokens x prompts | forward wall, full / breakable (ms) | GPU busy, full / "
        "breakable (ms) | device ops the full graph adds most (ms per forward) |",
        "| --- | --- | --- | --- |",
    ]
    for shape, full in model["full"].items():
        breakable = model["breakable"][shape]
        extra = sorted(
            (
                (ms - breakable["kernels"].get(name, (0.0, 0))[0], name)
                for name, (ms, _calls) in full["kernels"].items()
            ),
            reverse=True,
        )[:4]
        adds = ", ".join(
            f"`{name.removeprefix('void at::native::')[:32]}` +{delta:.2f}"
            for delta, name in extra
        )
        rows.append(
            f"| {shape} | {full['wall_ms_unprofiled']:.1f} / "
            f"{breakable['wall_ms_unprofiled']:.1f} | {full['device_busy_ms']:.1f} / "
            f"{breakable['device_busy_ms']:.1f} | {adds} |"
        )
    return rows + ["", provenance_line(report)]


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def serving(files=("serving_prefill_graph.json",), heading="", renamed=None) -> list:
    """benchmark/serving_prefill_graph.py: one launch_server per prefill-graph
    mode, sglang.benchmark.serving against it; per workload TTFT p50 / p99, ITL
    p50 and output throughput, each full server's TTFT against breakable's. A run
    missing from a mode shows "-" (see the report's notes). ``renamed`` maps a
    file to the name its (one) mode is shown under, for a second server of a mode
    started with other flags."""
    reports = [_load(name) for name in files]
    report = {**reports[0], "modes": {}}  # one report per server, or one for all
    for name, part in zip(files, reports):
        for mode, entry in part["modes"].items():
            mode = (renamed or {}).get(name, mode)
            assert mode not in report["modes"], f"{mode} twice in {files}"
            report["modes"][mode] = entry
    order = ("disabled", "breakable", "full", *(renamed or {}).values())
    modes = [m for m in order if m in report["modes"]]
    fulls = [m for m in modes if m.startswith("full")]
    labels = list(dict.fromkeys(r for m in modes for r in report["modes"][m]["runs"]))

    def get(mode, run, key):
        return report["modes"][mode]["runs"].get(run, {}).get(key)

    def cell(run, key):
        return " / ".join(_ms(get(m, run, key)) for m in modes)

    def ratio(run, key):
        breakable = get("breakable", run, key)
        values = [get(m, run, key) for m in fulls]
        if not breakable or not any(values):
            return "-"
        return " / ".join(f"{breakable / v:.2f}x" if v else "-" for v in values)

    def eager(run):
        counts = [
            report["modes"][m]["runs"].get(run, {}).get("prefill_batches")
            for m in modes
        ]
        return " / ".join(
            "-"
            if not c
            else f"{c['eager']} of {c['graph'] + c['eager']}"
            + (f" (up to {c['eager_requests_max']} req)" if c["eager"] else "")
            for c in counts
        )

    rows = [
        "",
        heading + f"Serving path ({report['model']}, `python -m sglang.launch_server "
        "--load-format dummy` with sglang-graphfix installed, one server per mode, "
        "`python -m sglang.benchmark.serving` random-ids; "
        + " / ".join(modes)
        + "; ms, output tok/s; breakable / "
        + " / ".join(fulls)
        + ": TTFT p50 speed-up; prefill batches that ran eager, of all, per mode):",
        "",
        "| workload | TTFT p50 | TTFT p99 | ITL p50 | output tok/s | breakable / "
        + " / ".join(fulls)
        + " | eager prefill batches |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in labels:
        rows.append(
            f"| {run} | {cell(run, 'median_ttft_ms')} | {cell(run, 'p99_ttft_ms')} "
            f"| {cell(run, 'median_itl_ms')} | {cell(run, 'output_throughput')} "
            f"| {ratio(run, 'median_ttft_ms')} | {eager(run)} |"
        )
    rows += [
        "",
        "| server | " + " | ".join(modes) + " |",
        "| --- |" + " --- |" * len(modes),
    ]
    facts = (
        ("log start to ready, s", "ready_s"),
        ("prefill graph capture, s", "prefill_graph_capture_s"),
        ("prefill graph memory, GB", "prefill_graph_gb"),
        ("decode graph capture, s", "decode_graph_capture_s"),
        ("weights, GB", "weights_gb"),
    )
    for name, key in facts:
        values = [report["modes"][m].get("server_log", {}).get(key) for m in modes]
        rows.append(f"| {name} | " + " | ".join(str(v or "-") for v in values) + " |")
    captured = [
        report["modes"][m].get("server_log", {}).get("prefill_graph_captured")
        for m in modes
    ]
    if any(captured):  # recorded since 2026-12-02: a mode may serve another graph
        rows.append(
            "| prefill graph captured | "
            + " | ".join(c or "none" for c in captured)
            + " |"
        )
    for m in modes:
        entry = report["modes"][m]
        if entry.get("recovered_from_jsonl"):
            rows.append(
                f"| {m}: rows rebuilt from sglang.benchmark.serving's JSONL "
                "(`--recover`) | " + ", ".join(entry["recovered_from_jsonl"]) + " |"
            )
        if entry.get("error"):
            rows.append(f"| {m}: error | {entry['error']} |")
        for label, why in (entry.get("skipped") or {}).items():
            rows.append(f"| {m}: {label} not run | {why} |")
    notes = [n for part in reports for n in part.get("notes_hand_written") or []]
    if notes:
        rows += [
            "",
            "Notes on this run (typed by hand after it, not recorded by the script):",
        ]
        rows += [f"* {note}" for note in notes]
    return rows + [""] + [provenance_line(part) for part in reports]


SERVING_SAME_SESSION = (
    "gpu/serving_2026-12-01b/breakable/serving_prefill_graph.json",
    "gpu/serving_2026-12-01b/full/serving_prefill_graph.json",
)
SERVING_CAPPED = "gpu/serving_2026-12-02/full_capped/serving_prefill_graph.json"
SERVING_LONG = "gpu/serving_2026-12-02b/full_breakable_long/serving_prefill_graph.json"
SERVING_FALCON_H1 = "gpu/serving_2026-12-02c/falcon_h1_7b/serving_prefill_graph.json"
SERVING_NEMOTRON_H = (
    "gpu/serving_2026-12-03/nemotron_h_8b/serving_prefill_graph.json",
    "gpu/serving_2026-12-03/nemotron_h_8b_request_buckets/serving_prefill_graph.json",
)
SERVING_NEMOTRON_H_LONG = (
    "gpu/serving_2026-12-03c/nemotron_h_8b_long/serving_prefill_graph.json"
)
SERVING_NEMOTRON_H_SIZES = (
    "gpu/serving_2026-12-04/nemotron_h_8b_sizes_bound_lifted/serving_prefill_graph.json",
    "gpu/serving_2026-12-04/nemotron_h_8b_sizes_conv_table/serving_prefill_graph.json",
    "gpu/serving_2026-12-04/nemotron_h_8b_sizes_as_shipped/serving_prefill_graph.json",
)
SERVING_NEMOTRON_H_ONE_SLOT = (
    "gpu/serving_2026-12-07/nemotron_h_8b_one_slot/serving_prefill_graph.json"
)
SERVING_NEMOTRON_H_AS_SHIPPED = (
    "gpu/serving_2026-12-07b/nemotron_h_8b_as_shipped/serving_prefill_graph.json"
)
SERVING_QWEN3_5 = "gpu/serving_2026-12-07d/qwen3_5_35b_a3b/serving_prefill_graph.json"
SERVING_FALCON_H1_REQUEST_BUCKETS = (
    "gpu/serving_2026-12-03c/falcon_h1_7b_request_buckets/serving_prefill_graph.json"
)
SERVING_LATEST = (
    "gpu/serving_2026-12-02/full_breakable/serving_prefill_graph.json",
    SERVING_CAPPED,
)


def render() -> str:
    return "\n".join(
        gdn_latency()
        + kimi_latency()
        + correctness()
        + dsa_overhead()
        + merged_gate_precision()
        + plugin_and_fallback()
        + gdn_prefill_accuracy()
        + mamba2()
        + mamba2_profile()
        + served_profile()
        + masked_state_copy()
        + gdn_prefill_kernel_choice()
        + serving(
            (SERVING_QWEN3_5,),
            "Qwen3.5-35B-A3B's text model (issue 13; 2026-12-07, tree 03cf7a4, on "
            "an H100, FP8, dummy weights, sglang's default chunking and fa3 "
            "attention): breakable and full one after the other (the machine was "
            "lost while the disabled server started). Full captured FlashInfer's "
            "GDN prefill over 16 request slots, where FlashInfer runs its plain "
            "kernel; breakable's eager prefill of one or two prompts runs its "
            "context-parallel one (benchmark/results/gpu/serving_2026-12-07d/). ",
        )
        + serving(
            SERVING_NEMOTRON_H,
            "Mamba2 hybrid with MLP layers (issue 16), on which sglang runs every "
            "prefill eager (breakable here is eager); the three servers one after "
            "another in one session, at one commit. 'full, request buckets': full "
            "with MAMBA2_REQUEST_BUCKETS_CAPTURED on (the test probe's "
            "GRAPHFIX_PROBE_MAMBA2_REQUEST_BUCKETS_CAPTURED=1; off in that tree, "
            "on as shipped since). ",
            renamed={SERVING_NEMOTRON_H[1]: "full, request buckets"},
        )
        + serving(
            (SERVING_NEMOTRON_H_LONG,),
            "Nemotron-H-8B's long prompts (issue 16; a later session, tree "
            "d56e344, request buckets on), full vs breakable (eager on this model), "
            "one server after the other; its 8192 positions leave out the 8k-16k "
            "run. ",
        )
        + serving(
            (SERVING_NEMOTRON_H_AS_SHIPPED,),
            "Nemotron-H-8B as shipped (issue 16; 2026-12-07, tree 844ce50, on an "
            "H100, the two servers one after the other): full with the one-slot "
            "graphs up to 1536 tokens and longer prompts routed eager "
            "(MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST), against breakable (eager on "
            "this model). ",
        )
        + serving(
            (SERVING_NEMOTRON_H_ONE_SLOT,),
            "Nemotron-H-8B with a graph over one request slot for token buckets "
            "576-4096 (issue 16; 2026-12-07, tree 5125fd7, on an H100, the two "
            "servers one after the other): full with the length bound lifted and "
            "the one-slot tier on (the test probe's "
            "GRAPHFIX_PROBE_MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST=100000 and "
            "GRAPHFIX_PROBE_MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS=4096; then off "
            "as shipped, on up to 1536 since 2026-12-07) against breakable (eager on this model); the control without "
            "the tier did not run in that session. ",
        )
        + serving(
            SERVING_NEMOTRON_H_SIZES,
            "Nemotron-H-8B, where the full graph stops beating eager (issue 16; "
            "2026-12-04, tree 3ecbadc, four servers one after another): full with "
            "the length bound lifted (the test probe's "
            "GRAPHFIX_PROBE_MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST=100000) and "
            "breakable (eager on this model); 'full, conv table': the same with "
            "MAMBA2_CONV_BLOCK_TABLE on (GRAPHFIX_PROBE_MAMBA2_CONV_BLOCK_TABLE=1); "
            "'full, bound 512': full as shipped in that tree, whose runs above 512 "
            "tokens a prompt ran eager. ",
            renamed={
                SERVING_NEMOTRON_H_SIZES[1]: "full, conv table",
                SERVING_NEMOTRON_H_SIZES[2]: "full, bound 512",
            },
        )
        + serving(
            (SERVING_FALCON_H1_REQUEST_BUCKETS,),
            "Falcon-H1-7B with the full graph kept (the test probe's "
            "GRAPHFIX_PROBE_MAMBA2_FULL_BEATS_BREAKABLE=1; as shipped it runs "
            "breakable) and request buckets on, against breakable, one server after "
            "the other (2026-12-03, tree d56e344). ",
        )
        + serving(
            (SERVING_FALCON_H1,),
            "Mamba2 hybrid (issue 16): the three servers one after another in one "
            "session, at one commit; full's median time to first token is above "
            "breakable's at every workload. ",
        )
        + serving(
            (SERVING_LONG,),
            "Long single prompts and bursts, full vs breakable, one session "
            "(2026-12-02, second block). ",
        )
        + serving(
            SERVING_LATEST,
            "As shipped (FlashInfer's GDN prefill captured, padding request slots "
            "move no state); the three servers one after another in one session, at "
            "one commit. 'full, capped': full with --prefill-max-requests 16, the "
            "cap sglang-graphfix now sets (cap_prefill_batches_at_request_slots), "
            "chat workload only. ",
            renamed={SERVING_CAPPED: "full, capped"},
        )
        + serving(
            SERVING_SAME_SESSION,
            "An earlier session (before the masked state copy and the batch cap); "
            "both servers in one session, at one commit. ",
        )
        + serving(
            heading="An earlier run (the graph captured Triton's GDN prefill then). "
        )
    )


README = ROOT / "README.md"
_QWEN3_NEXT = SERVING_LATEST[0]
_CHAT = (
    ("chat-like, 2 requests/s", "chat rate 2"),
    ("chat-like, 8 requests/s", "chat rate 8"),
    ("chat-like, 32 requests/s", "chat rate 32"),
    ("chat-like, 100 requests at once", "chat rate inf"),
)
_BURSTS = (
    ("1 prompt x 16 tokens", "1 x 16 tokens"),
    ("1 prompt x 256 tokens", "1 x 256 tokens"),
    ("4 prompts x 256 tokens", "4 x 256 tokens"),
    ("8 prompts x 64 tokens", "8 x 64 tokens"),
)
# README.md's speed-up tables: name -> (breakable's column title, rows of (label,
# (file, run) of full, (file, run) of breakable)); each median from the file's
# "full" and "breakable" modes.
README_TABLES = {
    "qwen3-next-served": (
        "breakable",
        [(label, (SERVING_CAPPED, run), (_QWEN3_NEXT, run)) for label, run in _CHAT]
        + [(label, (_QWEN3_NEXT, run), (_QWEN3_NEXT, run)) for label, run in _BURSTS]
        + [
            (
                "1 prompt of 8k-16k tokens (4 prompts)",
                (_QWEN3_NEXT, "long 8k-16k"),
                (_QWEN3_NEXT, "long 8k-16k"),
            )
        ],
    ),
    "nemotron-h-served": (
        "breakable (eager)",
        [
            (label, (SERVING_NEMOTRON_H[1], run), (SERVING_NEMOTRON_H[0], run))
            for label, run in _BURSTS + _CHAT
        ]
        + [
            (
                f"1 prompt x {size} tokens, before the bound below",
                (SERVING_NEMOTRON_H_LONG, f"1 x {size} tokens"),
                (SERVING_NEMOTRON_H_LONG, f"1 x {size} tokens"),
            )
            for size in ("2k-4k", "4k-8k")
        ],
    ),
}
GOALS = (1.0, 1.5, 2.0)  # speed-ups the issues ask for (1.0: never slower)


def speedup(ratio: float) -> str:
    """A speed-up to two decimals, or three where two would round it across a
    goal (1.495 is not shown as 1.50); bold below 1 (slower)."""
    text = f"{ratio:.2f}"
    if any((ratio < goal) != (float(text) < goal) for goal in GOALS):
        text = f"{ratio:.3f}"
    return f"**{text}x**" if ratio < 1 else f"{text}x"


def readme_table(name: str) -> list:
    """One of README.md's speed-up tables (README_TABLES), each row the two
    servers' median time to first token and breakable's over full's."""
    breakable_title, rows = README_TABLES[name]
    lines = [
        f"| workload | full | {breakable_title} | speed-up |",
        "| --- | --- | --- | --- |",
    ]

    def median(mode, name, run):
        return _load(name)["modes"][mode]["runs"][run]["median_ttft_ms"]

    for label, full, breakable in rows:
        full, breakable = median("full", *full), median("breakable", *breakable)
        lines.append(
            f"| {label} | {full:.1f} ms | {breakable:.1f} ms "
            f"| {speedup(breakable / full)} |"
        )
    return lines


def readme_markers(name: str) -> tuple:
    return f"<!-- table:{name}:begin -->", f"<!-- table:{name}:end -->"


def readme_rendered(content: str, name: str) -> list:
    """The lines README.md holds between table ``name``'s markers, unindented."""
    begin, end = readme_markers(name)
    body = content.split(begin, 1)[1].split(end, 1)[0]
    return [line.strip() for line in body.strip().split("\n")]


def write_readme() -> None:
    content = README.read_text()
    for name in README_TABLES:
        begin, end = readme_markers(name)
        head, rest = content.split(begin, 1)
        tail = rest.split(end, 1)[1]
        indent = head[head.rfind("\n") + 1 :]  # the markers' (a list item's)
        rows = "".join(f"{indent}{line}\n" for line in readme_table(name))
        content = f"{head}{begin}\n{rows}{indent}{end}{tail}"
    README.write_text(content)


def main():
    text = render()
    if "--write" not in sys.argv:
        print(text)
        return
    content = TARGET.read_text()
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    TARGET.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    write_readme()


if __name__ == "__main__":
    main()
