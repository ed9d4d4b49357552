# SPDX-License-Identifier: Apache-2.0
"""Online weight updates, and weight-update sessions, drop the DSA indexer's
merged weights_proj (dsa_indexer.merged_weights_proj). Mirrors
sglang/srt/model_executor/model_runner_components/weight_updater.py."""

from __future__ import annotations

from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer


# What:    Wraps _unsupported_derived_weight_cache_error, the check every online
#          weight update (from disk, tensor, distributed, IPC) runs before it
#          writes: an update it lets through drops every merged weights_proj.
# Why:     A merged weights_proj derives from weights_proj.weight, which the
#          update rewrites in place (its tensor version does not change).
# How:     When the check returns no error, dsa_indexer.drop_merged_weights_proj;
#          the next batch on one adapter merges from the new weight. A refused
#          update changes nothing.
# Upstream: sglang/srt/model_executor/model_runner_components/weight_updater.py::_unsupported_derived_weight_cache_error
# Removal: with dsa_indexer.merged_weights_proj.
def drop_merged_gates_on_weight_update(original, *args, **kwargs):
    error = original(*args, **kwargs)
    if error is None:
        dsa_indexer.drop_merged_weights_proj()
    return error


# What:    Wraps WeightUpdater.end_weight_update: the end of a weight-update
#          session drops every merged weights_proj.
# Why:     A session (begin_weight_update, external P2P/RDMA writes into the
#          weights, end_weight_update) rewrites weights_proj.weight without the
#          derived-cache check drop_merged_gates_on_weight_update hooks.
# How:     dsa_indexer.drop_merged_weights_proj after the session's
#          post-processing; a merged weight built during the session goes too.
# Upstream: sglang/srt/model_executor/model_runner_components/weight_updater.py::WeightUpdater.end_weight_update
# Removal: with dsa_indexer.merged_weights_proj.
def drop_merged_gates_after_weight_update_session(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    dsa_indexer.drop_merged_weights_proj()
    return result
