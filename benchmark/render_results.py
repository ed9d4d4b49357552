"""Render the committed GPU measurements (benchmark/results/) as the README's
results section.

    python3 benchmark/render_results.py            # print the markdown
    python3 benchmark/render_results.py --write    # replace it in README.md
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmark" / "results"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _load(name):
    return json.loads((RESULTS / name).read_text())


def render() -> str:
    latency = _load("prefill_graph_latency.json")
    kernel = _load("gpu/gdn_extend_kernel.json")["max_abs_diff"]
    kernel_bad = _load("gpu/gdn_extend_kernel_wrong_state.json")["max_abs_diff"]
    gdn = _load("gpu/hybrid_gdn_full_prefill_vs_eager.json")
    gdn_bad = _load("gpu/hybrid_gdn_full_prefill_wrong_state.json")
    dsa = _load("gpu/dsa_lora_graph_vs_eager.json")
    dsa_effect = _load("gpu/dsa_lora_adapter_effect.json")["graph_without_vs_with"]
    dsa_path = _load("gpu/dsa_lora_graph_path.json")
    dsa_start = _load("gpu/dsa_lora_startup.json")

    rows = [
        f"Prefill latency, {latency['model']}, {latency['workload']} ({latency['device']}):",
        "",
        "| prefill CUDA graph | median ms | p90 ms |",
        "| --- | --- | --- |",
    ]
    for name, r in latency["prefill_backend"].items():
        rows.append(f"| {name} | {r['median_ms']} | {r['p90_ms']} |")
    worst_kernel = max(
        max(d["output"], d["conv_state"], d["ssm_state"]) for d in kernel.values()
    )
    rows += [
        "",
        "Correctness (graph vs eager; each check has a can-fail control with a deliberately wrong state or without the adapter):",
        "",
        "| check | graph vs eager | wrong state / no adapter |",
        "| --- | --- | --- |",
        f"| GDN extend kernels, one captured bucket replayed for {len(kernel)} batches (output, conv and SSM state, tracking) | max abs diff {worst_kernel} | output diff {kernel_bad['output']:.3g}, SSM state diff {kernel_bad['ssm_state']:.3g} |",
        f"| GDN hybrid engine, full prefill graph ({sum(gdn['graph_replays'])} replays over {len(gdn['batches'])} batches) | max logprob diff {max(b['max_logprob_diff'] for b in gdn['batches']):.2g}, {sum(len(b['mismatches']) for b in gdn['batches'])} mismatches over {sum(b['compared_steps'] for b in gdn['batches'])} steps | {sum(len(b['mismatches']) for b in gdn_bad['batches'])} mismatches, every batch |",
        f"| DSA weights_proj LoRA, breakable prefill graph (head gate in the split op: {dsa_start['capture_head_gate_calls']} calls at capture, {dsa_path['graph_adapter_batch_head_gate_calls']} in the adapter batch, {dsa_path['eager_engine_head_gate_calls']} eager) | max logprob diff {dsa['max_logprob_diff']:.2g}, {len(dsa['mismatches'])} mismatches over {dsa['compared_steps']} steps | {len(dsa_effect['mismatches'])} mismatches without the adapter |",
    ]
    return "\n".join(rows)


def main():
    text = render()
    if "--write" not in sys.argv:
        print(text)
        return
    readme = ROOT / "README.md"
    content = readme.read_text()
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
