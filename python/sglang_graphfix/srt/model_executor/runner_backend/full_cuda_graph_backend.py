# SPDX-License-Identifier: Apache-2.0
"""FullCudaGraphBackend and the request buckets of a full prefill graph.

Fixes sglang/srt/model_executor/runner_backend/full_cuda_graph_backend.py: it
files each captured graph under the ShapeKey the runner built, which for a
prefill shape names only the token bucket, so a second graph of the same bucket
over fewer request slots would replace the first.
"""

from __future__ import annotations

import dataclasses

from sglang_graphfix.srt.layers.attention.hybrid_linear_attn_backend import (
    CAPTURE_REQUEST_SLOTS,
)
from sglang_graphfix.srt.model_executor.runner.prefill_cuda_graph_runner import (
    request_bucket_label,
)


# What:    Wraps FullCudaGraphBackend.capture_one: a graph captured for a request
#          bucket is filed under that bucket's attention variant.
# Why:     capture_request_bucket_graphs captures a token bucket again over
#          fewer request slots through upstream's capture_one_shape, whose
#          ShapeKey names the token bucket only: the graph would overwrite the
#          one over all slots.
# How:     While the attention backend's CAPTURE_REQUEST_SLOTS is set (only
#          during those captures), the key gets request_bucket_label's attention
#          variant, the key replay_request_bucket_graph gives such a batch.
#          Every other capture keeps its key.
# Upstream: sglang/srt/model_executor/runner_backend/full_cuda_graph_backend.py::FullCudaGraphBackend.capture_one
# Removal: with capture_request_bucket_graphs.
def key_graph_by_request_bucket(original, self, shape_key, *args, **kwargs):
    attn_backend = getattr(self._cuda_graph_runner.model_runner, "attn_backend", None)
    slots = getattr(attn_backend, CAPTURE_REQUEST_SLOTS, None)
    if slots is not None:
        assert shape_key.attention_variant is None, shape_key
        shape_key = dataclasses.replace(
            shape_key, attention_variant=request_bucket_label(slots)
        )
    return original(self, shape_key, *args, **kwargs)
