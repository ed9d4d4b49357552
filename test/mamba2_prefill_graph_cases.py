"""Random batches for the Mamba2 full prefill graph tables
(sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph), padded as the
full prefill runner pads a replay (zero-length request slots on pool row 0,
tokens past the batch), with cached prefixes and prompts around the chunk size,
and the comparison with sglang's own eager builders. Shared by the CPU test and
the Triton-interpreter script
(test/unit/srt/layers/attention/mamba/test_mamba2_prefill_graph.py,
interpret_mamba2_prefill_graph.py)."""

import dataclasses
import random
import types
from types import SimpleNamespace
from unittest import mock

import torch
import triton

from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID
from sglang.srt.layers.attention import hybrid_linear_attn_backend as upstream
from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
)
from sglang.srt.layers.attention.mamba.mamba2_metadata import Mamba2Metadata
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention.mamba import mamba2_prefill_graph as ours
from sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph import (
    PADDING_SLOT,
    TRACK_FINAL_STATE,
    TRACK_GRID_STATE,
    TRACK_NONE,
    TRACK_RECOMPUTE_STATE,
    Mamba2PrefillGraphTables,
    Mamba2PrefillTrackTables,
    track_rows,
)

CONV_LEN = 3  # conv kernel width - 1
SLOT_OF_ROW = [PADDING_SLOT, *range(17, 17 + 64)]  # request-pool row -> mamba slot


class Pool:
    """req_to_token_pool stand-in: row -> slot, identity virtual -> physical."""

    def __init__(self):
        self._slot_of_row = {}  # per device, made once (a replay copies nothing)

    def get_mamba_indices(self, rows):
        table = self._slot_of_row.get(rows.device)
        if table is None:
            table = torch.tensor(SLOT_OF_ROW, dtype=torch.int32).to(rows.device)
            self._slot_of_row[rows.device] = table
        return table[rows]

    def translate_mamba_indices(self, indices):
        return indices


def mamba2_backend(chunk_size, device="cpu"):
    # Mamba2AttnBackend.__init__ needs a model runner with a mamba pool.
    backend = Mamba2AttnBackend.__new__(Mamba2AttnBackend)
    backend.req_to_token_pool = Pool()
    backend.device = torch.device(device)
    backend.topk = 0
    backend._mamba_chunk_size = chunk_size
    backend.conv_states_shape = (2, len(SLOT_OF_ROW), 32, CONV_LEN)
    return backend


def eager_metadata(case):
    """Mamba2AttnBackend.init_forward_metadata's Mamba2Metadata for the batch."""
    backend = mamba2_backend(case.chunk)
    with mock.patch(
        "sglang.srt.model_executor.forward_batch_info.mamba_cache_chunk_size",
        lambda: case.cache_chunk,
    ):
        Mamba2AttnBackend.init_forward_metadata(backend, live_batch(case))
    return backend.forward_metadata


def random_case(rng, chunks=(4, 8, 16, 64)):
    chunk = rng.choice(chunks)
    bucket = rng.choice([1, 2, 3, 5, 8]) * chunk + rng.choice([0, 0, 1, chunk // 2, -1])
    bucket = max(bucket, 2)
    # Every request holds a token, so the runner has at most one slot per token
    # (one fewer here, for the tail in sglang's conv-table fill).
    slots = rng.randint(1, min(9, bucket - 1))
    bs = rng.randint(1, min(slots, bucket))
    cache_chunk = chunk * rng.choice([1, 2])
    tracked_len = cache_chunk + chunk // 2 + 1  # snapshots off the chunk grid
    lens = []
    for _ in range(bs):
        left = bucket - sum(lens) - (bs - len(lens) - 1)  # keep >= 1 for the rest
        near = rng.choice([chunk - 1, chunk, chunk + 1, 2 * chunk, 1, tracked_len])
        lens.append(max(1, min(left, rng.choice([near, rng.randint(1, left)]))))
    if rng.random() < 0.25:  # a batch that fills the bucket: no tail
        lens[-1] += bucket - sum(lens)
    prefix = [rng.choice([0, 0, rng.randint(1, 3 * chunk)]) for _ in lens]
    rows = rng.sample(range(1, len(SLOT_OF_ROW)), bs)
    # Prefix-cache snapshots: on some batches, some rows snapshot at a length
    # inside this extend -- the end, a chunk boundary or anywhere; as sglang
    # (ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend), only rows
    # that extend at least one cache chunk.
    tracked = (
        [rng.random() < 0.6 and n >= cache_chunk for n in lens]
        if rng.random() < 0.7
        else None
    )
    track_lens = [
        p + max(1, min(n, rng.choice([n, n // chunk * chunk, rng.randint(1, n)])))
        for n, p in zip(lens, prefix)
    ]
    return SimpleNamespace(
        chunk=chunk, bucket=bucket, slots=slots, lens=lens, prefix=prefix, rows=rows,
        tracked=tracked, track_lens=track_lens,
        track_dst=[100 + r for r in range(bs)],
        cache_chunk=cache_chunk,
    )  # fmt: skip


def _on(batch, device):
    """``batch`` with its tensors moved to ``device``."""
    for name, value in vars(batch).items():
        if isinstance(value, torch.Tensor):
            setattr(batch, name, value.to(device))
    return batch


def live_batch(case, device="cpu"):
    """The scheduler's ForwardBatch for the real requests (fields read by
    Mamba2AttnBackend.init_forward_metadata)."""
    lens = torch.tensor(case.lens)
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        logical_forward_mode=ForwardMode.EXTEND,
        batch_size=len(case.lens),
        req_pool_indices=torch.tensor(case.rows),
        seq_lens=lens + torch.tensor(case.prefix),
        extend_num_tokens=sum(case.lens),
        extend_seq_lens=lens,
        extend_seq_lens_cpu=list(case.lens),
        extend_start_loc=torch.cumsum(lens, 0) - lens,
        extend_prefix_lens=torch.tensor(case.prefix),
        extend_prefix_lens_cpu=list(case.prefix),
        tbo_parent_token_range=None,
        spec_info=None,
        mamba_track_mask=None,
        mamba_track_indices=None,
        mamba_track_seqlens=None,
        mamba_prefill_track_mask_cpu=None,
        mamba_track_seqlens_cpu=None,
    )
    if case.tracked is not None:
        batch.mamba_track_mask = torch.tensor(case.tracked)
        batch.mamba_track_indices = torch.tensor(case.track_dst)
        batch.mamba_track_seqlens = torch.tensor(case.track_lens)
        batch.mamba_prefill_track_mask_cpu = list(case.tracked)
        batch.mamba_track_seqlens_cpu = list(case.track_lens)
    batch.mamba_track_aligned_lens = types.MethodType(
        ForwardBatch.mamba_track_aligned_lens, batch
    )
    return _on(batch, device)


def padded_inputs(case, lens, prefix, rows, device):
    """The runner's padded [R] inputs for ``lens`` over ``rows``: zero-length
    request slots on pool row 0 past them."""
    pad = [0] * (case.slots - len(lens))
    return dict(
        extend_seq_lens=torch.tensor([*lens, *pad], device=device),
        extend_prefix_lens=torch.tensor([*prefix, *pad], device=device),
        slots=Pool().get_mamba_indices(torch.tensor([*rows, *pad], device=device)),
    )


def filled_tables(case, device="cpu"):
    tables = Mamba2PrefillGraphTables.allocate(
        num_tokens=case.bucket,
        max_requests=case.slots,
        chunk_size=case.chunk,
        cache_index_dtype=torch.int32,
        device=device,
        conv_blocks=True,  # MAMBA2_CONV_BLOCK_TABLE's table, checked too
    )
    # First the capture batch (one request over the bucket), then the
    # runner's padded replay view: zero-length slots on pool row 0.
    for lens, prefix, rows in (
        ([case.bucket], [0], [1]),
        (case.lens, case.prefix, case.rows),
    ):
        tables.fill(**padded_inputs(case, lens, prefix, rows, device))
    return tables


def mismatches(case, tables):
    """Every difference between ``tables`` and sglang's eager metadata for
    ``case``; empty when they agree."""
    out = []

    def check(name, ours, eager):
        ours, eager = torch.as_tensor(ours).tolist(), torch.as_tensor(eager).tolist()
        if ours != eager:
            out.append(f"{name}: ours {ours} != sglang {eager}")

    bs, total, C = len(case.lens), sum(case.lens), case.chunk
    R, T = case.slots, case.bucket

    # 1. The real batch, through sglang's eager backend path.
    meta = eager_metadata(case)
    mixed = meta.mixed_metadata
    assert meta.num_prefills == bs and meta.num_prefill_tokens == total
    check("num_logical_tokens", tables.num_logical_tokens, [total])
    check("query_start_loc", tables.query_start_loc[: bs + 1], meta.query_start_loc)
    check("seq_idx", tables.seq_idx[:, :total], mixed.seq_idx)
    check(
        "has_initial_states",
        tables.has_initial_states[:bs],
        mixed.has_initial_states[:bs],
    )
    check("cache_indices", tables.cache_indices[:bs], meta.mamba_cache_indices)
    if mixed.prep_initial_states:  # eager builds the chunk tables only then
        n = mixed.chunk_indices.shape[0]
        check("chunk_indices (real)", tables.chunk_indices[:n], mixed.chunk_indices)
        check("chunk_offsets (real)", tables.chunk_offsets[:n], mixed.chunk_offsets)

    # 2. The padded sequences (request slots, then the tail) through sglang's
    # chunk helper; past them, inert rows.
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(case.lens), 0).tolist()])
    cu = torch.cat([cu, cu[-1:].repeat(R - bs), torch.tensor([T])]).to(torch.int32)
    check("query_start_loc (padded)", tables.query_start_loc, cu)
    check(
        "seq_idx (padded)",
        tables.seq_idx[0],
        torch.arange(R + 1).repeat_interleave(cu.diff()),
    )
    check(
        "has_initial_states (tail)",
        tables.has_initial_states[bs:],
        [False] * (R + 1 - bs),
    )
    check(
        "cache_indices (padding)",
        tables.cache_indices[bs:],
        [PADDING_SLOT] * (R + 1 - bs),
    )
    # sglang's helper indexes past its table for a zero-length sequence that
    # starts on the grid at the very end (total == T, T % C == 0, padded slots).
    if not (T % C == 0 and cu[-2] == T):
        idx, off = Mamba2Metadata._query_start_loc_to_chunk_indices_offsets(cu, C, T)
        n = idx.shape[0]
        if n > tables.chunk_indices.shape[0]:
            out.append(
                f"{n} logical chunks exceed the bound {tables.chunk_indices.shape[0]}"
            )
        check("chunk_indices (padded)", tables.chunk_indices[:n], idx)
        check("chunk_offsets (padded)", tables.chunk_offsets[:n], off)
        rest = tables.chunk_indices.shape[0] - n
        check(
            "chunk_indices (inert)",
            tables.chunk_indices[n:],
            [triton.cdiv(T, C) - 1] * rest,
        )
        check("chunk_offsets (inert)", tables.chunk_offsets[n:], [C] * rest)

    # 3. Conv blocks (MAMBA2_CONV_BLOCK_TABLE), as sglang's own static-table
    # fill lays them out for the same R + 1 sequences.
    if tables.conv_block_table is None:
        return out
    kda = KDAPrefillGraphMetadata.allocate(
        num_tokens=T,
        max_seqs_cap=R + 1,
        track=False,
        cache_index_dtype=torch.int32,
        device="cpu",
    )
    kda.fill(
        extend_seq_lens=cu.diff().tolist(),
        cache_indices=tables.cache_indices,
        extend_prefix_lens=torch.zeros(R + 1, dtype=torch.int64),
        track_rows=None,
    )
    rows = tables.conv_block_table.shape[0]
    check("conv_block_table", tables.conv_block_table, kda.conv_block_table[:rows])
    check(
        "conv_block_table (past the bound)",
        kda.conv_block_table[rows:],
        [[PAD_SLOT_ID, 0]] * (kda.conv_block_table.shape[0] - rows),
    )
    return out


def make_case(seed, chunks=(4, 8, 16, 64)):
    return random_case(random.Random(seed), chunks)


def filled_track(case, tables):
    """The snapshot plan for ``case`` (after ``filled_tables``), None when the
    batch tracks nothing or the bucket has no track rows. The track inputs hold
    the batch's rows only."""
    K = track_rows(case.bucket, case.slots, case.cache_chunk)
    if case.tracked is None or K == 0:
        return None
    track = Mamba2PrefillTrackTables.allocate(
        max_requests=case.slots,
        num_rows=K,
        conv_len=CONV_LEN,
        device=tables.seq_idx.device,
    )
    device = tables.seq_idx.device
    track.fill(
        tables,
        track_mask=torch.tensor(case.tracked, device=device),
        track_seq_lens=torch.tensor(case.track_lens, device=device),
        track_slots=torch.tensor(case.track_dst, device=device),
        extend_prefix_lens=torch.tensor(case.prefix, device=device),
        cache_chunk_size=case.cache_chunk,
    )
    return track


def track_mismatches(case, track):
    """Every difference between the snapshot plan and sglang's eager track
    selection (_init_track_ssm_indices_from_cpu, _init_track_conv_indices,
    prepare_mixed's conv destinations): the tracked request slots packed first,
    in batch order, then fillers on the padding slot."""
    out = []

    def check(name, ours, eager):
        ours, eager = torch.as_tensor(ours).tolist(), torch.as_tensor(eager).tolist()
        if ours != eager:
            out.append(f"{name}: ours {ours} != sglang {eager}")

    meta = eager_metadata(case)
    mode, src, dst = track.mode.tolist(), track.src.tolist(), track.dst
    live = [k for k, m in enumerate(mode) if m != TRACK_NONE]
    fillers = [k for k, m in enumerate(mode) if m == TRACK_NONE]
    check("filler dst", dst[fillers], [PADDING_SLOT] * len(fillers))
    if not meta.has_mamba_track_mask:
        check("rows (nothing tracked)", live, [])
        return out
    check("rows packed first", live, list(range(len(live))))
    check(
        "tracked request slots",
        [src[k] for k in live],
        [r for r, t in enumerate(case.tracked) if t],
    )
    if out:  # the per-mode checks below index by those slots
        return out
    slots = meta.mamba_cache_indices

    def where(m):
        return [k for k, v in enumerate(mode) if v == m]

    final, grid, recompute = (
        where(TRACK_FINAL_STATE),
        where(TRACK_GRID_STATE),
        where(TRACK_RECOMPUTE_STATE),
    )
    check("final src", slots[[src[k] for k in final]], meta.track_ssm_final_src)
    check("final dst", dst[final], meta.track_ssm_final_dst)
    check("grid h_src", track.h_src[grid], meta.track_ssm_h_src)
    check("grid dst", dst[grid], meta.track_ssm_h_dst)
    check("recompute rows", [src[k] for k in recompute], meta.track_ssm_seq_idx)
    check("recompute end", track.end_loc[recompute], meta.track_ssm_end_locs)
    check("recompute dst", dst[recompute], meta.track_ssm_recompute_dst)
    check("conv window", track.conv_window[live], meta.track_conv_indices)
    check("conv dst", dst[live], meta.conv_states_mask_indices)
    return out


def recompute_segment_errors(tables, track):
    """What breaks ssd_combined._track_states_at's input on the plan: it
    recomputes the consecutive segments [start, end_loc] of the track rows and
    the gaps between them, and _chunk_state_varlen_kernel loads the token before
    each segment's end, so the bounds must not decrease, none after the first
    may be 0 and none may pass the batch's tokens."""
    starts = tables.query_start_loc[track.src].to(torch.int64)
    bounds = torch.stack([starts, track.end_loc], 1).flatten()
    out = []
    if (bounds.diff() < 0).any():
        out.append(f"recompute bounds decrease: {bounds.tolist()}")
    if (bounds[1:] < 1).any():
        out.append(f"a recompute segment ends at token 0: {bounds.tolist()}")
    if (bounds > tables.num_logical_tokens.to(torch.int64)).any():
        out.append(f"a recompute bound passes the batch: {bounds.tolist()}")
    return out


# ---- the full prefill runner's batches, and the runtime a replay sees ----


def capture_batch(case, track, device="cpu"):
    """PrefillCudaGraphRunner.capture_prepare's batch for the bucket (the fields
    the linear side reads): one request over the bucket, zero-length slots."""
    R, T = case.slots, case.bucket
    lens = torch.tensor([T] + [0] * (R - 1))
    zeros = torch.zeros(R, dtype=torch.int64)
    return _on(SimpleNamespace(
        forward_mode=ForwardMode.EXTEND, logical_forward_mode=ForwardMode.EXTEND,
        batch_size=R, input_ids=torch.zeros(T, dtype=torch.int64),
        req_pool_indices=torch.arange(R), extend_seq_lens=lens,
        extend_prefix_lens=zeros, extend_seq_lens_cpu=lens.tolist(),
        spec_info=None,
        mamba_track_mask=torch.zeros(R, dtype=torch.bool) if track else None,
        mamba_track_indices=zeros if track else None,
        mamba_track_seqlens=zeros if track else None,
    ), device)  # fmt: skip


def replay_view(case, live, device="cpu"):
    """_prepare_forward_metadata_for_replay's padded view of the live batch."""
    pad = [0] * (case.slots - len(case.lens))
    view = SimpleNamespace(**vars(live))
    view.batch_size = case.slots
    view.input_ids = torch.zeros(case.bucket, dtype=torch.int64)
    view.req_pool_indices = torch.tensor([*case.rows, *pad])
    view.extend_seq_lens = torch.tensor([*case.lens, *pad])
    view.extend_prefix_lens = torch.tensor([*case.prefix, *pad])
    return _on(view, device)


def graph_runtime(case):
    """mock patches: MAMBA2_FULL_PREFILL_GRAPH and MAMBA2_REQUEST_BUCKETS_CAPTURED
    on, and what a scheduler's
    published runtime context answers (no GPU, no server) where the Mamba2
    path and the capability model read it."""
    return [
        mock.patch.object(capability, "MAMBA2_FULL_PREFILL_GRAPH", True),
        mock.patch.object(capability, "MAMBA2_REQUEST_BUCKETS_CAPTURED", True),
        mock.patch.object(
            upstream, "get_memory",
            lambda: SimpleNamespace(enable_page_major_kv_layout=False),
        ),
        mock.patch.object(
            capability, "get_memory",
            lambda: SimpleNamespace(enable_page_major_kv_layout=False),
        ),
        mock.patch.object(capability, "get_schedule", lambda: SimpleNamespace(enable_mixed_chunk=False)),
        mock.patch.object(capability, "get_spec", lambda: SimpleNamespace(speculative_algorithm=None)),
        mock.patch.object(
            capability, "get_exec",
            lambda: SimpleNamespace(overlap=SimpleNamespace(enable_two_batch_overlap=False)),
        ),
        mock.patch.object(capability, "device_sm", lambda: 90),
        mock.patch.object(ours, "mamba_cache_chunk_size", lambda: case.cache_chunk),
        mock.patch(
            "sglang.srt.model_executor.forward_batch_info.mamba_cache_chunk_size",
            lambda: case.cache_chunk,
        ),
    ]  # fmt: skip


# ---- the table-fill kernel (sglang_graphfix_kernel.mamba2_prefill_tables) ----


def _fill_both_ways(case, inputs, track_inputs, *, conv_blocks, track_rows, device):
    """The torch fill and the kernel's, each on freshly allocated tables."""
    filled = []
    for kernel in (False, True):
        tables = ours.Mamba2PrefillGraphTables.allocate(
            num_tokens=case.bucket, max_requests=case.slots, chunk_size=case.chunk,
            cache_index_dtype=torch.int32, device=device, conv_blocks=conv_blocks,
        )  # fmt: skip
        track = (
            ours.Mamba2PrefillTrackTables.allocate(
                max_requests=case.slots,
                num_rows=track_rows,
                conv_len=CONV_LEN,
                device=device,
            )  # fmt: skip
            if track_rows
            else None
        )
        for t in (tables, track):  # garbage in, so that a missed write shows
            for field in dataclasses.fields(t) if t is not None else ():
                value = getattr(t, field.name)
                if isinstance(value, torch.Tensor):
                    value.copy_(torch.randint(-7, 7, value.shape).to(value))
        ours.fill_mamba2_tables(
            tables, track, **inputs, **track_inputs,
            cache_chunk_size=case.cache_chunk, on_device=kernel,
        )  # fmt: skip
        filled.append((tables, track))
    return filled


def _fill_mismatches(filled):
    (tables, track), (k_tables, k_track) = filled
    out = []
    for ref, got in ((tables, k_tables), (track, k_track)):
        if ref is None:
            continue
        for field in dataclasses.fields(ref):
            a, b = getattr(ref, field.name), getattr(got, field.name)
            if isinstance(a, torch.Tensor) and not torch.equal(a, b):
                out.append(f"{type(ref).__name__}.{field.name}")
    return out


def production_case(slots, bucket, chunk, cache_chunk, seed):
    """A batch of the shapes a served full graph has (16 request slots at
    sglang's default chunking, 32 at 16384, buckets up to 8192 tokens, chunks
    of 128 or 256): up to ``slots`` requests, zero-length ones among them, the
    last tracked ones at a length off the chunk grid."""
    rng = random.Random(seed)
    bs = rng.randint(max(1, slots - 3), slots)
    lens = [rng.choice([0, 1, chunk - 1, chunk, 2 * chunk + 3, cache_chunk + 5])
            for _ in range(bs)]  # fmt: skip
    lens[0] = max(lens[0], 1)
    while sum(lens) > bucket:
        lens[lens.index(max(lens))] //= 2
    if seed % 2:  # a batch that fills the bucket: no tail
        lens[-1] += bucket - sum(lens)
    prefix = [rng.choice([0, 0, chunk, 3 * chunk + 1]) for _ in lens]
    tracked = [n >= cache_chunk and rng.random() < 0.7 for n in lens]
    track_lens = [p + max(1, n - rng.randint(0, chunk)) for n, p in zip(lens, prefix)]
    return SimpleNamespace(
        chunk=chunk, bucket=bucket, slots=slots, lens=lens, prefix=prefix,
        rows=rng.sample(range(1, len(SLOT_OF_ROW)), bs), tracked=tracked,
        track_lens=track_lens, track_dst=[100 + r for r in range(bs)],
        cache_chunk=cache_chunk,
    )  # fmt: skip


# (slots, bucket, chunk, cache chunk): the lane widths (16, 32, 64) and the
# largest tables a served full graph refills.
PRODUCTION_SHAPES = ((1, 8192, 256, 256), (16, 8192, 128, 256), (17, 4096, 256, 512),
                     (48, 8192, 256, 512))  # fmt: skip


def table_fill_cases(seeds, device):
    """Per seed, the replay batch and the bucket's capture batch filled both ways
    (the torch fill, the kernel's) on ``device``: one dict per batch with the
    tables that differ ("mismatches"). A third of the buckets have the conv
    block table; a snapshot plan where the case tracks, or, on odd seeds, with
    filler rows only."""
    none = dict(track_mask=None, track_seq_lens=None, track_slots=None)
    production = [
        production_case(*shape, seed=n) for n, shape in enumerate(PRODUCTION_SHAPES)
    ]
    for seed, case in [(s, make_case(s)) for s in seeds] + [
        (-1 - n, case) for n, case in enumerate(production)
    ]:
        conv_blocks = seed % 3 != 0
        K = track_rows(case.bucket, case.slots, case.cache_chunk)
        track_inputs = none
        if case.tracked is not None:
            track_inputs = dict(
                track_mask=torch.tensor(case.tracked, device=device),
                track_seq_lens=torch.tensor(case.track_lens, device=device),
                track_slots=torch.tensor(case.track_dst, device=device),
            )
        rows = K if case.tracked is not None or seed % 2 else 0
        for label, lens, prefix, req_rows, tracks in (
            ("replay", case.lens, case.prefix, case.rows, track_inputs),
            ("capture", [case.bucket], [0], [1], none),
        ):
            inputs = padded_inputs(case, lens, prefix, req_rows, device)
            filled = _fill_both_ways(
                case, inputs, tracks, conv_blocks=conv_blocks, track_rows=rows,
                device=device,
            )  # fmt: skip
            yield {
                "seed": seed,
                "batch": label,
                "bucket": case.bucket,
                "slots": case.slots,
                "requests": len(lens),
                "tracked": bool(tracks["track_mask"] is not None and any(case.tracked)),
                "track_rows": rows,
                "conv_blocks": conv_blocks,
                "mismatches": _fill_mismatches(filled),
            }
