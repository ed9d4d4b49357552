# SPDX-License-Identifier: Apache-2.0
"""Full prefill CUDA graph tables for linear attention, on upstream's
KDAPrefillGraphMetadata.

Extends sglang/srt/layers/attention/linear/kda_prefill_graph.py, where those
static tables are built for breakable graphs: a full prefill graph keeps one set
per captured token bucket on the linear backend (GDN and KDA alike), allocated at
capture and refilled from the runner's slot-padded batch before every replay.

The refill runs on the device (sglang_graphfix_kernel.linear_prefill_tables):
upstream's KDAPrefillGraphMetadata.fill builds the tables on the host from the
batch's CPU lengths (numpy, per-row Python for the prefix-cache track plan, a
pinned copy), work that grows with the number of requests and sits on the replay
path before every full-graph forward. Here the same tables come from the batch's
device tensors in one kernel launch; the host work per replay is constant.
"""

from __future__ import annotations

import torch

from sglang.kernels.ops.mamba.causal_conv1d_triton import (
    CAUSAL_CONV1D_FWD_BLOCK_M,
    PAD_SLOT_ID,
)
from sglang.kernels.ops.mamba.kda_prefill_track import (
    TRACK_CHUNK_STATE,
    TRACK_FINAL_STATE,
)
from sglang.srt.layers.attention.linear import kda_prefill_graph as upstream
from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDA_CHUNK_SIZE,
    KDAPrefillGraphMetadata,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.runtime_context import mamba_cache_chunk_size
from sglang_graphfix_kernel.linear_prefill_tables import (
    TableConstants,
    TableViews,
    TrackInputs,
    fill_linear_prefill_tables,
)


def bucket_tables(backend, store: str, forward_batch, *, in_capture, allocate, family):
    """The full prefill graph's entry for ``forward_batch``'s token bucket and
    request slots in the per-graph dict ``store`` on ``backend`` (every linear
    family keeps one): ``allocate()``'s result at capture; at replay the
    captured one, or a RuntimeError naming the (tokens, request slots) that
    were captured."""
    key = (forward_batch.input_ids.shape[0], forward_batch.batch_size)
    entries = backend.__dict__.setdefault(store, {})
    if in_capture:
        entries[key] = allocate()
    elif key not in entries:
        raise RuntimeError(
            f"{family} full prefill graph: no tables were captured for the "
            f"{key[0]}-token bucket with {key[1]} request slots (captured, "
            f"tokens and request slots: {sorted(entries)})"
        )
    return entries[key]


def request_slots(backend, forward_batch) -> torch.Tensor:
    """The request slots' physical mamba slots (as
    MambaAttnBackendBase._forward_metadata resolves them; padding rows carry
    request-pool row 0, the reserved padding slot)."""
    return backend._translate_mamba_indices(
        backend.req_to_token_pool.get_mamba_indices(forward_batch.req_pool_indices)
    )


def full_prefill_graph_tables(
    backend, forward_batch: ForwardBatch, *, in_capture: bool, family: str
) -> KDAPrefillGraphMetadata:
    """Allocate (capture) or look up (replay) the bucket's tables and fill them
    on the device from ``forward_batch``, the runner's slot-padded view of the
    batch. Host work is the same for one request or for every request slot."""
    bucket = forward_batch.input_ids.shape[0]
    bs = num_real_requests(forward_batch.extend_seq_lens_cpu)
    cache_indices = request_slots(backend, forward_batch)
    # Sized by the runner's request slots (every replayed request holds at least
    # one token), not the breakable graph's SGLANG_KDA_PREFILL_GRAPH_MAX_SEQS.
    meta = bucket_tables(
        backend,
        "full_prefill_graph_tables",
        forward_batch,
        in_capture=in_capture,
        allocate=lambda: KDAPrefillGraphMetadata.allocate(
            num_tokens=bucket,
            max_seqs_cap=forward_batch.batch_size,
            # Any replay of the bucket may carry prefix-cache snapshots.
            track=backend.req_to_token_pool.enable_mamba_extra_buffer,
            cache_index_dtype=cache_indices.dtype,
            device=backend.device,
        ),
        family=family,
    )
    if not in_capture and forward_batch.mamba_track_mask is not None and not meta.track:
        raise RuntimeError(
            f"{family} full prefill graph: a prefix-cache track batch replayed "
            "on tables captured without track copies (the mamba extra buffer "
            "was off at capture)"
        )
    if bs > meta.max_seqs:
        raise RuntimeError(
            f"{family} full prefill graph: {bs} requests exceed the "
            f"{meta.max_seqs} rows of the {bucket}-token bucket's tables"
        )
    fill_linear_prefill_tables(
        table_views(meta),
        bs=bs,
        max_seqs=meta.max_seqs,
        extend_seq_lens=forward_batch.extend_seq_lens,
        extend_prefix_lens=forward_batch.extend_prefix_lens,
        slots=cache_indices,
        track=_track_inputs(backend, forward_batch, meta),
        constants=table_constants(backend),
    )
    return meta


def num_real_requests(extend_seq_lens_cpu) -> int:
    """Requests in the batch: the runner pads the capture batch with zero-length
    request slots at the end (a replayed batch has none, so this reads one entry)."""
    n = len(extend_seq_lens_cpu)
    while n and extend_seq_lens_cpu[n - 1] == 0:
        n -= 1
    return n


def table_views(meta: KDAPrefillGraphMetadata) -> TableViews:
    return TableViews(
        cu_seqlens=meta.cu_seqlens,
        chunk_indices=meta.chunk_indices,
        chunk_offsets=meta.chunk_offsets,
        conv_block_table=meta.conv_block_table,
        track_chunk_idx=meta.track_chunk_idx,
        track_mode=meta.track_mode,
        track_conv_start=meta.track_conv_start,
        num_logical_tokens=meta.num_logical_tokens,
        cache_indices=meta.cache_indices,
        has_initial_state=meta.has_initial_state,
        track_dst=meta.track_dst,
    )


def table_constants(backend) -> TableConstants:
    """The chunking upstream's fill and build_track_rows use."""
    return TableConstants(
        chunk=KDA_CHUNK_SIZE,
        conv_block=CAUSAL_CONV1D_FWD_BLOCK_M,
        state_chunk=backend.mamba_chunk_size,
        cache_chunk=mamba_cache_chunk_size(),
        conv_len=backend.conv_states_shape[-1],
        pad_chunk=upstream._PAD_CHUNK,
        pad_slot=PAD_SLOT_ID,
        track_final=TRACK_FINAL_STATE,
        track_chunk=TRACK_CHUNK_STATE,
    )


def _track_inputs(backend, forward_batch: ForwardBatch, meta):
    """The eager track selection's inputs (MambaAttnBackendBase's
    _init_track_ssm_indices / _init_track_conv_indices), as device tensors. One
    dtype each (no copy when already so), so that capture and replay launch the
    same compiled kernel."""
    if not meta.track:
        return None
    mask = forward_batch.mamba_track_mask
    if mask is None:  # e.g. the capture batch without track slots: track nothing
        mask = torch.zeros(meta.max_seqs, dtype=torch.bool, device=backend.device)
        lens = slots = torch.zeros(
            meta.max_seqs, dtype=torch.int64, device=backend.device
        )
        return TrackInputs(mask=mask, seq_lens=lens, slots=slots)
    return live_track_inputs(backend, forward_batch)


def live_track_inputs(backend, forward_batch: ForwardBatch) -> TrackInputs:
    """A batch's track mask, tracked lengths and translated track slots as bool,
    int64 and int64 (no copy when already so): sglang's capture slot holds the
    lengths as int32, its scheduler's batches as int64, and a table-fill kernel
    launched on both would compile once for each."""
    slots = backend._translate_mamba_indices(forward_batch.mamba_track_indices)
    return TrackInputs(
        mask=forward_batch.mamba_track_mask.to(torch.bool),
        seq_lens=forward_batch.mamba_track_seqlens.to(torch.int64),
        slots=slots.to(torch.int64),
    )
