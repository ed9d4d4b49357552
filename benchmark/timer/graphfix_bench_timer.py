"""Benchmark-only sglang plugin: times every prefill forward inside the scheduler.

With GRAPHFIX_BENCH_TIMER=<file> set, ModelRunner.forward is timed for EXTEND
batches (device synchronised before and after, so the time is the forward's GPU
work plus its launch overhead, without the scheduler and IPC around it) and one
line "batch_size tokens graph ms" is appended to the file per forward.
benchmark/prefill_graph_latency.py puts this folder on sys.path; sglang finds the
plugin through the dist-info beside it.
"""

import os
import time
from collections import defaultdict
from pathlib import Path


def read_forwards(path) -> dict:
    """The file register() writes: (batch size, tokens) -> [(graph, ms)], in order."""
    forwards = defaultdict(list)
    for line in Path(path).read_text().splitlines():
        bs, tokens, graph, ms = line.split()
        forwards[(int(bs), int(tokens))].append((bool(int(graph)), float(ms)))
    return forwards


def register():
    path = os.environ.get("GRAPHFIX_BENCH_TIMER")
    if not path:
        return
    import torch
    from sglang.srt.model_executor.model_runner import ModelRunner

    forward = ModelRunner.forward

    def timed_forward(self, forward_batch, *args, **kwargs):
        if not forward_batch.forward_mode.is_extend():
            return forward(self, forward_batch, *args, **kwargs)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = forward(self, forward_batch, *args, **kwargs)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        tokens = int(forward_batch.input_ids.shape[0])
        with open(path, "a") as f:
            f.write(
                f"{forward_batch.batch_size} {tokens} {int(out.can_run_graph)} {ms:.4f}\n"
            )
        return out

    ModelRunner.forward = timed_forward
