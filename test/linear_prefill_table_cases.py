"""Random batches for the device-side linear prefill-graph table fill
(sglang_graphfix_kernel.linear_prefill_tables), checked against sglang's own host
fill: KDAPrefillGraphMetadata.fill with build_track_rows, as the full prefill
graph ran before. Shared by the in-process CPU test (torch steps), the Triton
interpreter script (test/unit/sgl_kernel/interpret_linear_prefill_tables.py) and
the GPU test (test/gpu/test_linear_prefill_tables_kernel.py).

Each case is padded as PrefillCudaGraphRunner pads a replay: the request slots
past the batch hold zero lengths and pool row 0's slot; both table sets start
from garbage (a previous, different batch), so a row either fill leaves stale
shows up."""

import random

import torch

from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
    build_track_rows,
)
from sglang_graphfix_kernel.linear_prefill_tables import (
    TrackInputs,
    fill_linear_prefill_tables,
)

CONV_LEN = 3
FIELDS = (
    "cu_seqlens",
    "chunk_indices",
    "chunk_offsets",
    "conv_block_table",
    "track_chunk_idx",
    "track_mode",
    "track_conv_start",
    "num_logical_tokens",
    "cache_indices",
    "has_initial_state",
)


def make_case(seed):
    rng = random.Random(seed)
    bucket = rng.choice([8, 16, 64, 100, 256, 512, 1024, 2048])
    slots = rng.choice([1, 2, 3, 4, 8, 16, 32])
    max_seqs = max(1, min(bucket, slots))
    bs = rng.randint(1, max_seqs)
    total = rng.randint(bs, bucket)
    # Lengths >= 1 summing to total; bias toward chunk edges (1, 63, 64, 65).
    cuts = sorted(rng.sample(range(1, total), bs - 1)) if bs > 1 else []
    lens = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
    if rng.random() < 0.3 and total >= 64 * bs:
        lens = [64] * (bs - 1) + [total - 64 * (bs - 1)]
    prefix = [
        rng.choice([0, 0, rng.randint(1, 300), 64 * rng.randint(1, 4)]) for _ in lens
    ]
    state_chunk = 64
    cache_chunk = rng.choice([64, 128, 256])
    track = rng.random() < 0.7
    mask = [rng.random() < 0.6 for _ in lens] if track else None
    track_lens = None
    if track:
        # The snapshot point lies in this extend: prefix + [0, len], often aligned.
        track_lens = []
        for n, p in zip(lens, prefix):
            k = rng.choice([rng.randint(0, n), (n // cache_chunk) * cache_chunk, n])
            track_lens.append(p + k)
    return dict(
        seed=seed,
        bucket=bucket,
        slots=slots,
        lens=lens,
        prefix=prefix,
        mask=mask,
        track_lens=track_lens,
        state_chunk=state_chunk,
        cache_chunk=cache_chunk,
        mamba_slots=rng.sample(range(1, 500), bs),
        track_dst=rng.sample(range(500, 1000), bs),
    )


def capture_case(bucket, slots):
    """PrefillCudaGraphRunner.capture_prepare's batch: one request of the whole
    bucket, then zero-length sentinels (bs counts the real one)."""
    return dict(
        seed=-1,
        bucket=bucket,
        slots=slots,
        lens=[bucket],
        prefix=[0],
        mask=[False],
        track_lens=[0],
        state_chunk=64,
        cache_chunk=64,
        mamba_slots=[3],
        track_dst=[0],
    )


def padded(values, slots, fill, dtype, device):
    return torch.tensor(
        values + [fill] * (slots - len(values)), dtype=dtype, device=device
    )


def allocate(case, device, track):
    meta = KDAPrefillGraphMetadata.allocate(
        num_tokens=case["bucket"],
        max_seqs_cap=case["slots"],
        track=track,
        cache_index_dtype=torch.int32,
        device=device,
    )
    # A previous batch's leftovers: every row either fill misses stays visible.
    g = torch.Generator().manual_seed(1234)
    meta.packed.copy_(torch.randint(-50, 5000, meta.packed.shape, generator=g))
    meta.cache_indices.copy_(
        torch.randint(0, 99, meta.cache_indices.shape, generator=g)
    )
    meta.has_initial_state.fill_(True)
    return meta


def host_tables(case, device="cpu"):
    """sglang's host fill (what full_prefill_graph_tables did before)."""
    meta = allocate(case, device, case["mask"] is not None)
    host_fill(meta, case, device)
    return meta


def host_fill(meta, case, device):
    """The replay path before: build_track_rows from the CPU lists, then
    KDAPrefillGraphMetadata.fill."""
    bs = len(case["lens"])
    slots = padded(case["mamba_slots"], case["slots"], 7, torch.int32, device)
    prefix = padded(case["prefix"], case["slots"], 0, torch.int64, device)
    track_rows = None
    if case["mask"] is not None:
        track_rows = build_track_rows(
            track_mask=case["mask"],
            track_seq_lens=case["track_lens"],
            extend_seq_lens=case["lens"],
            extend_prefix_lens=case["prefix"],
            state_chunk_size=case["state_chunk"],
            cache_chunk_size=case["cache_chunk"],
            conv_len=CONV_LEN,
            dst=padded(case["track_dst"], case["slots"], 0, torch.int64, device),
        )
    meta.fill(
        extend_seq_lens=case["lens"],
        cache_indices=slots[:bs],
        extend_prefix_lens=prefix,
        track_rows=track_rows,
    )


def device_tables(case, device="cpu", constants=None):
    """fill_linear_prefill_tables on the runner's padded device tensors."""
    from sglang_graphfix.srt.layers.attention.linear.kda_prefill_graph import (
        table_views,
    )

    track = case["mask"] is not None
    meta = allocate(case, device, track)
    r = case["slots"]
    inputs = (
        TrackInputs(
            mask=padded(case["mask"], r, False, torch.bool, device),
            seq_lens=padded(case["track_lens"], r, 0, torch.int64, device),
            slots=padded(case["track_dst"], r, 0, torch.int64, device),
        )
        if track
        else None
    )
    fill_linear_prefill_tables(
        table_views(meta),
        bs=len(case["lens"]),
        max_seqs=meta.max_seqs,
        extend_seq_lens=padded(case["lens"], r, 0, torch.int64, device),
        extend_prefix_lens=padded(case["prefix"], r, 0, torch.int64, device),
        slots=padded(case["mamba_slots"], r, 7, torch.int32, device),
        track=inputs,
        constants=constants or table_constants(case),
    )
    return meta


def table_constants(case):
    """Our table_constants for this case's chunk sizes (mamba_cache_chunk_size
    reads the running server's config)."""
    from types import SimpleNamespace
    from unittest import mock

    from sglang_graphfix.srt.layers.attention.linear import kda_prefill_graph as ours

    backend = SimpleNamespace(
        mamba_chunk_size=case["state_chunk"], conv_states_shape=(1, 1, CONV_LEN)
    )
    with mock.patch.object(ours, "mamba_cache_chunk_size", lambda: case["cache_chunk"]):
        return ours.table_constants(backend)


def mismatches(case, device="cpu"):
    """Fields whose device fill differs from sglang's host fill (track_dst on
    tracked rows only: the host fill leaves the others as they were)."""
    host, dev = host_tables(case), device_tables(case, device)
    bad = [
        f for f in FIELDS if not torch.equal(getattr(host, f), getattr(dev, f).cpu())
    ]
    if case["mask"] is not None:
        rows = [i for i, m in enumerate(case["mask"]) if m]
        if not torch.equal(host.track_dst[rows], dev.track_dst.cpu()[rows]):
            bad.append("track_dst")
    return bad
