"""A tiny random DeepSeek-V3.2 (DSA) checkpoint and LoRA adapters on its indexer
``weights_proj`` (and attention projections), for the GPU tests.

The checkpoint is transformers' own DeepseekV32ForCausalLM with its own init (a
realistic weight scale, unlike sglang's load_format="dummy"). Shapes are the
smallest that keep sglang 0.5.23 on its default Hopper DSA kernels with a bf16
KV cache (prefill flashmla_sparse, decode fa3, DeepGEMM fp8 MQA logits for the
indexer, sgl-kernel top-k):

* kv_lora_rank 512, qk_rope_head_dim 64: DeepSeek-V3.2's absorbed-MLA layout
  (576-wide q/k, 512-wide v) that both DSA kernels are built for; FlashMLA's
  sparse prefill takes d_v = 512 only (flash_mla_interface.py,
  flash_mla_sparse_fwd). qk_nope_head_dim / v_head_dim 128 as in V3.2.
* num_attention_heads 16: FlashMLA sparse needs 64 query heads on Hopper; sglang
  zero-pads any head count dividing 64 (dsa_backend.py, "FlashMLA sparse kernel
  requires num_heads to be a multiple of 64"), as for DeepSeek-V3.2 at TP8.
* index_n_heads 64, index_head_dim 128: DeepSeek-V3.2's own; act_quant
  quantizes the indexer query in 128-wide blocks and the Hadamard rotation needs
  a power-of-two head dim (dsa_indexer.py, rotate_activation). DeepGEMM would
  pad fewer than 32 heads.
* index_topk 2048, not smaller: with a bf16 KV cache the prefill top-k is the
  PAGED transform with row starts, which only sgl-kernel's
  fast_topk_transform_fused serves on CUDA, and it asserts topk == 2048
  (sgl_kernel/top_k.py; dsa_topk_backend.py routes only decode and the fp8
  RAGGED prefill to the any-k v2 kernel). Prompts must therefore be longer than
  2048 tokens for the indexer's selection to matter (sglang skips the logits
  when every sequence fits in index_topk).
* All layers dense (first_k_dense_replace = num_hidden_layers): the fix is in
  attention; no MoE weights, runner or expert layout is involved.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch

VOCAB = 1024
NUM_LAYERS = 2
HIDDEN = 256
INDEX_N_HEADS = 64
INDEX_TOPK = 2048
CONTEXT = 16384
# A random model's next-token distribution is nearly flat (top-2 logprob gaps of
# ~0.03), so greedy decoding would split on rounding noise. Scaling the output
# embedding sharpens it (chosen-token logprob ~ -3.4, a trained LM's range)
# without touching anything the indexer or attention computes.
LM_HEAD_SCALE = 5.0


def dsa_config():
    from transformers import DeepseekV32Config

    config = DeepseekV32Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=512,
        num_hidden_layers=NUM_LAYERS,
        first_k_dense_replace=NUM_LAYERS,  # every layer dense
        moe_layer_freq=1,  # as in DeepSeek-V3.2's config.json
        n_routed_experts=8,  # unused (no MoE layer), kept small and valid
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        n_group=1,
        topk_group=1,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=256,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        index_n_heads=INDEX_N_HEADS,
        index_head_dim=128,
        index_topk=INDEX_TOPK,
        max_position_embeddings=CONTEXT,
    )
    config.architectures = ["DeepseekV32ForCausalLM"]
    return config


def build_tiny_dsa_model(path) -> str:
    """Write the random bf16 checkpoint (config.json + model.safetensors) to path."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(dsa_config(), dtype=torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    model.save_pretrained(path)
    return str(path)


# Attention projections an adapter may also target (module -> (in, out) from
# the config), in sglang's DeepSeek attention under the same names.
def _attention_shapes(config: dict) -> dict:
    heads = config["num_attention_heads"]
    qk_head_dim = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    return {
        "q_b_proj": (config["q_lora_rank"], heads * qk_head_dim),
        "o_proj": (heads * config["v_head_dim"], config["hidden_size"]),
    }


def lora_key(layer: int, module: str, matrix: str) -> str:
    """PEFT's tensor name for the adapter on layer's self_attn.<module>."""
    return f"base_model.model.model.layers.{layer}.self_attn.{module}.{matrix}.weight"


def build_lora_adapter(
    model_dir,
    adapter_dir,
    *,
    rank: int = 8,
    seed: int = 1234,
    scale: float = 1.0,
    attention_scale: float | None = None,
) -> str:
    """Write a PEFT-format LoRA adapter (without peft: adapter_config.json +
    adapter_model.safetensors) on every layer's indexer.weights_proj and, with
    attention_scale, also on the attention projections q_b_proj and o_proj.

    lora_A ~ N(0, 1/in), so A·x ~ N(0, 1) per rank for a unit-RMS input (the
    RMS-normalized hidden state the indexer reads); lora_B ~ N(0, scale^2) and
    scaling lora_alpha / r = 1. Per head the weights_proj delta has std
    ~ scale * sqrt(rank) (2.8 at rank 8) against ~ 0.02 * sqrt(hidden) = 0.32 for
    the base gate, so the adapter decides which tokens the indexer keeps. The
    attention deltas (attention_scale * sqrt(rank)) are kept at a fraction of
    their base projections' 0.32.
    """
    from safetensors.torch import save_file

    config = json.loads((Path(model_dir) / "config.json").read_text())
    shapes = {"indexer.weights_proj": (config["hidden_size"], config["index_n_heads"])}
    scales = {"indexer.weights_proj": scale}
    if attention_scale is not None:
        for module, shape in _attention_shapes(config).items():
            shapes[module], scales[module] = shape, attention_scale
    adapter_dir = Path(adapter_dir)
    adapter_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in shapes.items():
            a = torch.randn(rank, fan_in, generator=gen) / math.sqrt(fan_in)
            b = torch.randn(fan_out, rank, generator=gen) * scales[module]
            tensors[lora_key(layer, module, "lora_A")] = a.bfloat16().contiguous()
            tensors[lora_key(layer, module, "lora_B")] = b.bfloat16().contiguous()
    save_file(tensors, str(adapter_dir / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        # sglang normalizes the leaf name weights_proj to "indexer.weights_proj".
        "target_modules": [module.rsplit(".", 1)[-1] for module in shapes],
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
    (adapter_dir / "adapter_config.json").write_text(
        json.dumps(adapter_config, indent=2) + "\n"
    )
    return str(adapter_dir)


def dsa_prompts(seed: int, lengths) -> list:
    """Random token ids, clear of the bos/eos ids 0 and 1."""
    rng = random.Random(seed)
    return [[rng.randrange(2, VOCAB) for _ in range(n)] for n in lengths]
