# SPDX-License-Identifier: Apache-2.0
"""One-launch LoRA delta for the DSA indexer head gate.

The indexer's head gate is ``x @ weights_projᵀ`` in float32 (64 columns, one per
index head). With a LoRA adapter on ``weights_proj`` the delta
``s · (x Aᵀ) Bᵀ`` would take sglang's shrink and expand kernels: two launches,
an intermediate tensor and their Python wrappers, for a 64-column output.
``add_lora_head_gate_delta_`` does shrink, expand, adapter scaling and the add
into the float32 base in one Triton launch. The base GEMM stays outside (cuBLAS,
as upstream), so rows without an adapter are never touched and stay bit-identical
to a server without LoRA.

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


@triton.jit
def _segment_rows(
    seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr, block, BLOCK_M: tl.constexpr
):
    """This program's rows of its request: (rows, row_ok, lora, rank, active)."""
    segment = tl.program_id(1)
    lora = tl.load(weight_indices_ptr + segment)
    rank = tl.load(lora_ranks_ptr + lora)
    start = tl.load(seg_indptr_ptr + segment)
    length = tl.load(seg_indptr_ptr + segment + 1) - start
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    active = (rank > 0) & (block * BLOCK_M < length)
    return (start + offs_m).to(tl.int64), offs_m < length, lora, rank, active


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
    a_ptrs = (
        a_ptr
        + lora.to(tl.int64) * stride_a_lora
        + offs_r[None, :] * stride_a_rank
        + offs_k[:, None]
    )
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
def _expand_add(
    shrink, b_ptr, out_ptr, scalings_ptr, rows, row_ok, lora, rank, N,
    stride_b_lora, stride_b_out, stride_out,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[rows] += scaling · shrink (rounded to B's dtype, as sglang's
    kernels round x Aᵀ) · Bᵀ."""
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    b_ptrs = (
        b_ptr
        + lora.to(tl.int64) * stride_b_lora
        + offs_n[None, :] * stride_b_out
        + offs_r[:, None]
    )
    b_mask = (offs_r < rank)[:, None] & n_ok[None, :]
    b_tile = tl.load(b_ptrs, mask=b_mask, other=0.0)
    delta = tl.dot(shrink.to(b_tile.dtype), b_tile)
    scaling = tl.load(scalings_ptr + lora)
    out_ptrs = out_ptr + rows[:, None] * stride_out + offs_n[None, :]
    out_mask = row_ok[:, None] & n_ok[None, :]
    base = tl.load(out_ptrs, mask=out_mask, other=0.0)
    tl.store(out_ptrs, base + scaling * delta, mask=out_mask)


@triton.jit
def _lora_head_gate_delta_kernel(
    x_ptr, a_ptr, b_ptr, out_ptr, seg_indptr_ptr, weight_indices_ptr,
    lora_ranks_ptr, scalings_ptr, K, N, stride_x, stride_a_lora, stride_a_rank,
    stride_b_lora, stride_b_out, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program per BLOCK_M rows of a request: shrink over all of K, expand,
    add."""
    rows, row_ok, lora, rank, active = _segment_rows(
        seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr, tl.program_id(0), BLOCK_M
    )
    if active:
        shrink = _shrink(
            x_ptr, a_ptr, rows, row_ok, lora, rank, 0, K, stride_x,
            stride_a_lora, stride_a_rank, BLOCK_M, BLOCK_K, BLOCK_R,
        )  # fmt: skip
        _expand_add(
            shrink, b_ptr, out_ptr, scalings_ptr, rows, row_ok, lora, rank, N,
            stride_b_lora, stride_b_out, stride_out, BLOCK_R, BLOCK_N,
        )  # fmt: skip


@triton.jit
def _lora_head_gate_shrink_split_kernel(
    x_ptr, a_ptr, part_ptr, seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr,
    K, K_SPLIT, stride_x, stride_a_lora, stride_a_rank, stride_part,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Split-K shrink for short prompts: program (block, split) writes its
    partial x Aᵀ over K_SPLIT columns to part[split, rows] (fp32)."""
    block, split = tl.program_id(0) // SPLIT_K, tl.program_id(0) % SPLIT_K
    rows, row_ok, lora, rank, active = _segment_rows(
        seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr, block, BLOCK_M
    )
    if active:
        k_begin = split * K_SPLIT
        shrink = _shrink(
            x_ptr, a_ptr, rows, row_ok, lora, rank, k_begin,
            tl.minimum(K, k_begin + K_SPLIT), stride_x, stride_a_lora,
            stride_a_rank, BLOCK_M, BLOCK_K, BLOCK_R,
        )  # fmt: skip
        offs_r = tl.arange(0, BLOCK_R)
        part_ptrs = (
            part_ptr + split * stride_part + rows[:, None] * BLOCK_R + offs_r[None, :]
        )
        tl.store(part_ptrs, shrink, mask=row_ok[:, None])


@triton.jit
def _lora_head_gate_expand_split_kernel(
    part_ptr, b_ptr, out_ptr, seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr,
    scalings_ptr, N, stride_part, stride_b_lora, stride_b_out, stride_out,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Sums the split-K partials in a fixed order (deterministic), then expands
    and adds."""
    rows, row_ok, lora, rank, active = _segment_rows(
        seg_indptr_ptr, weight_indices_ptr, lora_ranks_ptr, tl.program_id(0), BLOCK_M
    )
    if active:
        offs_r = tl.arange(0, BLOCK_R)
        part_ptrs = part_ptr + rows[:, None] * BLOCK_R + offs_r[None, :]
        shrink = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for split in tl.static_range(SPLIT_K):
            shrink += tl.load(
                part_ptrs + split * stride_part, mask=row_ok[:, None], other=0.0
            )
        _expand_add(
            shrink, b_ptr, out_ptr, scalings_ptr, rows, row_ok, lora, rank, N,
            stride_b_lora, stride_b_out, stride_out, BLOCK_R, BLOCK_N,
        )  # fmt: skip


def request_segments(batch_info):
    """(seg_indptr, weight_indices, count, max rows) of the batch's requests."""
    if batch_info.req_seg_indptr is not None:  # csgmv
        return batch_info.req_seg_indptr, batch_info.req_weight_indices, batch_info.bs, None
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
) -> torch.Tensor:
    """``out[rows] += scaling · (x[rows] Aᵀ) Bᵀ`` per request, in place.

    out: float32 (tokens, N) base gate; x: (tokens, K) activations;
    lora_a: (loras, max_rank, K); lora_b: (loras, N, max_rank) (sglang's LoRA
    memory-pool buffers for the layer); batch_info: sglang's LoRABatchInfo of
    the csgmv or triton backend. Requests whose adapter has rank 0 (none) and
    rows past the requests (graph padding) are not touched. block_k / split_k
    override the tile heuristics (benchmark sweeps).
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
    # Row tiles of 16-64: about 128 programs from 2048 tokens on, fewer
    # re-reads of A (max_rank x K) for long prompts.
    block_m = min(64, max(16, triton.next_power_of_2(tokens // 128)))
    block_r = max(16, triton.next_power_of_2(lora_a.shape[1]))
    block_n = max(16, triton.next_power_of_2(n))
    # Deep K tiles keep ~32 KB of x and A in flight per pipeline stage.
    block_k = block_k or min(512, 1 << (32768 // (block_m + block_r)).bit_length() - 1)
    # Short prompts have few row blocks: split K so ~128 programs share the
    # walk along K, then sum the partials in a fixed order (deterministic).
    row_blocks = triton.cdiv(tokens, block_m)
    if split_k is None:
        split_k = min(8, triton.next_power_of_2(triton.cdiv(128, row_blocks)))
    blocks = triton.cdiv(min(max_rows or tokens, tokens), block_m)
    common = (seg_indptr, weight_indices, batch_info.lora_ranks)
    if split_k == 1:
        _lora_head_gate_delta_kernel[(blocks, count)](
            x, lora_a, lora_b, out, *common, batch_info.scalings, k, n,
            x.stride(0), lora_a.stride(0), lora_a.stride(1), lora_b.stride(0),
            lora_b.stride(1), out.stride(0), BLOCK_M=block_m, BLOCK_K=block_k,
            BLOCK_R=block_r, BLOCK_N=block_n, num_stages=3,
        )  # fmt: skip
        return out
    k_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    part = torch.empty((split_k, tokens, block_r), dtype=torch.float32, device=x.device)
    _lora_head_gate_shrink_split_kernel[(blocks * split_k, count)](
        x, lora_a, part, *common, k, k_split, x.stride(0), lora_a.stride(0),
        lora_a.stride(1), part.stride(0), SPLIT_K=split_k, BLOCK_M=block_m,
        BLOCK_K=block_k, BLOCK_R=block_r, num_stages=3,
    )  # fmt: skip
    _lora_head_gate_expand_split_kernel[(blocks, count)](
        part, lora_b, out, *common, batch_info.scalings, n, part.stride(0),
        lora_b.stride(0), lora_b.stride(1), out.stride(0), SPLIT_K=split_k,
        BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_N=block_n,
    )  # fmt: skip
    return out
