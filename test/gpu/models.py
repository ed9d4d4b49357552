"""Tiny random checkpoints for the GPU tests: transformers' model classes with
their own init (a realistic weight scale, unlike sglang's load_format="dummy",
whose U(-1e-3, 1e-3) weights make every prompt produce the same token)."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tiny_configs import add_qwen3_next_layout, qwen3_next_config


def tiny_qwen3_next(path: Path) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_next_config(), dtype=torch.bfloat16)
    model.save_pretrained(path)
    add_qwen3_next_layout(path)
    return str(path)


def prompts(seed: int, lengths, vocab: int = 2048) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]
