# SPDX-License-Identifier: Apache-2.0
"""The prefill graph's layer scan and Mamba2 hybrids under a full prefill graph.

Fixes sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py:
capture_prefill_graph turns every prefill graph off for a model with a layer in
which it finds no attention module (has_standard_gqa_for_all_local_layers), a
rule the breakable and tc_piecewise graphs need (their split ops look a layer's
module up by its id) and a full graph does not (checked on an H200: NemotronH
with MLP layers and GraniteMoeHybrid, graph equal to eager).
"""

from __future__ import annotations

import logging

from sglang.srt.arg_groups.overrides import model_config_of
from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.runtime_context import get_context, get_exec
from sglang.srt.utils import log_info_on_rank0
from sglang_graphfix.srt import full_prefill_graph_capability as capability

logger = logging.getLogger(__name__)


# What:    Wraps has_standard_gqa_for_all_local_layers, capture_prefill_graph's
#          layer scan: under a full prefill graph, a Mamba2 hybrid's layers that
#          hold no attention module (NemotronH's MLP layers, GraniteMoeHybrid's
#          Mamba2 layers; not yet NemotronH's MoE layers) no longer turn the
#          graph off.
# Why:     The scan ("Disable prefill CUDA graph because some layers do not apply
#          Standard GQA") wants one attention module per layer because the
#          breakable and tc_piecewise graphs' split ops look a layer's module up
#          by its id. A full graph captures the model's forward whole and looks
#          none up (H200: graph equal to eager, see MAMBA2_LAYER_GAPS_CAPTURED):
#          NemotronH's Mamba layers
#          call their split op only inside those two graphs, Granite's call the
#          Mamba2 backend directly, MLP and MoE layers look nothing up. So every
#          published NemotronH and Granite 4.0 hybrid prefilled eagerly under any
#          prefill graph (issue 16).
# How:     Where upstream says no, say yes when the prefill graph is full, the
#          scan covers the whole model (no pipeline split) and the layers it found
#          no attention in are exactly those layer_gap counts for the served
#          model (it counts none with MAMBA2_LAYER_GAPS_CAPTURED off; the
#          capability model's verdict on the same facts let the full graph
#          through resolution). Otherwise upstream's no, with a warning where the
#          served model has such layers under a full graph (a pipeline split, or
#          a model other than the served one: speculative decoding, whose draft
#          would be another model, is already refused for Mamba2).
# Upstream: sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py::has_standard_gqa_for_all_local_layers
#          (to propose: capture_prefill_graph skips the scan for Backend.FULL)
# Removal: once capture_prefill_graph skips has_standard_gqa_for_all_local_layers
#          under a full prefill graph.
def keep_full_prefill_graph_across_mamba2_layer_gaps(
    original, *, attention_layer_count: int, start_layer: int, end_layer: int
):
    if original(
        attention_layer_count=attention_layer_count,
        start_layer=start_layer,
        end_layer=end_layer,
    ):
        return True
    if get_exec().graph.cuda_graph_config.prefill.backend != Backend.FULL:
        return False
    model_config = model_config_of(get_context().server_args)
    gap = capability.layer_gap(model_config)
    if gap is None or not gap.full_graph_layers:  # not a gap it covers, or switched off
        return False
    layers, gaps = gap
    whole_model = start_layer == 0 and end_layer == model_config.num_hidden_layers
    if not whole_model or end_layer - attention_layer_count != gaps:
        logger.warning(
            "Full prefill CUDA graph turned off by sglang's prefill graph setup: "
            "sglang-graphfix keeps it across %s only for the whole served model "
            "(layers %d-%d scanned, %d without attention; the served model has %d "
            "layers, %d of them without attention). Prefill runs eager.",
            layers,
            start_layer,
            end_layer,
            end_layer - start_layer - attention_layer_count,
            model_config.num_hidden_layers,
            gaps,
        )
        return False
    log_info_on_rank0(
        logger,
        f"Full prefill CUDA graph kept across {gaps} layer(s) without attention "
        f"({layers}), which sglang's prefill graph setup would turn it off for.",
    )
    return True
