"""Tiny random checkpoints for the GPU tests: transformers' model classes with
their own init (a realistic weight scale, unlike sglang's load_format="dummy",
whose U(-1e-3, 1e-3) weights make every prompt produce the same token)."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tiny_configs import add_qwen3_next_layout, qwen3_5_moe_config, qwen3_next_config


def _tiny_gdn(path: Path, config) -> str:
    """A tiny random GDN hybrid of ``config`` (tiny_configs.py's), saved."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    add_qwen3_next_layout(path)
    return str(path)


def tiny_qwen3_next(path: Path) -> str:
    return _tiny_gdn(path, qwen3_next_config())


def tiny_qwen3_5_moe(path: Path) -> str:
    return _tiny_gdn(path, qwen3_5_moe_config())


def prompts(seed: int, lengths, vocab: int = 2048) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def chunk_256_batches() -> list:
    """The batches the hybrid full-prefill-graph engine tests run, with chunked
    prefill and the largest token bucket at 256 and 4 request slots (GDN and
    Mamba2 alike): several requests incl. a 1-token one; around the 256
    boundary (255, 256, 257 = one chunk + 1); a 1000-token prompt (4 chunks that
    continue the linear state); prefix hits on both (the radix cache restores
    states tracked above); a full set of slots; one prompt of one token (below
    the smallest bucket: it replays that bucket); the 257-token prompt again (a
    prefix hit that leaves one token to extend). 8 new tokens each."""
    long, p257 = prompts(0, [1000, 257])
    inputs = [
        prompts(1, [1, 7, 64]),
        prompts(2, [255]),
        prompts(3, [256]),
        [p257],
        [long],
        [long[:512] + prompts(4, [40])[0], p257[:256] + prompts(5, [9])[0]],
        prompts(6, [5, 17, 33, 90]),
        prompts(7, [1]),
        [p257],
    ]
    return [{"input_ids": ids, "max_new_tokens": 8} for ids in inputs]


def one_token_batches(batches: list) -> list:
    """Indices of the batches of a single one-token prompt."""
    return [i for i, b in enumerate(batches) if [len(p) for p in b["input_ids"]] == [1]]


def tiny_kimi_linear(path: Path) -> str:
    """KDA hybrid (Kimi-Linear layout): 3 KDA layers (2 heads of 128, as in the
    real model) + 1 MLA layer with DeepSeek's MLA dims, a dense first layer, then
    MoE. Weights from transformers' KimiLinearForCausalLM (save_pretrained writes
    the original checkpoint layout, which sglang loads); config.json from
    sglang's KimiLinearConfig (the linear_attn_config layout sglang reads)."""
    from transformers import AutoModelForCausalLM
    from transformers import KimiLinearConfig as HFKimiLinearConfig

    from sglang.srt.configs import KimiLinearConfig

    dims = dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_experts=4,
        num_expert_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kda = {"head_dim": 128, "num_heads": 2, "short_conv_kernel_size": 4}
    hf = HFKimiLinearConfig(
        **dims,
        num_local_experts=dims["num_experts"],
        num_experts_per_tok=2,
        n_shared_experts=1,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        mlp_layer_types=["dense"] + ["sparse"] * 3,
        linear_head_dim=kda["head_dim"],
        linear_num_heads=kda["num_heads"],
        linear_conv_kernel_dim=kda["short_conv_kernel_size"],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16)
    model.save_pretrained(path)
    _dense_mlp_names(Path(path) / "model.safetensors", dense_layers=[0])
    config = KimiLinearConfig(
        **dims,
        num_experts_per_token=2,
        num_shared_experts=1,
        first_k_dense_replace=1,
        mla_use_nope=True,
        linear_attn_config={**kda, "kda_layers": [1, 2, 3], "full_attn_layers": [4]},
    )
    config.architectures = ["KimiLinearForCausalLM"]
    config.save_pretrained(path)  # replaces transformers' config.json
    return str(path)


def _dense_mlp_names(weights: Path, dense_layers) -> None:
    """transformers' save renames every ``.mlp.`` to the checkpoint's MoE name
    ``.block_sparse_moe.``, the dense layers' MLPs too; the original checkpoint
    (and sglang's loader) keeps those under ``.mlp.``."""
    from safetensors.torch import load_file, save_file

    state = load_file(weights)
    for layer in dense_layers:
        moe, mlp = f".layers.{layer}.block_sparse_moe.", f".layers.{layer}.mlp."
        state = {k.replace(moe, mlp): v for k, v in state.items()}
    save_file(state, weights, metadata={"format": "pt"})


def tiny_llama(path: Path, seed: int = 0) -> str:
    """Llama (no linear attention): tiny_configs' 2-layer config, transformers'
    LlamaForCausalLM weights from ``seed``."""
    from tiny_configs import FAMILIES
    from transformers import AutoModelForCausalLM

    config = FAMILIES["llama"][0]()
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    return str(path)


def qwen3_next_1024(path: Path) -> str:
    """A Qwen3-Next layout at hidden 1024 and 8 layers (two of GDN x3 + full
    attention), GDN heads of 128 (4 key, 8 value: the real model's 1:2), 16
    experts top-4; transformers' own init, so prompts have real logit spreads."""
    from transformers import AutoModelForCausalLM

    config = qwen3_next_config(
        hidden_size=1024,
        intermediate_size=2048,
        num_hidden_layers=8,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2,
        num_attention_heads=8,
        num_key_value_heads=2,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    add_qwen3_next_layout(path)
    return str(path)


# Mamba2 hybrids (issue 16): transformers' model classes write the weights in
# the original checkpoint layout, which sglang's load_weights reads (NemotronH
# "backbone.*", A_log -> A; Falcon-H1 "model.layers.N.{mamba,self_attn,
# feed_forward}"; GraniteMoeHybrid's input_linear/output_linear experts).


NEMOTRON_H_PATTERN = "M*M"


# The MoE layers of tiny NemotronH checkpoints with 'E' in their pattern: small
# experts (NemotronH's defaults are 7688 wide), the rest of NemotronH's MoE
# defaults (sigmoid routing, one group).
NEMOTRON_H_MOE = dict(
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
    moe_shared_expert_intermediate_size=256,
)


def tiny_nemotron_h(
    path: Path, pattern: str = NEMOTRON_H_PATTERN, groups: int = 1
) -> str:
    """NemotronH "M*M": Mamba2, attention, Mamba2 (``pattern`` for another). No MLP
    ('-') or MoE ('E') layer by default: sglang's prefill graph setup finds no
    attention module in those and captures no prefill graph at all
    (full_prefill_graph_capability's layer scan) unless the scan's hook keeps it
    (MAMBA2_LAYER_GAPS_CAPTURED). Mamba2 with 8 heads of 32, one group, state 16
    (``groups`` > 1: 2 heads per group, as NemotronH's published checkpoints
    share each group's B and C among 16 heads of their 8 groups). Weights from
    transformers' NemotronHForCausalLM; config.json from sglang's NemotronHConfig
    (transformers 5.19 writes layer types "linear_attention" / "full_attention",
    which sglang's config rejects), with mamba_n_groups = n_groups: sglang's
    mixer reads mamba_n_groups (default 8), its cache shape n_groups; and with
    the weights' dtype: without one sglang's dtype "auto" serves float16 while
    the Mamba2 conv state pool stays bfloat16 (SGLANG_MAMBA_CONV_DTYPE), and the
    extend's conv snapshot fails ("Index put requires the source and destination
    dtypes match")."""
    import transformers
    from tiny_configs import _nemotron_h
    from transformers import AutoModelForCausalLM

    moe = NEMOTRON_H_MOE if "E" in pattern else {}
    heads = {} if groups == 1 else {"mamba_num_heads": 2 * groups}
    config = _nemotron_h(
        hybrid_override_pattern=pattern,
        mamba_n_groups=groups,
        n_groups=groups,
        **heads,
        **moe,
    )
    config.architectures = ["NemotronHForCausalLM"]
    config.dtype = torch.bfloat16
    hf = transformers.NemotronHConfig(
        **moe,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        hybrid_override_pattern=pattern,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        mamba_num_heads=config.mamba_num_heads,
        mamba_head_dim=config.mamba_head_dim,
        ssm_state_size=config.ssm_state_size,
        n_groups=config.n_groups,
        conv_kernel=config.conv_kernel,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16)
    model.save_pretrained(path)
    config.save_pretrained(path)  # replaces transformers' config.json
    return str(path)


def tiny_falcon_h1(path: Path) -> str:
    """Falcon-H1 (tiny_configs' dimensions: 2 layers, each attention + Mamba2 in
    parallel, 8 Mamba2 heads of 32) in transformers' FalconH1Config, which
    FalconH1ForCausalLM needs (sglang's class lacks time_step_limit) and
    sglang's loader reads; transformers' weights.

    With the Mamba2 block's gated RMSNorm (mamba_rms_norm; gate before norm, the
    only order sglang's MambaMixer2 has), as NemotronH's and Granite's mixers and
    mamba_ssm's Mamba2 have it. Without it, transformers' init leaves the Mamba2
    branch ~70x smaller than the attention branch (output norms 0.005 vs 0.35):
    zeroing it moved greedy logprobs by < 0.02, under the tests' tolerance, so a
    wrong Mamba2 state could not show (docs/mamba2_full_prefill_graph.md)."""
    import transformers
    from tiny_configs import FAMILIES
    from transformers import AutoModelForCausalLM

    dims = FAMILIES["falcon_h1"][0]()
    config = transformers.FalconH1Config(
        **{
            key: getattr(dims, key)
            for key in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "mamba_d_ssm",
                "mamba_n_heads",
                "mamba_d_head",
                "mamba_n_groups",
                "mamba_d_state",
            )
        },
        mamba_rms_norm=True,
        mamba_norm_before_gate=False,
    )
    config.architectures = ["FalconH1ForCausalLM"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    return str(path)


def tiny_granite_moe_hybrid(path: Path) -> str:
    """GraniteMoeHybrid (tiny_configs: Mamba2 layer then attention layer, 4
    experts top-2 + shared MLP, 8 Mamba2 heads of 64); transformers' weights."""
    from tiny_configs import FAMILIES
    from transformers import AutoModelForCausalLM

    config = FAMILIES["granite_moe_hybrid"][0]()
    config.architectures = ["GraniteMoeHybridForCausalLM"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    return str(path)


def tiny_lfm2(path: Path) -> str:
    """LFM2 (short-conv layers, conv cache of 3, around attention: "conv",
    "full_attention", "conv", "conv"; hidden 256, 4 / 2 heads of 64) in
    transformers' Lfm2Config, with its weights; bfloat16, as the full graph's
    Mamba2/short-conv family is checked. Weights drawn at 1/sqrt(hidden) (0.0625,
    a 256-wide layer's fan-in scale): at transformers' default 0.02, zeroing the
    conv states after the prefill moved greedy logprobs by < 0.01 and never split
    the tokens (test/gpu/check_control_checkpoints.py lfm2), under the tests'
    tolerance, so a wrong conv state could not show; at 0.0625 it splits them at
    the first or second decode step for 7, 64 and 255 tokens."""
    import transformers
    from transformers import AutoModelForCausalLM

    config = transformers.Lfm2Config(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv", "conv"],
        conv_L_cache=3,
        max_position_embeddings=4096,
        initializer_range=256**-0.5,
    )
    config.architectures = ["Lfm2ForCausalLM"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    return str(path)
