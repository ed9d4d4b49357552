"""Run in a subprocess by test_prefill_graph_layer_scan.py: build sglang's own
model classes (meta device, one CPU rank on gloo) for the model directories on
argv and report, per directory, whether sglang's prefill graph setup keeps a
full prefill graph: capture_prefill_graph's layer scan
(compute_attention_and_moe_layers, then has_standard_gqa_for_all_local_layers
over every layer). Prints one JSON object {directory: kept}."""

import json
import sys

import meta_models  # first: it stubs what sglang's model modules import

from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import (
    has_standard_gqa_for_all_local_layers,
)
from sglang.srt.model_executor.model_runner_components.layer_setup import (
    compute_attention_and_moe_layers,
)
from sglang.srt.runtime_context import SpawnRanks, create_context, use_context
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.cli import simulated_gpu


def main(paths: list[str]) -> dict:
    kept = {}
    args = ServerArgs(model_path=paths[0], cuda_graph_backend_prefill="disabled")
    with simulated_gpu("h200"):
        context = create_context(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
        with use_context(context):
            meta_models.init_one_gloo_rank()
            for path in paths:
                _, model = meta_models.build_on_meta(path)
                layers = compute_attention_and_moe_layers(model.model)
                kept[path] = has_standard_gqa_for_all_local_layers(
                    attention_layer_count=sum(
                        layer is not None for layer in layers.attention_layers
                    ),
                    start_layer=0,
                    end_layer=len(model.model.layers),
                )
    return kept


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
