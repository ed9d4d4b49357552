"""Run in a subprocess by test_serving_prefill_graph.py: write a serving model of
benchmark/serving_prefill_graph.py (argv: its name, a directory, its depth),
build sglang's own model class for it on the meta device (one CPU rank on gloo,
a simulated H100) with the quantization config sglang's loader reads from it
(meta_models.build_on_meta), and print one JSON object: its parameters' bytes
per dtype."""

import json
import sys
from pathlib import Path

import meta_models  # first: it stubs what sglang's model modules import
import torch
from benchmark_modules import load_benchmark

from sglang.srt.runtime_context import SpawnRanks, create_context, use_context
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.cli import simulated_gpu


def main(model: str, path: Path, layers: int) -> dict:
    load_benchmark("serving_prefill_graph").MODELS[model](path, layers=layers)
    # As sglang's loader builds a bfloat16 model.
    torch.set_default_dtype(torch.bfloat16)
    args = ServerArgs(model_path=str(path), cuda_graph_backend_prefill="disabled")
    with simulated_gpu("h100"):
        context = create_context(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
        with use_context(context):
            meta_models.init_one_gloo_rank()
            _, built = meta_models.build_on_meta(str(path), quantized=True)
    sizes = {}
    for tensor in built.parameters():
        key = str(tensor.dtype)
        sizes[key] = sizes.get(key, 0) + tensor.numel() * tensor.element_size()
    return sizes


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))))
