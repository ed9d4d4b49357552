"""Run in a subprocess by test_prefill_graph_layer_scan.py: build sglang's own
model classes (meta device, one CPU rank on gloo) for the model directories on
argv and report, per directory, whether sglang's prefill graph setup keeps a
full prefill graph: capture_prefill_graph's layer scan
(compute_attention_and_moe_layers, then has_standard_gqa_for_all_local_layers
over every layer). Prints one JSON object {directory: kept}."""

import json
import socket
import sys
import types

import torch

# sglang's RotaryEmbedding imports vllm's rope op off CUDA/HIP; on the meta
# device no forward runs, so a stand-in name is all it needs.
_ops = types.ModuleType("vllm._custom_ops")
_ops.rotary_embedding = None
sys.modules.setdefault("vllm", types.ModuleType("vllm")).__dict__["_custom_ops"] = _ops
sys.modules.setdefault("vllm._custom_ops", _ops)

from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.distributed import parallel_state  # noqa: E402
from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import (  # noqa: E402
    has_standard_gqa_for_all_local_layers,
)
from sglang.srt.model_executor.model_runner_components.layer_setup import (  # noqa: E402
    compute_attention_and_moe_layers,
)
from sglang.srt.models.registry import ModelRegistry  # noqa: E402
from sglang.srt.runtime_context import (  # noqa: E402
    SpawnRanks,
    create_context,
    use_context,
)
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang_graphfix.cli import simulated_gpu  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(paths: list[str]) -> dict:
    kept = {}
    args = ServerArgs(model_path=paths[0], cuda_graph_backend_prefill="disabled")
    with simulated_gpu("h200"):
        context = create_context(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
        with use_context(context):
            parallel_state.init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                backend="gloo",
                distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            )
            parallel_state.initialize_model_parallel(backend="gloo")
            for path in paths:
                config = ModelConfig(path).hf_config
                cls, _ = ModelRegistry.resolve_model_cls(config.architectures)
                with torch.device("meta"):
                    model = cls(config=config)
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
