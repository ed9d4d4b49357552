"""benchmark/serving_prefill_graph.py's model: the config sglang is served with
resolves as the published Qwen3-Next-80B-A3B-FP8 checkpoint does (sglang's own
ModelConfig dtype and quantization resolution, on CPU)."""

import torch
from benchmark_modules import load_benchmark
from transformers import AutoConfig

from sglang.srt.configs.model_config import _get_and_verify_dtype


def test_served_model_is_bfloat16_with_fp8_blocks(tmp_path):
    """Without a config dtype sglang's "auto" serves float16, which is not the
    published model and crashed sglang's breakable prefill graph on the mamba
    track copy (bf16 conv state, fp16 activations)."""
    bench = load_benchmark("serving_prefill_graph")
    bench.qwen3_next_80b_a3b_fp8(tmp_path, layers=4)
    config = AutoConfig.from_pretrained(tmp_path)
    assert _get_and_verify_dtype(config, "auto") == torch.bfloat16
    assert config.quantization_config["weight_block_size"] == [128, 128]
    assert config.num_hidden_layers == 4 and config.full_attention_interval == 4
