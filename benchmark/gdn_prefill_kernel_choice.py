"""Which FlashInfer GDN prefill kernel a long prompt gets, eager and in a full
prefill graph, and what each costs (one GDN layer at Qwen3-Next-80B-A3B's
dimensions: 16 q/k heads, 32 value heads of 128; fp32 states; H200).

Why: served at those dimensions, one prompt of 8k-16k tokens took 318 ms to its
first token under the full prefill graph against breakable's 291 ms
(benchmark/results/gpu/serving_2026-12-02/). FlashInfer's
``chunk_gated_delta_rule`` takes its context-parallel (CP) kernel when
``num_seqs * heads`` is small against the SM count (flashinfer
``should_use_cp_host``); breakable runs the GDN extend eagerly on the real batch
(one sequence: CP), the full graph was captured with the bucket's request slots
(16 at sglang's default chunking: the plain kernel). This measures, per token
count and batch layout:

* ``eager``: the kernel on the real sequences only, FlashInfer's own choice
  (``use_cp="auto"``), as breakable's eager GDN extend calls it, timed as called
  (its wrapper's host work included);
* ``graph_plain``: in a CUDA graph on the bucket's slots (zero-length padding
  rows), ``use_cp=False``, what the full graph replays today;
* ``graph_cp``: the same graph with ``use_cp=True`` (FlashInfer's chunk length,
  and ``--cp-chunk-len`` values), a candidate for long buckets;
* ``graph_real``: a graph with as many rows as real sequences (``"auto"``): eager's
  kernel choice without the host work, what a graph per request count would
  replay, and the baseline the other graphs compare with.

Times: CUDA events around 20 back-to-back calls (graph replays), median of 5,
per call in ms. Each graph's output is checked against ``eager`` (max abs diff
of output and final state), and every warning FlashInfer raised while capturing
it is kept (a CP request it cannot serve falls back to the plain kernel with a
RuntimeWarning only). Writes $OUT/gdn_prefill_kernel_choice.json (else
benchmark/results/) with provenance. Needs an SM90 GPU with FlashInfer's GDN
kernels.

    python3 benchmark/gdn_prefill_kernel_choice.py [--tokens 2048,4096,8192]
        [--slots 16] [--cp-chunk-len 1024,2048]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmark")]

QK_HEADS, V_HEADS, DIM = 16, 32, 128


def layouts(tokens: int, slots: int) -> dict[str, list[int]]:
    """Real sequence lengths per layout: one prompt, two, and every slot full."""
    return {
        f"1 x {tokens}": [tokens],
        f"2 x {tokens // 2}": [tokens // 2] * 2,
        f"{slots} x {tokens // slots}": [tokens // slots] * slots,
    }


def padded_cu_seqlens(lens: list[int], rows: int) -> list[int]:
    """Cumulative lengths over ``rows`` rows: the real ones, then zero-length
    padding rows (as the full graph's tables pad the request slots)."""
    cu = [0]
    for n in lens + [0] * (rows - len(lens)):
        cu.append(cu[-1] + n)
    return cu


def make_inputs(tokens: int, rows: int, seed: int = 0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=dtype)

    q = torch.nn.functional.normalize(rand(tokens, QK_HEADS, DIM).float(), dim=-1)
    k = torch.nn.functional.normalize(rand(tokens, QK_HEADS, DIM).float(), dim=-1)
    return {
        "q": q.to(torch.bfloat16),
        "k": k.to(torch.bfloat16),
        "v": rand(tokens, V_HEADS, DIM) * 0.1,
        # alpha = exp(g) with g a small negative log-decay; beta in (0, 1)
        "g": torch.exp(
            -torch.rand(tokens, V_HEADS, generator=gen, device="cuda") * 0.1
        ),
        "beta": torch.sigmoid(rand(tokens, V_HEADS, dtype=torch.float32)),
        "state": rand(rows, V_HEADS, DIM, DIM, dtype=torch.float32) * 0.01,
    }


def call(prefill_fn, x, cu_seqlens, rows: int, use_cp, cp_chunk_len=None):
    """One chunk_gated_delta_rule call on the first ``rows`` rows' states;
    returns (output, final state)."""
    import torch

    kwargs = {"use_cp": use_cp}
    if cp_chunk_len is not None:
        kwargs["_cp_chunk_len"] = cp_chunk_len
    output = torch.zeros_like(x["v"])
    initial = x["state"][:rows]
    return prefill_fn(
        q=x["q"],
        k=x["k"],
        v=x["v"],
        g=x["g"],
        beta=x["beta"],
        scale=None,
        initial_state=initial,
        output_final_state=True,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=False,
        output=output,
        output_state=torch.empty_like(initial),
        **kwargs,
    )


def timed(fn, reps: int = 20, rounds: int = 5) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / reps)
    return round(statistics.median(per_call), 4)


def graphed(prefill_fn, x, cu, rows, use_cp, cp_chunk_len=None):
    """Capture one call in a CUDA graph; (replay, outputs of the capture)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # JIT and allocator warm-up off the graph
            call(prefill_fn, x, cu, rows, use_cp, cp_chunk_len)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(prefill_fn, x, cu, rows, use_cp, cp_chunk_len)
    return graph.replay, out


def measure(prefill_fn, lens: list[int], slots: int, cp_chunk_lens) -> dict:
    import torch

    tokens = sum(lens)
    x = make_inputs(tokens, slots)
    real = len(lens)
    cu_real = torch.tensor(padded_cu_seqlens(lens, real), device="cuda")
    cu_slots = torch.tensor(padded_cu_seqlens(lens, slots), device="cuda")
    ref_out, ref_state = call(prefill_fn, x, cu_real, real, "auto")
    ref_out, ref_state = ref_out.clone(), ref_state[:real].clone()

    def diff(out):
        o, s = out
        return {
            "output": (o.float() - ref_out.float()).abs().max().item(),
            "state": (s[:real] - ref_state).abs().max().item(),
        }

    result = {
        "eager": {
            "ms": timed(lambda: call(prefill_fn, x, cu_real, real, "auto")),
        }
    }
    variants = {
        "graph_plain": (cu_slots, slots, False, None),
        "graph_cp": (cu_slots, slots, True, None),
        **{f"graph_cp_chunk{c}": (cu_slots, slots, True, c) for c in cp_chunk_lens},
        "graph_real": (cu_real, real, "auto", None),
    }
    for name, (cu, rows, use_cp, chunk) in variants.items():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                replay, out = graphed(prefill_fn, x, cu, rows, use_cp, chunk)
                replay()
                torch.cuda.synchronize()
                result[name] = {
                    "ms": timed(replay),
                    "max_abs_diff_vs_eager": diff(out),
                }
            except Exception as exc:  # a variant FlashInfer refuses is a result
                result[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        result[name]["warnings"] = sorted({str(w.message)[:300] for w in seen})
    real_ms = result["graph_real"].get("ms")
    for entry in result.values():
        if real_ms and entry.get("ms"):
            entry["vs_graph_real"] = round(entry["ms"] / real_ms, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="2048,4096,8192")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--cp-chunk-len", default="1024,2048")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    import torch
    from flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper import should_use_cp_host
    from flashinfer.gdn_prefill import chunk_gated_delta_rule as prefill_fn
    from provenance import provenance

    props = torch.cuda.get_device_properties(0)
    chunks = [int(c) for c in args.cp_chunk_len.split(",") if c]
    report = {
        "provenance": provenance(),
        "dims": {"qk_heads": QK_HEADS, "v_heads": V_HEADS, "head_dim": DIM},
        "slots": args.slots,
        "sm_count": props.multi_processor_count,
        "cp_auto_by_rows": {
            rows: should_use_cp_host(
                rows * V_HEADS, props.multi_processor_count, props.name
            )
            for rows in (1, 2, 3, 4, args.slots)
        },
        "cases": {},
    }
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    path = (
        Path(args.output)
        if args.output
        else (
            (out_dir or ROOT / "benchmark" / "results")
            / "gdn_prefill_kernel_choice.json"
        )
    )
    for tokens in (int(t) for t in args.tokens.split(",")):
        for label, lens in layouts(tokens, args.slots).items():
            report["cases"][label] = measure(prefill_fn, lens, args.slots, chunks)
            print(label, json.dumps(report["cases"][label]), flush=True)
            path.write_text(json.dumps(report, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
