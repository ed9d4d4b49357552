"""Tiny config.json files for one model of each hybrid linear-attention family,
built with transformers' or sglang's own config classes (sglang's where its
loader rejects transformers' field names)."""

from __future__ import annotations

import json
from pathlib import Path

# The tiny GDN hybrids' dimensions: 3 GDN layers + 1 full-attention layer; GDN
# heads of 128 so sglang's FlashInfer GDN-prefill default applies on Hopper.
_TINY_GDN = dict(
    vocab_size=2048,
    hidden_size=256,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=128,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    max_position_embeddings=4096,
)


def qwen3_next_config(**overrides):
    """GDN hybrid (Qwen3-Next) of the tiny GDN dimensions; ``overrides`` replace
    them."""
    from transformers import Qwen3NextConfig

    dims = {**_TINY_GDN, "intermediate_size": 512}
    config = Qwen3NextConfig(**{**dims, **overrides})
    config.architectures = ["Qwen3NextForCausalLM"]
    return config


def qwen3_5_moe_config():
    """GDN hybrid (Qwen3.5 MoE, the text model sglang serves as
    Qwen3_5MoeForCausalLM) of the tiny GDN dimensions; save it, then
    add_qwen3_next_layout."""
    from transformers import Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(**_TINY_GDN, dtype="bfloat16")
    config.architectures = ["Qwen3_5MoeForCausalLM"]
    return config


def _nemotron_h(**overrides):
    """sglang's class (transformers 5.19 writes layer types sglang's rejects).
    ``overrides`` replace these fields."""
    from sglang.srt.configs.nemotron_h import NemotronHConfig

    dims = dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        hybrid_override_pattern="M*M-",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        mamba_num_heads=8,
        mamba_head_dim=32,
        ssm_state_size=16,
        n_groups=1,
    )
    return NemotronHConfig(**{**dims, **overrides})


def _falcon_h1():
    from sglang.srt.configs import FalconH1Config

    return FalconH1Config(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=256,
        mamba_n_heads=8,
        mamba_d_head=32,
        mamba_n_groups=1,
        mamba_d_state=16,
    )


def _lfm2():
    from sglang.srt.configs import Lfm2Config

    return Lfm2Config(
        vocab_size=2048,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention"],
    )


def _kimi_linear():
    from sglang.srt.configs import KimiLinearConfig

    return KimiLinearConfig(
        vocab_size=2048,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_experts=4,
        num_experts_per_token=2,
        moe_intermediate_size=128,
        kv_lora_rank=128,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        linear_attn_config={
            "kda_layers": [1],
            "full_attn_layers": [2],
            "head_dim": 64,
            "num_heads": 4,
            "short_conv_kernel_size": 4,
        },
    )


def _granite_moe_hybrid():
    """transformers' class: it writes the layer types transformers 5.19 validates
    ("linear_attention" / "full_attention"), which sglang's own config maps back
    to "mamba" / "attention" (sglang's class writes names transformers rejects)."""
    from transformers import GraniteMoeHybridConfig

    return GraniteMoeHybridConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=256,
        mamba_n_heads=8,
        mamba_d_head=64,
        mamba_d_state=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def _inkling():
    """Inkling: every layer attention with short convs (sglang's own config; one
    sliding-window layer, no MTP head)."""
    from sglang.srt.configs.inkling import InklingMMConfig

    return InklingMMConfig(
        text_config=dict(
            vocab_size=2048,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            local_layer_ids=[0],
            sliding_window_size=64,
            use_sconv=True,
            num_nextn_predict_layers=0,
        )
    )


def _llama():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


# family -> (config factory, architecture, linear-attention family sglang builds)
FAMILIES = {
    "qwen3_next": (qwen3_next_config, "Qwen3NextForCausalLM", "GDN"),
    "nemotron_h": (_nemotron_h, "NemotronHForCausalLM", "Mamba2/short-conv"),
    "falcon_h1": (_falcon_h1, "FalconH1ForCausalLM", "Mamba2/short-conv"),
    "lfm2": (_lfm2, "Lfm2ForCausalLM", "Mamba2/short-conv"),
    "granite_moe_hybrid": (
        _granite_moe_hybrid,
        "GraniteMoeHybridForCausalLM",
        "Mamba2/short-conv",
    ),
    "kimi_linear": (_kimi_linear, "KimiLinearForCausalLM", "KDA"),
    "inkling": (_inkling, "InklingForConditionalGeneration", "Inkling short-conv"),
    "llama": (_llama, "LlamaForCausalLM", None),
}


def write_config(family: str, path: Path) -> str:
    factory, arch, _ = FAMILIES[family]
    config = factory()
    config.architectures = [arch]
    config.save_pretrained(path)
    if family == "qwen3_next":
        add_qwen3_next_layout(path)
    return str(path)


def _qwen_gdn_layers(layers: int) -> dict:
    """The layer dimensions Qwen3-Next-80B-A3B and Qwen3.5-35B-A3B publish alike:
    hidden 2048, ``layers`` deep (a multiple of 4: three GDN layers, then one
    attention layer), 16/32 GDN heads of 128, attention 16/2 heads of 256, experts
    and a shared expert of 512; bfloat16 as published (without a config dtype
    sglang's "auto" serves float16)."""
    return dict(
        hidden_size=2048,
        num_hidden_layers=layers,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        dtype="bfloat16",
    )


def qwen3_next_80b_a3b_config(layers: int = 48, max_position_embeddings: int = 4096):
    """Qwen3-Next-80B-A3B's published dimensions (_qwen_gdn_layers, 512 experts
    top-10, vocab 151936). For speed runs with dummy weights; save it, then
    add_qwen3_next_layout."""
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(
        **_qwen_gdn_layers(layers),
        vocab_size=151936,
        intermediate_size=5120,
        partial_rotary_factor=0.25,
        num_experts=512,
        num_experts_per_tok=10,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000000.0,
    )
    config.architectures = ["Qwen3NextForCausalLM"]
    return config


def qwen3_5_35b_a3b_config(layers: int = 40, max_position_embeddings: int = 4096):
    """Qwen3.5-35B-A3B's published text dimensions (_qwen_gdn_layers, 256 experts
    top-8, a quarter of each attention head rotated, vocab 248320), as the
    text-only Qwen3_5MoeForCausalLM sglang serves. For speed runs with dummy
    weights; save it, then add_qwen3_next_layout (sglang's config class reads the
    same layout)."""
    from transformers import Qwen3_5MoeTextConfig

    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
    config = Qwen3_5MoeTextConfig(
        **_qwen_gdn_layers(layers),
        vocab_size=248320,
        num_experts=256,
        num_experts_per_tok=8,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope,
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3_5MoeForCausalLM"]
    # sglang's config class reads the rotary base from its own field.
    config.rope_theta = rope["rope_theta"]
    return config


def add_qwen3_next_layout(path: Path) -> None:
    """sglang's Qwen3NextConfig places the full-attention layers from
    ``full_attention_interval``, which transformers does not write."""
    config_file = Path(path) / "config.json"
    fields = json.loads(config_file.read_text())
    fields["full_attention_interval"] = 4
    config_file.write_text(json.dumps(fields, indent=2))
