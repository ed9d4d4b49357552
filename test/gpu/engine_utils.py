"""Run a real sglang.Engine on a tiny model and collect greedy tokens + logprobs.

The engine's scheduler runs in a subprocess; it loads sglang-graphfix through the
``sglang.srt.plugins`` entry point (the package must be installed) and the test
probe plugin under ``test/gpu/probe`` (put on PYTHONPATH here), which counts
graph-path events in files under ``GRAPHFIX_PROBE_DIR``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE_PATH = HERE / "probe"
PROBE_DIR = Path(
    os.environ.setdefault("GRAPHFIX_PROBE_DIR", f"/tmp/graphfix-probe-{os.getpid()}")
)
PROBE_DIR.mkdir(parents=True, exist_ok=True)
# multiprocessing's spawn hands the engine processes this sys.path (not PYTHONPATH).
sys.path.insert(0, str(PROBE_PATH))


@contextmanager
def _env(env: dict | None):
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def probe_count(name: str) -> int:
    path = PROBE_DIR / name
    return path.stat().st_size if path.exists() else 0


def probe_counts() -> dict:
    return {p.name: p.stat().st_size for p in PROBE_DIR.iterdir()}


def _parse(out: dict) -> dict:
    meta = out["meta_info"]
    steps = meta["output_token_logprobs"]
    top = meta.get("output_top_logprobs") or [None] * len(steps)
    return {
        "output_ids": list(out["output_ids"]),
        "output_logprobs": [float(s[0]) for s in steps],
        # Best two logprobs per step: a greedy split between engines is only
        # acceptable where these are (nearly) tied.
        "top2": [[float(t[0]) for t in (row or [])[:2]] for row in top],
        # The first generated token's top-k logprobs (top_logprobs_num of them),
        # token id -> logprob: the prefill's logits, compared by first_token_topk.
        "first_topk": {int(t[1]): float(t[0]) for t in (top[0] or [])} if top else {},
        # Prompt tokens the radix cache served (a prefix hit's length).
        "cached_tokens": meta.get("cached_tokens"),
    }


def chunk_256_engine_kwargs(model_path, prefill: dict) -> dict:
    """An engine for models.chunk_256_batches(): flashinfer attention (it plans a
    full prefill extend), chunked prefill and the largest bucket at 256 tokens,
    pools capped so that the GPU suite runs several engines on one GPU at once;
    ``prefill``: the cuda_graph_config's prefill phase."""
    return {
        "model_path": model_path,
        "attention_backend": "flashinfer",
        "chunked_prefill_size": 256,
        "context_length": 2048,
        "mem_fraction_static": 0.3,
        "max_total_tokens": 32768,
        "max_mamba_cache_size": 64,
        "cuda_graph_max_bs_decode": 4,
        "cuda_graph_config": {"prefill": prefill},
    }


def run_engine(
    engine_kwargs: dict,
    batches: list,
    *,
    env: dict | None = None,
    top_logprobs_num: int = 2,
) -> list:
    """Start an Engine, run each batch in order, shut it down.

    A batch: {"input_ids": [[int]], "max_new_tokens": int, "lora_path": ...}, where
    lora_path is one adapter (or None) for every prompt, or a list of them, one
    per prompt.
    Returns one list per batch, one dict per prompt (output_ids, output_logprobs,
    top2); the first dict of each batch also holds "probe_counts" (snapshot after
    the batch) and "seconds" (wall time of the batch).
    """
    import sglang

    kwargs = {"skip_tokenizer_init": True, "log_level": "warning", **engine_kwargs}
    results = []
    with _env(env):
        engine = sglang.Engine(**kwargs)
        try:
            for batch in batches:
                prompts, lora = batch["input_ids"], batch.get("lora_path")
                loras = lora if isinstance(lora, list) else [lora] * len(prompts)
                start = time.perf_counter()
                outs = engine.generate(
                    input_ids=prompts,
                    sampling_params={
                        "temperature": 0.0,
                        "max_new_tokens": batch["max_new_tokens"],
                        "ignore_eos": True,
                    },
                    return_logprob=True,
                    top_logprobs_num=top_logprobs_num,
                    lora_path=loras if any(loras) else None,
                )
                seconds = time.perf_counter() - start
                parsed = [_parse(o) for o in outs]
                parsed[0]["probe_counts"] = probe_counts()
                parsed[0]["seconds"] = seconds
                results.append(parsed)
        finally:
            engine.shutdown()
    return results


def compare(reference: list, candidate: list, *, tol: float) -> dict:
    """Greedy outputs of two engines on the same prompts.

    Tokens must agree and logprobs stay within ``tol``; a split in the greedy
    token is accepted only at a near tie (both runs' best two logprobs within
    ``tol``), and the sequence is compared only up to there.
    """
    max_diff, splits, compared, mismatches, gaps = 0.0, 0, 0, [], []
    for i, (a, b) in enumerate(zip(reference, candidate)):
        for t, (ta, tb) in enumerate(zip(a["output_ids"], b["output_ids"])):
            if ta != tb:
                tied = all(
                    len(r["top2"][t]) == 2 and r["top2"][t][0] - r["top2"][t][1] <= tol
                    for r in (a, b)
                )
                if tied:
                    splits += 1
                    # How near the tie was: the wider of the two runs' top-two gaps.
                    gaps.append(max(r["top2"][t][0] - r["top2"][t][1] for r in (a, b)))
                else:
                    mismatches.append({"prompt": i, "step": t, "tokens": [ta, tb]})
                break
            diff = abs(a["output_logprobs"][t] - b["output_logprobs"][t])
            max_diff = max(max_diff, diff)
            compared += 1
            if diff > tol:
                mismatches.append({"prompt": i, "step": t, "logprob_diff": diff})
        else:  # every shared step agreed: the outputs must also be as long
            if len(a["output_ids"]) != len(b["output_ids"]):
                mismatches.append(
                    {
                        "prompt": i,
                        "lengths": [len(a["output_ids"]), len(b["output_ids"])],
                    }
                )
    return {
        "compared_steps": compared,
        "max_logprob_diff": max_diff,
        "near_tie_splits": splits,
        "near_tie_gaps": gaps,
        "mismatches": mismatches,
    }


def diverged(report: dict) -> bool:
    """For can-fail controls: a compare() report whose greedy outputs left the
    reference anywhere, including at a near tie (the graph-vs-eager checks
    accept those; a random tiny model has many, so a broken state can hide
    behind one)."""
    return bool(report["mismatches"] or report["near_tie_splits"])


def first_token_topk(reference: list, candidate: list) -> dict:
    """The prefill's logits, as the first generated token's top-k logprobs of two
    engines (run_engine(top_logprobs_num=k)): how many of the k token ids both
    rank in their top k, and the largest logprob difference among those."""
    max_diff, shared, k = 0.0, [], 0
    for a, b in zip(reference, candidate):
        ta, tb = a["first_topk"], b["first_topk"]
        k = max(k, len(ta))
        common = ta.keys() & tb.keys()
        shared.append(len(common))
        max_diff = max([max_diff] + [abs(ta[t] - tb[t]) for t in common])
    return {"k": k, "shared_topk_per_prompt": shared, "max_logprob_diff": max_diff}


def replays_per_batch(results: list, before: int, counter: str) -> list:
    """How often the probe ``counter`` fired during each batch of run_engine()."""
    counts = [r[0]["probe_counts"].get(counter, 0) for r in results]
    return [b - a for a, b in zip([before] + counts, counts)]


def graph_vs_eager(eager: list, graph: list, *, tol: float) -> dict:
    """Per batch: compare() and first_token_topk() of a graph engine's outputs
    against the eager engine's, as the GPU tests write and assert them."""
    return {
        "tolerance": tol,
        "batches": [compare(e, g, tol=tol) for e, g in zip(eager, graph)],
        "first_token_topk": [first_token_topk(e, g) for e, g in zip(eager, graph)],
    }


def assert_graph_matches_eager(report: dict) -> None:
    """Greedy tokens and logprobs within tolerance in every batch (a batch may
    compare no step only where its first token split at a near tie); the
    prefill's logits (first token's top-k) share all but two tokens, and their
    logprobs of the same tokens agree within tolerance."""
    for r in report["batches"]:
        assert (r["compared_steps"] > 0 or r["near_tie_splits"]) and not r[
            "mismatches"
        ], r
    for f in report["first_token_topk"]:
        assert min(f["shared_topk_per_prompt"]) >= f["k"] - 2, f
        assert f["max_logprob_diff"] <= report["tolerance"], f


def _provenance() -> dict:
    """benchmark/provenance.py's record (commit + dirty flag, versions, device,
    date, command), loaded from its file: benchmark/ is not a package."""
    from benchmark_modules import load_benchmark

    return load_benchmark("provenance", "graphfix_provenance").provenance()


def write_result(name: str, payload: dict) -> None:
    out = Path(os.environ.get("OUT") or HERE / ".results")
    out.mkdir(parents=True, exist_ok=True)
    payload = {"provenance": _provenance(), **payload}
    (out / f"{name}.json").write_text(
        json.dumps(payload, indent=2, sort_keys=True) + "\n"
    )
