"""The captured GDN extend's prefix-cache snapshot of SSM states
(gdn_prefill_graph._snapshot_ssm_states) on tables a replay refilled through
sglang's table hooks (test/gdn_stub.py's live batch: chunk-state, final-state
and untracked rows), with GDN_TRACK_SNAPSHOT_KERNEL off (sglang's gather and
kda_track_ssm_state) and on (sgl-kernel's snapshot_state_rows), both in Triton's
CPU interpreter; prints one JSON line per case. A script, not a test:
TRITON_INTERPRET must be set before triton is first imported
(test_gdn_track_snapshot.py runs it in a subprocess)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402
from gdn_stub import (  # noqa: E402
    BUCKET,
    CHUNK,
    WINDOW,
    capture_view,
    live_batch,
    live_batch_without_first_chunk_track,
    make_gdn,
    replay_view,
)

from sglang.kernels.ops.mamba import kda_prefill_track  # noqa: E402
from sglang_graphfix.srt import full_prefill_graph_capability as capability  # noqa: E402
from sglang_graphfix.srt.layers.attention.linear import (
    gdn_backend,  # noqa: E402
    gdn_prefill_graph,  # noqa: E402
    kda_prefill_graph,  # noqa: E402
)
from sglang_graphfix_kernel import masked_state_rows  # noqa: E402

# The runtime probes test/unit/srt/layers/attention/conftest.py sets.
torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
capability.get_memory = lambda: SimpleNamespace(enable_page_major_kv_layout=False)
kda_prefill_graph.mamba_cache_chunk_size = lambda: CHUNK
import sglang.srt.model_executor.forward_batch_info as forward_batch_info  # noqa: E402

forward_batch_info.mamba_cache_chunk_size = lambda: CHUNK

SLOTS, HEADS, DIM = 16, 2, 8


def replayed_tables(flashinfer: bool):
    """The live batch's tables on a captured bucket; with FlashInfer, row 0 (its
    track point inside its first chunk, which FlashInfer's eager plan refuses)
    untracked."""
    backend = make_gdn()
    gdn_backend.prepare_full_prefill_graph_tables(
        backend, capture_view(), in_capture=True
    )
    live = live_batch_without_first_chunk_track() if flashinfer else live_batch()
    return gdn_backend.prepare_full_prefill_graph_tables(
        backend, replay_view(live), in_capture=False
    )


class Counted:
    """A Triton kernel whose launches are counted."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def snapshot(pool, states, meta, flashinfer, kernel_on, shift_rows=False):
    """_snapshot_ssm_states on a copy of ``pool``; with ``shift_rows`` each row's
    chunk state is read one row on (the control: a wrong source row)."""
    pool = pool.clone()
    ours = Counted(masked_state_rows._snapshot_state_rows)
    theirs = Counted(kda_prefill_track._kda_track_ssm_kernel)
    masked_state_rows._snapshot_state_rows = ours
    kda_prefill_track._kda_track_ssm_kernel = theirs
    real_rows = gdn_prefill_graph.snapshot_chunk_states
    if shift_rows:

        def shifted(pool, states, rows, *args):
            return real_rows(pool, states, (rows + 1) % states.shape[0], *args)

        gdn_prefill_graph.snapshot_chunk_states = shifted
    capability.GDN_TRACK_SNAPSHOT_KERNEL = kernel_on
    try:
        tables = gdn_prefill_graph.build_forward_tables(
            meta, flashinfer=flashinfer, conv_window=WINDOW, device=pool.device
        )
        gdn_prefill_graph._snapshot_ssm_states(
            pool, states, meta, tables, flashinfer=flashinfer
        )
    finally:
        capability.GDN_TRACK_SNAPSHOT_KERNEL = False
        masked_state_rows._snapshot_state_rows = ours.kernel
        kda_prefill_track._kda_track_ssm_kernel = theirs.kernel
        gdn_prefill_graph.snapshot_chunk_states = real_rows
    return pool, ours.launches, theirs.launches


def run_case(seed: int, flashinfer: bool) -> dict:
    torch.manual_seed(seed)
    meta = replayed_tables(flashinfer)
    pool = torch.randn(SLOTS, HEADS, DIM, DIM)
    if flashinfer:  # fp32 snapshots after every 64 tokens of the bucket
        states = torch.randn(1, BUCKET // CHUNK, HEADS, DIM, DIM)
    else:  # Triton's bf16 state before each chunk of the bucket's chunk rows
        states = torch.randn(1, meta.max_chunks, HEADS, DIM, DIM).to(torch.bfloat16)
    ref, ours_ref, theirs_ref = snapshot(pool, states, meta, flashinfer, False)
    got, ours_got, theirs_got = snapshot(pool, states, meta, flashinfer, True)
    wrong, *_ = snapshot(pool, states, meta, flashinfer, True, shift_rows=True)
    return {
        "seed": seed,
        "flashinfer": flashinfer,
        "modes": meta.track_mode.tolist(),
        "slots_written": [s for s in range(SLOTS) if not torch.equal(ref[s], pool[s])],
        "equal": torch.equal(got, ref),
        "control_differs": not torch.equal(wrong, ref),
        "launches_off": {"snapshot_state_rows": ours_ref, "kda_track": theirs_ref},
        "launches_on": {"snapshot_state_rows": ours_got, "kda_track": theirs_got},
    }


if __name__ == "__main__":
    assert masked_state_rows._interpreting()  # the kernels, not the torch ops
    seeds = [int(a) for a in sys.argv[1:]] or range(int(os.environ.get("CASES", 3)))
    for seed in seeds:
        for flashinfer in (False, True):
            print(json.dumps(run_case(seed, flashinfer)), flush=True)
