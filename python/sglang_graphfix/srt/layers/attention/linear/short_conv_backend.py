# SPDX-License-Identifier: Apache-2.0
"""ShortConvAttnBackend (LFM2) under a full prefill CUDA graph: per-bucket tables
for the short-conv extend.

LFM2's prefill (lfm2.py::Lfm2ShortConv.forward) runs sglang's CUDA
causal_conv1d_fwd on a contiguous input: its grid is (request rows, channels) and
it reads every row's length from ``query_start_loc`` on the device, so it
captures once it is given fixed-size tables. Upstream hands it batch-sized
tensors from the eager metadata (short_conv_backend.py::init_forward_metadata,
which also syncs the slots to the host for ZAYA1's loop); the full prefill
runner plans out of graph instead, where the short-conv backend keeps only
decode's state. Here each token bucket gets static tables over the runner's R
request slots, refilled on the device before every replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID
from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention.linear.kda_prefill_graph import (
    bucket_tables,
    request_slots,
)


@dataclass
class ShortConvPrefillGraphTables:
    """One token bucket's tables over R request slots; ``fill`` rewrites them in
    place. The conv kernel skips a row whose slot is PAD_SLOT_ID, so the
    runner's padding rows (zero tokens) move no conv state."""

    max_requests: int
    query_start_loc: torch.Tensor  # [R + 1] int32
    has_initial_state: torch.Tensor  # [R] bool
    cache_indices: torch.Tensor  # [R], the backend's cache_indices_dtype

    @classmethod
    def allocate(
        cls, *, max_requests: int, cache_index_dtype: torch.dtype, device
    ) -> ShortConvPrefillGraphTables:
        assert max_requests >= 1, max_requests
        return cls(
            max_requests=max_requests,
            query_start_loc=torch.zeros(
                max_requests + 1, dtype=torch.int32, device=device
            ),
            has_initial_state=torch.zeros(
                max_requests, dtype=torch.bool, device=device
            ),
            cache_indices=torch.full(
                (max_requests,), PAD_SLOT_ID, dtype=cache_index_dtype, device=device
            ),
        )

    def fill(
        self,
        *,
        extend_seq_lens: torch.Tensor,
        extend_prefix_lens: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """Rewrite the tables for a batch given as [R] device tensors: the
        request slots' extend and cached-prefix lengths (zero past the batch)
        and their mamba slots. Nothing is read on the host."""
        R = self.max_requests
        for name, t in (
            ("extend_seq_lens", extend_seq_lens),
            ("extend_prefix_lens", extend_prefix_lens),
            ("slots", slots),
        ):
            assert t.shape == (R,), f"{name}: {tuple(t.shape)} != ({R},)"
        self.query_start_loc[1:].copy_(torch.cumsum(extend_seq_lens, 0))
        self.has_initial_state.copy_(extend_prefix_lens > 0)
        self.cache_indices.copy_(
            torch.where(extend_seq_lens > 0, slots, PAD_SLOT_ID).to(
                self.cache_indices.dtype
            )
        )


def prepare_short_conv_full_prefill_graph_tables(
    backend, forward_batch: ForwardBatch, *, in_capture: bool
) -> ShortConvPrefillGraphTables:
    """Allocate (capture) or look up (replay) the bucket's tables, refill them
    from ``forward_batch`` (the full prefill runner's slot-padded view of the
    batch) and hand them to the backend as its step state: what
    conv_state_metadata gives every conv layer (no host mirrors). The
    capability model asserts first at capture."""
    if in_capture:
        capability.require_capturable_full_prefill_graph(backend)
    tables = bucket_tables(
        backend,
        "short_conv_full_prefill_graph_tables",
        forward_batch,
        in_capture=in_capture,
        allocate=lambda: ShortConvPrefillGraphTables.allocate(
            max_requests=forward_batch.batch_size,
            cache_index_dtype=backend.cache_indices_dtype,
            device=backend.device,
        ),
        family="short-conv",
    )
    slots = request_slots(backend, forward_batch)
    tables.fill(
        extend_seq_lens=forward_batch.extend_seq_lens,
        extend_prefix_lens=forward_batch.extend_prefix_lens,
        slots=slots,
    )
    backend.forward_metadata = ForwardMetadata(
        query_start_loc=tables.query_start_loc,
        mamba_cache_indices=tables.cache_indices,
    )
    backend._reset_step_state()  # no host mirrors
    backend._has_initial_state = tables.has_initial_state
    backend._cache_indices = tables.cache_indices
    return tables
