"""Run in a subprocess by test_cuda_graph_setup.py: with sglang-graphfix
registered, resolve a full prefill graph for the model directory argv[1] (the
served model) as an H200 server would (flashinfer attention, bfloat16,
MAMBA2_LAYER_GAPS_CAPTURED on); then per case BUILT,SWITCH in argv[2:], build
sglang's own model class for BUILT (the model the graph is for; meta device, one
CPU rank on gloo) and run sglang's capture_prefill_graph on it with the switch
set to SWITCH ("on" / "off") and the GPU parts (the runner's graph capture, the
memory probe) stubbed. Prints one JSON object {case: whether
capture_prefill_graph built a prefill runner}."""

import json
import socket
import sys
import types
from unittest import mock

import torch

# sglang's RotaryEmbedding imports vllm's rope op off CUDA/HIP; on the meta
# device no forward runs, so a stand-in name is all it needs.
_ops = types.ModuleType("vllm._custom_ops")
_ops.rotary_embedding = None
sys.modules.setdefault("vllm", types.ModuleType("vllm")).__dict__["_custom_ops"] = _ops
sys.modules.setdefault("vllm._custom_ops", _ops)

# Under test/mutate_patches.py (GRAPHFIX_MUTATE set), importing it swaps the
# named hook for a pass-through before register(), as its pytest plugin does in
# the parent process; otherwise the import does nothing.
import mutate_patches  # noqa: E402, F401

import sglang_graphfix  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.distributed import parallel_state  # noqa: E402
from sglang.srt.model_executor.model_runner_components import (  # noqa: E402
    cuda_graph_setup,
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
from sglang_graphfix.srt import full_prefill_graph_capability as capability  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_runner(path: str):
    config = ModelConfig(path)
    cls, _ = ModelRegistry.resolve_model_cls(config.hf_config.architectures)
    with torch.device("meta"):
        model = cls(config=config.hf_config)
    return types.SimpleNamespace(
        is_draft_worker=False,
        lora_manager=None,
        spec_algorithm=types.SimpleNamespace(is_eagle=lambda: False),
        model=model,
        model_config=config,
        req_to_token_pool=types.SimpleNamespace(size=8),
        layer_info=types.SimpleNamespace(
            start_layer=0, end_layer=len(model.model.layers)
        ),
        get_cuda_graph_layers=compute_attention_and_moe_layers,
        device="cuda",
        gpu_id=0,
    )


def captures(served: str, cases: list[str]) -> dict:
    capability.MAMBA2_LAYER_GAPS_CAPTURED = True
    args = ServerArgs(
        model_path=served,
        cuda_graph_backend_prefill="full",
        attention_backend="flashinfer",
        dtype="bfloat16",
    )
    with simulated_gpu("h200"):
        context = create_context(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    built_runner = []
    kept = {}
    with (
        use_context(context),
        # The GPU parts: the runner's graph capture and the free-memory probe.
        mock.patch.object(
            cuda_graph_setup,
            "PrefillCudaGraphRunner",
            lambda mr: built_runner.append(mr),
        ),
        mock.patch.object(
            cuda_graph_setup, "get_available_gpu_memory", lambda *a: 80.0
        ),
    ):
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        )
        parallel_state.initialize_model_parallel(backend="gloo")
        for case in cases:
            built, switch = case.split(",")
            capability.MAMBA2_LAYER_GAPS_CAPTURED = switch == "on"
            built_runner.clear()
            cuda_graph_setup.capture_prefill_graph(
                model_runner=_model_runner(built), eager_runner=object()
            )
            kept[case] = bool(built_runner)
    return kept


if __name__ == "__main__":
    sglang_graphfix.register()
    print(json.dumps(captures(sys.argv[1], sys.argv[2:])))
