# SPDX-License-Identifier: Apache-2.0
"""One-launch LoRA head gate for the DSA indexer.

The indexer's head gate is ``x @ weights_projᵀ`` in float32 (64 columns, one per
index head). With a LoRA adapter on ``weights_proj`` the delta
``s · (x Aᵀ) Bᵀ`` would take sglang's shrink and expand kernels: two launches,
an intermediate tensor and their Python wrappers, for a 64-column output.

- ``lora_head_gate``: the whole gate, base and delta, in one launch that reads x
  once (x is 7 MB at 512 tokens; the base GEMM alone is bound by reading it).
  For batches where every request has an adapter, not all the same one (a
  batch on one adapter takes cuBLAS on the merged weight instead).
- ``add_lora_head_gate_delta_``: shrink, expand, adapter scaling and the add into
  a float32 base from upstream's cuBLAS GEMM, in one launch. For batches with a
  request without an adapter: its rows are never touched and stay bit-identical
  to a server without LoRA.

Short prompts have few row tiles, so both split K across programs; the last
program of a row tile (an atomic count) sums the partials in split order, so the
result is deterministic and stays one launch.

It works per request, from sglang's LoRA batch info (``LoRABatchInfo``) of
either dense backend: the Triton backend's segments are the requests; csgmv's are
chunks of 16-128 tokens in adapter order, so its per-request view
(``req_seg_indptr``, ``req_weight_indices``) is used instead: each program then
reads its adapter's A once for up to 64 rows rather than once per chunk. Like
sglang's kernels, the shrink output is rounded to the activation dtype before the
expand.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The largest LoRA pool rank (the pool's max, which sizes the rank tile) these
# kernels take. On an H200 a rank-256 pool needs more shared memory than there is
# (the whole gate at 2048+ tokens: 294912 bytes against 232448), and rank 512 fails
# the delta as well; ranks up to 128 ran at every size tried (2026-12-05, a
# reviewer's runs, not kept as a file). Above it the caller uses sglang's own
# LoRA kernels.
MAX_RANK = 128
# Tiles that do not depend on the batch: under --enable-deterministic-inference a
# request's delta must not change with what else is in its batch (split K and the
# K tile follow the token count otherwise, and so does the order of the K sum).
BATCH_INVARIANT_DELTA_TILES = {"split_k": 1, "block_k": 128, "block_m": 16}


@triton.jit
def _segment_rows(
    seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr, block, count, T,
    BLOCK_M: tl.constexpr,
):  # fmt: skip
    """This program's BLOCK_M rows of its segment (program_id 1): (rows,
    row_ok, lora, rank, in_segment). Segments below ``count`` are requests;
    segment ``count`` is the graph padding rows up to T (rank 0)."""
    segment = tl.program_id(1)
    is_req = segment < count
    lora = tl.load(weight_indices_ptr + segment, mask=is_req, other=0)
    rank = tl.where(is_req, tl.load(lora_ranks_ptr + lora), 0)
    start = tl.load(seg_indptr_ptr + segment)
    end = tl.where(is_req, tl.load(seg_indptr_ptr + segment + 1, mask=is_req), T)
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = (start + offs_m).to(tl.int64)
    return rows, offs_m < end - start, lora, rank, block * BLOCK_M < end - start


@triton.jit
def _a_tile_ptrs(a_ptr, lora, offs_r, offs_k, stride_a_lora, stride_a_rank):
    """Pointers to the (K x rank) tile of adapter ``lora``'s A at offs_k."""
    return (
        a_ptr
        + lora.to(tl.int64) * stride_a_lora
        + offs_r[None, :] * stride_a_rank
        + offs_k[:, None]
    )


@triton.jit
def _shrink(
    x_ptr, a_ptr, rows, row_ok, lora, rank, k_begin, k_end, stride_x,
    stride_a_lora, stride_a_rank,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """x[rows, k_begin:k_end] · A[lora, :rank, k_begin:k_end]ᵀ, fp32."""
    offs_k = k_begin + tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    x_ptrs = x_ptr + rows[:, None] * stride_x + offs_k[None, :]
    a_ptrs = _a_tile_ptrs(a_ptr, lora, offs_r, offs_k, stride_a_lora, stride_a_rank)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k_ok = offs_k < k_end - (k0 - k_begin)
        x_tile = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        a_tile = tl.load(
            a_ptrs, mask=k_ok[:, None] & (offs_r < rank)[None, :], other=0.0
        )
        acc = tl.dot(x_tile, a_tile, acc)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
    return acc


@triton.jit
def _expand(
    shrink, b_ptr, scalings_ptr, lora, rank, N, stride_b_lora, stride_b_out,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """scaling · shrink (rounded to B's dtype, as sglang's kernels round x Aᵀ) ·
    Bᵀ, fp32."""
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    b_ptrs = (
        b_ptr
        + lora.to(tl.int64) * stride_b_lora
        + offs_n[None, :] * stride_b_out
        + offs_r[:, None]
    )
    b_mask = (offs_r < rank)[:, None] & (offs_n < N)[None, :]
    b_tile = tl.load(b_ptrs, mask=b_mask, other=0.0)
    return tl.load(scalings_ptr + lora) * tl.dot(shrink.to(b_tile.dtype), b_tile)


@triton.jit
def _expand_add(
    shrink, b_ptr, out_ptr, scalings_ptr, rows, row_ok, lora, rank, N,
    stride_b_lora, stride_b_out, stride_out,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[rows] += _expand(shrink)."""
    delta = _expand(
        shrink, b_ptr, scalings_ptr, lora, rank, N, stride_b_lora, stride_b_out,
        BLOCK_R, BLOCK_N,
    )  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + rows[:, None] * stride_out + offs_n[None, :]
    out_mask = row_ok[:, None] & (offs_n < N)[None, :]
    base = tl.load(out_ptrs, mask=out_mask, other=0.0)
    tl.store(out_ptrs, base + delta, mask=out_mask)


@triton.jit
def _store_partial(
    acc, part_ptr, rows, row_ok, split, stride_part, WIDTH: tl.constexpr
):
    offs = tl.arange(0, WIDTH)
    ptrs = part_ptr + split * stride_part + rows[:, None] * WIDTH + offs[None, :]
    tl.store(ptrs, acc, mask=row_ok[:, None])


@triton.jit
def _sum_partials(
    part_ptr, rows, row_ok, stride_part, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    WIDTH: tl.constexpr,
):  # fmt: skip
    """The split-K partials of rows, summed in split order (deterministic)."""
    offs = tl.arange(0, WIDTH)
    ptrs = part_ptr + rows[:, None] * WIDTH + offs[None, :]
    total = tl.zeros((BLOCK_M, WIDTH), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        total += tl.load(
            ptrs + s * stride_part, mask=row_ok[:, None], other=0.0,
            cache_modifier=".cg",
        )  # fmt: skip
    return total


@triton.jit
def _is_last_split(counter_ptr, SPLIT_K: tl.constexpr):
    """Split-K in one launch: after storing its partial, each split of a row
    block counts itself; the last one (which may be any) sums all partials in
    split order, then resets the count for the next call."""
    tl.debug_barrier()  # every thread's partial stored before the count
    done = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    return done == SPLIT_K - 1


@triton.jit
def _lora_head_gate_delta_kernel(
    x_ptr, a_ptr, b_ptr, out_ptr, part_ptr, counter_ptr, seg_indptr_ptr,
    weight_indices_ptr, lora_ranks_ptr, scalings_ptr, K, N, K_SPLIT, stride_x,
    stride_a_lora, stride_a_rank, stride_b_lora, stride_b_out, stride_out,
    stride_part,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program per BLOCK_M rows of a request and K_SPLIT columns of K:
    shrink, then (split K: by the row tile's last split, _is_last_split)
    expand and add."""
    block, split = tl.program_id(0) // SPLIT_K, tl.program_id(0) % SPLIT_K
    # One segment per request, no padding segment (its rows are not touched).
    rows, row_ok, lora, rank, in_segment = _segment_rows(
        seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr, block,
        tl.num_programs(1), 0, BLOCK_M,
    )  # fmt: skip
    if in_segment & (rank > 0):
        k_begin = split * K_SPLIT
        shrink = _shrink(
            x_ptr, a_ptr, rows, row_ok, lora, rank, k_begin,
            tl.minimum(K, k_begin + K_SPLIT), stride_x, stride_a_lora,
            stride_a_rank, BLOCK_M, BLOCK_K, BLOCK_R,
        )  # fmt: skip
        is_last = True
        if SPLIT_K > 1:
            tile = tl.program_id(1) * (tl.num_programs(0) // SPLIT_K) + block
            _store_partial(shrink, part_ptr, rows, row_ok, split, stride_part, BLOCK_R)
            is_last = _is_last_split(counter_ptr + tile, SPLIT_K)
            if is_last:
                shrink = _sum_partials(
                    part_ptr, rows, row_ok, stride_part, SPLIT_K, BLOCK_M, BLOCK_R
                )
                tl.atomic_xchg(counter_ptr + tile, 0)
        if is_last:
            _expand_add(
                shrink, b_ptr, out_ptr, scalings_ptr, rows, row_ok, lora, rank,
                N, stride_b_lora, stride_b_out, stride_out, BLOCK_R, BLOCK_N,
            )  # fmt: skip


@triton.jit
def _lora_head_gate_kernel(
    x_ptr, w_ptr, a_ptr, b_ptr, out_ptr, part_ptr, part_r_ptr, counter_ptr,
    seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr, scalings_ptr, count,
    T, K, N, K_SPLIT, stride_x, stride_w, stride_a_lora, stride_a_rank,
    stride_b_lora, stride_b_out, stride_out, stride_part, stride_part_r,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The whole gate x Wᵀ + s·(x Aᵀ) Bᵀ, fp32, reading x once: base and shrink
    share every x tile. Segment ``count`` is the graph padding past the
    requests (base only)."""
    block, split = tl.program_id(0) // SPLIT_K, tl.program_id(0) % SPLIT_K
    rows, row_ok, lora, rank, in_segment = _segment_rows(
        seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr, block, count, T, BLOCK_M
    )
    if in_segment:
        k_begin = split * K_SPLIT
        k_end = tl.minimum(K, k_begin + K_SPLIT)
        offs_k = k_begin + tl.arange(0, BLOCK_K)
        offs_r = tl.arange(0, BLOCK_R)
        offs_n = tl.arange(0, BLOCK_N)
        x_ptrs = x_ptr + rows[:, None] * stride_x + offs_k[None, :]
        w_ptrs = w_ptr + offs_n[None, :] * stride_w + offs_k[:, None]
        a_ptrs = _a_tile_ptrs(a_ptr, lora, offs_r, offs_k, stride_a_lora, stride_a_rank)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_r = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k0 in range(k_begin, k_end, BLOCK_K):
            k_ok = offs_k < k_end - (k0 - k_begin)
            x_tile = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w_tile = tl.load(
                w_ptrs, mask=k_ok[:, None] & (offs_n < N)[None, :], other=0.0
            )
            a_tile = tl.load(
                a_ptrs, mask=k_ok[:, None] & (offs_r < rank)[None, :], other=0.0
            )
            acc = tl.dot(x_tile, w_tile, acc)
            acc_r = tl.dot(x_tile, a_tile, acc_r)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
            a_ptrs += BLOCK_K
        is_last = True
        if SPLIT_K > 1:
            tile = tl.program_id(1) * (tl.num_programs(0) // SPLIT_K) + block
            _store_partial(acc, part_ptr, rows, row_ok, split, stride_part, BLOCK_N)
            _store_partial(
                acc_r, part_r_ptr, rows, row_ok, split, stride_part_r, BLOCK_R
            )
            is_last = _is_last_split(counter_ptr + tile, SPLIT_K)
            if is_last:
                acc = _sum_partials(
                    part_ptr, rows, row_ok, stride_part, SPLIT_K, BLOCK_M, BLOCK_N
                )
                acc_r = _sum_partials(
                    part_r_ptr, rows, row_ok, stride_part_r, SPLIT_K, BLOCK_M, BLOCK_R
                )
                tl.atomic_xchg(counter_ptr + tile, 0)
        if is_last:
            if rank > 0:
                acc += _expand(
                    acc_r, b_ptr, scalings_ptr, lora, rank, N, stride_b_lora,
                    stride_b_out, BLOCK_R, BLOCK_N,
                )  # fmt: skip
            out_ptrs = out_ptr + rows[:, None] * stride_out + offs_n[None, :]
            tl.store(out_ptrs, acc, mask=row_ok[:, None] & (offs_n < N)[None, :])


_COUNTERS: dict = {}
_OUTGROWN: list = []


def _counters(n: int, device: torch.device) -> torch.Tensor:
    """Zeroed split-K counters, one buffer per device: every launch leaves the
    counts it used at zero again (launches on one device must not overlap, as
    on sglang's forward stream). An outgrown buffer is kept alive: a captured
    CUDA graph may still point at it."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _OUTGROWN.append(buf)
        buf = _COUNTERS[device] = torch.zeros(
            max(n, 4096), dtype=torch.int32, device=device
        )
    return buf


def request_segments(batch_info):
    """(seg_indptr, weight_indices, count, max rows) of the batch's requests."""
    if batch_info.req_seg_indptr is not None:  # csgmv
        return (
            batch_info.req_seg_indptr,
            batch_info.req_weight_indices,
            batch_info.bs,
            None,
        )
    assert batch_info.permutation is None, "segments must be whole requests"
    count = batch_info.num_segments or batch_info.bs
    return batch_info.seg_indptr, batch_info.weight_indices, count, batch_info.max_len


def add_lora_head_gate_delta_(
    out: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    batch_info,
    *,
    block_k: int | None = None,
    split_k: int | None = None,
    block_m: int | None = None,
) -> torch.Tensor:
    """``out[rows] += scaling · (x[rows] Aᵀ) Bᵀ`` per request, in place.

    out: float32 (tokens, N) base gate; x: (tokens, K) activations;
    lora_a: (loras, max_rank, K); lora_b: (loras, N, max_rank) (sglang's LoRA
    memory-pool buffers for the layer); batch_info: sglang's LoRABatchInfo of
    the csgmv or triton backend. Requests whose adapter has rank 0 (none) and
    rows past the requests (graph padding) are not touched. block_k / split_k /
    block_m override the tile heuristics (benchmark sweeps;
    BATCH_INVARIANT_DELTA_TILES).
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    assert out.dtype == torch.float32 and out.stride(-1) == 1, "float32 base gate"
    assert lora_a.stride(-1) == 1 and lora_b.stride(-1) == 1
    tokens, k = x.shape
    n = out.shape[1]
    assert out.shape[0] == tokens and lora_a.shape[-1] == k and lora_b.shape[1] == n
    seg_indptr, weight_indices, count, max_rows = request_segments(batch_info)
    if tokens == 0 or count == 0:
        return out
    # Tiles as measured best on the H200 (benchmark/dsa_head_gate_kernel_sweep.py,
    # 512-8192 tokens): short prompts split K (in one launch) over 16-row
    # tiles; long ones walk all of K with up to 64 rows, deep K tiles.
    if block_m is None:
        block_m = min(64, max(16, triton.next_power_of_2(tokens // 128)))
    block_r = max(16, triton.next_power_of_2(lora_a.shape[1]))
    block_n = max(16, triton.next_power_of_2(n))
    if split_k is None:
        split_k = 8 if tokens < 1024 else 4 if tokens < 4096 else 1
    if block_k is None:
        # ~32 KB of x and A per pipeline stage when walking all of K.
        deep = min(512, 1 << (32768 // (block_m + block_r)).bit_length() - 1)
        block_k = 128 if split_k > 1 else deep
    blocks = triton.cdiv(min(max_rows or tokens, tokens), block_m)
    k_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    part = out  # not read without split K
    if split_k > 1:
        part = torch.empty(
            (split_k, tokens, block_r), dtype=torch.float32, device=x.device
        )
    _lora_head_gate_delta_kernel[(blocks * split_k, count)](
        x, lora_a, lora_b, out, part, _counters(blocks * count, x.device),
        seg_indptr, weight_indices, batch_info.lora_ranks, batch_info.scalings,
        k, n, k_split, x.stride(0), lora_a.stride(0), lora_a.stride(1),
        lora_b.stride(0), lora_b.stride(1), out.stride(0), part.stride(0),
        SPLIT_K=split_k, BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_R=block_r,
        BLOCK_N=block_n, num_stages=3,
    )  # fmt: skip
    return out


def lora_head_gate(
    x: torch.Tensor,
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    batch_info,
    *,
    block_m: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """The whole head gate ``x Wᵀ + s·(x Aᵀ) Bᵀ`` (fp32, tokens x N) in one
    launch that reads x once. Rows of requests without an adapter and graph
    padding rows get x Wᵀ from this kernel, not cuBLAS: use it only when every
    request has an adapter if those rows must match a server without LoRA.
    Arguments as add_lora_head_gate_delta_'s, weight: (N, K) in x's dtype."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    assert weight.stride(-1) == 1 and lora_a.stride(-1) == 1 and lora_b.stride(-1) == 1
    tokens, k = x.shape
    n = weight.shape[0]
    seg_indptr, weight_indices, count, _ = request_segments(batch_info)
    out = torch.empty((tokens, n), dtype=torch.float32, device=x.device)
    if tokens == 0:
        return out
    block_r = max(16, triton.next_power_of_2(lora_a.shape[1]))
    block_n = max(16, triton.next_power_of_2(n))
    block_k = block_k or 128
    # Tiles as measured best on the H200 (benchmark/dsa_head_gate_kernel_sweep.py,
    # 512-8192 tokens): 64-row tiles from 2048 tokens (fewer re-reads of W and
    # A), below that 32 rows (16 for pools of rank > 16); K split so that ~128
    # programs share the work (~256 for rank 16 from 4096 tokens).
    block_m = block_m or (64 if tokens >= 2048 else 32 if block_r <= 16 else 16)
    row_blocks = triton.cdiv(tokens, block_m)
    if split_k is None:
        programs = 256 if block_r <= 16 and tokens >= 4096 else 128
        split_k = min(16, triton.next_power_of_2(triton.cdiv(programs, row_blocks)))
    k_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    part = part_r = out
    if split_k > 1:
        part = torch.empty(
            (split_k, tokens, block_n), dtype=torch.float32, device=x.device
        )
        part_r = torch.empty(
            (split_k, tokens, block_r), dtype=torch.float32, device=x.device
        )
    # One more segment: graph padding rows past the last request (base only).
    _lora_head_gate_kernel[(row_blocks * split_k, count + 1)](
        x, weight, lora_a, lora_b, out, part, part_r,
        _counters(row_blocks * (count + 1), x.device), seg_indptr,
        weight_indices, batch_info.lora_ranks, batch_info.scalings, count,
        tokens, k, n, k_split, x.stride(0), weight.stride(0), lora_a.stride(0),
        lora_a.stride(1), lora_b.stride(0), lora_b.stride(1), out.stride(0),
        part.stride(0), part_r.stride(0), SPLIT_K=split_k, BLOCK_M=block_m,
        BLOCK_K=block_k, BLOCK_R=block_r, BLOCK_N=block_n, num_stages=3,
    )  # fmt: skip
    return out
