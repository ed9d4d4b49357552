"""For the subprocess scripts beside it: sglang's own model classes built on the
meta device in one CPU process. Import it before any sglang model module: it
gives sglang's RotaryEmbedding the vllm rope op name it imports off CUDA/HIP (no
forward runs on the meta device, so a stand-in name is all it needs)."""

import socket
import sys
import types

import torch

_ops = types.ModuleType("vllm._custom_ops")
_ops.rotary_embedding = None
sys.modules.setdefault("vllm", types.ModuleType("vllm")).__dict__["_custom_ops"] = _ops
sys.modules.setdefault("vllm._custom_ops", _ops)


def init_one_gloo_rank() -> None:
    """One CPU rank's process groups, in the active runtime context."""
    from sglang.srt.distributed import parallel_state

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parallel_state.init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    parallel_state.initialize_model_parallel(backend="gloo")


def build_on_meta(path: str, quantized: bool = False):
    """(sglang's ModelConfig, sglang's model class built from it on meta);
    ``quantized``: with the quantization config sglang's loader reads from the
    model directory, as a server builds it."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.models.registry import ModelRegistry

    config = ModelConfig(path)
    cls, _ = ModelRegistry.resolve_model_cls(config.hf_config.architectures)
    kwargs = {}
    if quantized:
        load = LoadConfig(load_format="dummy")
        kwargs["quant_config"] = _get_quantization_config(config, load)
    with torch.device("meta"):
        return config, cls(config=config.hf_config, **kwargs)
