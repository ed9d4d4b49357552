"""Mamba2 full prefill graph tables on CPU, against sglang's own eager builders.

Many random batches, padded as the full prefill runner pads a replay (zero-length
request slots on pool row 0, tokens past the batch), with cached prefixes and
prompts around the chunk size: the static tables must describe the real batch
exactly as Mamba2AttnBackend.init_forward_metadata -> Mamba2Metadata.prepare_mixed
does (query_start_loc, seq_idx, has_initial_states, slots, chunk_indices /
chunk_offsets), the padded sequences as sglang's chunk helper does, the conv
blocks as sglang's KDAPrefillGraphMetadata.fill does; and the fill must run on
tensors without data (no host read, shapes from the bucket only)."""

import random
from types import SimpleNamespace

import pytest
import torch
import triton

from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID
from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
)
from sglang.srt.layers.attention.mamba.mamba2_metadata import Mamba2Metadata
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_graphfix.srt.layers.attention.mamba.mamba2_prefill_graph import (
    PADDING_SLOT,
    Mamba2PrefillGraphTables,
    max_conv_blocks,
    max_logical_chunks,
)

CASES = 400
SLOT_OF_ROW = [PADDING_SLOT, *range(17, 17 + 64)]  # request-pool row -> mamba slot


class _Pool:
    """req_to_token_pool stand-in: row -> slot, identity virtual -> physical."""

    def get_mamba_indices(self, rows):
        return torch.tensor(SLOT_OF_ROW, dtype=torch.int32)[rows]

    def translate_mamba_indices(self, indices):
        return indices


def _mamba2_backend(chunk_size):
    # Mamba2AttnBackend.__init__ needs a model runner with a mamba pool.
    backend = Mamba2AttnBackend.__new__(Mamba2AttnBackend)
    backend.req_to_token_pool = _Pool()
    backend.device = torch.device("cpu")
    backend.topk = 0
    backend._mamba_chunk_size = chunk_size
    return backend


def _random_case(rng):
    chunk = rng.choice([4, 8, 16, 64])
    bucket = rng.choice([1, 2, 3, 5, 8]) * chunk + rng.choice([0, 0, 1, chunk // 2, -1])
    bucket = max(bucket, 2)
    # Every request holds a token, so the runner has at most one slot per token
    # (one fewer here, for the tail in sglang's conv-table fill).
    slots = rng.randint(1, min(9, bucket - 1))
    bs = rng.randint(1, min(slots, bucket))
    lens = []
    for _ in range(bs):
        left = bucket - sum(lens) - (bs - len(lens) - 1)  # keep >= 1 for the rest
        near = rng.choice([chunk - 1, chunk, chunk + 1, 2 * chunk, 1])
        lens.append(max(1, min(left, rng.choice([near, rng.randint(1, left)]))))
    if rng.random() < 0.25:  # a batch that fills the bucket: no tail
        lens[-1] += bucket - sum(lens)
    prefix = [rng.choice([0, 0, rng.randint(1, 3 * chunk)]) for _ in lens]
    rows = rng.sample(range(1, len(SLOT_OF_ROW)), bs)
    return SimpleNamespace(
        chunk=chunk, bucket=bucket, slots=slots, lens=lens, prefix=prefix, rows=rows
    )


def _live_batch(case):
    """The scheduler's ForwardBatch for the real requests (fields read by
    Mamba2AttnBackend.init_forward_metadata)."""
    lens = torch.tensor(case.lens)
    return SimpleNamespace(
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
        mamba_prefill_track_mask_cpu=None,
        mamba_track_seqlens_cpu=None,
    )


def _filled_tables(case, device="cpu"):
    pad = case.slots - len(case.lens)
    tables = Mamba2PrefillGraphTables.allocate(
        num_tokens=case.bucket,
        max_requests=case.slots,
        chunk_size=case.chunk,
        cache_index_dtype=torch.int32,
        device=device,
    )
    # The runner's padded replay view: zero-length slots on pool row 0.
    tables.fill(
        extend_seq_lens=torch.tensor([*case.lens, *[0] * pad], device=device),
        extend_prefix_lens=torch.tensor([*case.prefix, *[0] * pad], device=device),
        slots=_Pool()
        .get_mamba_indices(torch.tensor([*case.rows, *[0] * pad]))
        .to(device),
    )
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
    backend = _mamba2_backend(C)
    Mamba2AttnBackend.init_forward_metadata(backend, _live_batch(case))
    meta = backend.forward_metadata
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

    # 3. Conv blocks, as sglang's own static-table fill lays them out for the
    # same R + 1 sequences.
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


@pytest.fixture(scope="module")
def cases():
    rng = random.Random(16)
    return [_random_case(rng) for _ in range(CASES)]


def test_cases_cover_padding_prefixes_tails_and_chunk_edges(cases):
    assert any(len(c.lens) < c.slots for c in cases)  # zero-length request slots
    assert any(len(c.lens) == c.slots > 1 for c in cases)
    assert any(sum(c.lens) == c.bucket for c in cases)  # no tail
    assert any(any(c.prefix) for c in cases) and any(not any(c.prefix) for c in cases)
    assert any(any(n % c.chunk == 0 for n in c.lens) for c in cases)
    assert any(any(n % c.chunk == c.chunk - 1 for n in c.lens) for c in cases)
    assert any(any(n % c.chunk == 1 and n > 1 for n in c.lens) for c in cases)


def test_tables_equal_sglangs_eager_metadata(cases):
    bad = {}
    for i, case in enumerate(cases):
        found = mismatches(case, _filled_tables(case))
        if found:
            bad[i] = (vars(case), found)
    assert not bad, bad


def test_bounds_are_reached_and_hold(cases):
    """Every request and the tail start off the chunk grid: the logical chunks
    fill the table exactly (and the comparison above saw no overflow)."""
    C, R = 8, 4
    case = SimpleNamespace(
        chunk=C, bucket=5 * C + 3, slots=R, lens=[3, 9, 5, 13], prefix=[0, 4, 0, 1],
        rows=[1, 2, 3, 4],
    )  # fmt: skip
    tables = _filled_tables(case)
    assert tables.chunk_indices.shape[0] == max_logical_chunks(case.bucket, R, C)
    assert (tables.chunk_offsets < C).all()  # no inert row left
    assert tables.conv_block_table.shape[0] == max_conv_blocks(case.bucket, R)
    assert not mismatches(case, tables)


def test_a_wrong_table_is_detected(cases):
    case = next(
        c for c in cases if any(c.prefix) and 1 < len(c.lens) and sum(c.lens) < c.bucket
    )
    for field, index, delta in [
        ("chunk_offsets", 1, 1),
        ("chunk_indices", 1, 1),
        ("seq_idx", (0, 0), 1),
        ("query_start_loc", -2, 1),
        ("conv_block_table", (0, 1), 1),
        ("cache_indices", -1, 1),
    ]:
        tables = _filled_tables(case)
        getattr(tables, field)[index] += delta
        assert mismatches(case, tables), field
    # The tail merged into the last request (no tail sequence) is caught too.
    tables = _filled_tables(case)
    tables.seq_idx[tables.seq_idx == case.slots] = len(case.lens) - 1
    assert mismatches(case, tables)


def test_fill_reads_no_device_data_on_the_host():
    """On the meta device tensors have shapes but no data: an .item(), a
    .tolist(), a nonzero() or any data-dependent shape would raise."""
    case = SimpleNamespace(
        chunk=16, bucket=96, slots=5, lens=[30, 1], prefix=[0, 7], rows=[3, 4]
    )
    tables = _filled_tables(case, device="meta")
    assert tables.seq_idx.shape == (1, 96)
    assert tables.chunk_indices.shape == (triton.cdiv(96, 16) + 5,)
