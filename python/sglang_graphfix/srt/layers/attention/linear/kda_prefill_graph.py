# SPDX-License-Identifier: Apache-2.0
"""Full prefill CUDA graph tables for linear attention, on upstream's
KDAPrefillGraphMetadata.

Extends sglang/srt/layers/attention/linear/kda_prefill_graph.py, where those
static tables are built for breakable graphs: a full prefill graph keeps one set
per captured token bucket on the linear backend (GDN and KDA alike), allocated at
capture and refilled from the runner's slot-padded batch before every replay.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
    KDAPrefillTrackRows,
    build_track_rows,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.runtime_context import mamba_cache_chunk_size


def full_prefill_graph_tables(
    backend, forward_batch: ForwardBatch, *, in_capture: bool, family: str
) -> KDAPrefillGraphMetadata:
    """Allocate (capture) or look up (replay) the bucket's tables and fill them
    from ``forward_batch``, the runner's slot-padded view of the batch."""
    bucket = forward_batch.input_ids.shape[0]
    lens = real_extend_lens(forward_batch.extend_seq_lens_cpu)
    # Same slot resolution as MambaAttnBackendBase._forward_metadata.
    cache_indices = backend._translate_mamba_indices(
        backend.req_to_token_pool.get_mamba_indices(forward_batch.req_pool_indices)
    )
    tables = backend.__dict__.setdefault("full_prefill_graph_tables", {})
    if in_capture:
        # Sized by the runner's request slots (every replayed request holds at
        # least one token), not the breakable graph's SGLANG_KDA_PREFILL_GRAPH_MAX_SEQS.
        meta = tables[bucket] = KDAPrefillGraphMetadata.allocate(
            num_tokens=bucket,
            max_seqs_cap=forward_batch.batch_size,
            # Any replay of the bucket may carry prefix-cache snapshots.
            track=backend.req_to_token_pool.enable_mamba_extra_buffer,
            cache_index_dtype=cache_indices.dtype,
            device=backend.device,
        )
        track_rows = None  # the capture batch tracks nothing
    else:
        meta = tables.get(bucket)
        if meta is None:
            raise RuntimeError(
                f"{family} full prefill graph: no tables were captured for the "
                f"{bucket}-token bucket (captured: {sorted(tables)})"
            )
        track_rows = prefix_cache_track_rows(backend, forward_batch, lens)
        if track_rows is not None and not meta.track:
            raise RuntimeError(
                f"{family} full prefill graph: a prefix-cache track batch replayed "
                "on tables captured without track copies (the mamba extra buffer "
                "was off at capture)"
            )
    if len(lens) > meta.max_seqs:
        raise RuntimeError(
            f"{family} full prefill graph: {len(lens)} requests exceed the "
            f"{meta.max_seqs} rows of the {bucket}-token bucket's tables"
        )
    meta.fill(
        extend_seq_lens=lens,
        cache_indices=cache_indices,
        extend_prefix_lens=forward_batch.extend_prefix_lens,
        track_rows=track_rows,
    )
    return meta


def real_extend_lens(extend_seq_lens_cpu) -> list:
    """Extend lengths of the real requests: the runner pads the capture batch
    (and replays) with zero-length request slots at the end."""
    lens = [int(n) for n in extend_seq_lens_cpu]
    while lens and lens[-1] == 0:
        lens.pop()
    return lens


def prefix_cache_track_rows(
    backend, forward_batch: ForwardBatch, lens: list
) -> Optional[KDAPrefillTrackRows]:
    """The eager track selection (MambaAttnBackendBase._init_track_ssm_indices,
    _init_track_conv_indices) as per-row lists."""
    if forward_batch.mamba_track_mask is None:
        return None
    n = len(lens)
    host = (
        forward_batch.mamba_prefill_track_mask_cpu,
        forward_batch.mamba_track_seqlens_cpu,
        forward_batch.extend_prefix_lens_cpu,
    )
    if all(v is not None and len(v) == n for v in host):
        mask, track_seq_lens, prefix_lens = (list(v) for v in host)
    else:  # the same host copies the eager path takes without CPU metadata
        mask = forward_batch.mamba_track_mask[:n].tolist()
        track_seq_lens = forward_batch.mamba_track_seqlens[:n].tolist()
        prefix_lens = forward_batch.extend_prefix_lens[:n].tolist()
    return build_track_rows(
        track_mask=mask,
        track_seq_lens=track_seq_lens,
        extend_seq_lens=lens,
        extend_prefix_lens=prefix_lens,
        state_chunk_size=backend.mamba_chunk_size,
        cache_chunk_size=mamba_cache_chunk_size(),
        conv_len=backend.conv_states_shape[-1],
        dst=backend._translate_mamba_indices(forward_batch.mamba_track_indices),
    )
