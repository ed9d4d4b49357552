"""On CPU (transformers, float32): whether the Mamba2 state carries weight in the
tiny checkpoints test_mamba2_full_prefill_graph.py's wrong-state control relies
on. Per checkpoint and prompt length, greedy decoding after the prefill with the
Mamba2 conv and SSM states as computed, then with them zeroed (what the faulted
decode reads): the first decode step at which the tokens split (None: never in
the steps) and how far the logprobs moved before it. A control can only fail
on a checkpoint where they split.

    python3 test/gpu/check_control_checkpoints.py [nemotron_h_mlp granite ...]
"""

import sys
import tempfile
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]

CHECKPOINTS = {
    "nemotron_h": lambda m, p: m.tiny_nemotron_h(p),
    "nemotron_h_mlp": lambda m, p: m.tiny_nemotron_h(p, "M-M*-"),
    "nemotron_h_moe": lambda m, p: m.tiny_nemotron_h(p, "M-M*E"),
    "nemotron_h_groups8": lambda m, p: m.tiny_nemotron_h(p, "M-M*-", groups=8),
    "falcon_h1": lambda m, p: m.tiny_falcon_h1(p),
    "granite": lambda m, p: m.tiny_granite_moe_hybrid(p),
    "lfm2": lambda m, p: m.tiny_lfm2(p),
}


def _mamba_states(cache) -> list:
    """The conv and recurrent state tensors of transformers' linear-attention
    cache layers."""
    states = []
    for layer in getattr(cache, "layers", []):
        for name in ("conv_states", "recurrent_states"):
            held = getattr(layer, name, None)
            if isinstance(held, dict):
                states += [t for t in held.values() if isinstance(t, torch.Tensor)]
    return states


def greedy(model, ids, steps: int, zero_states: bool):
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    if zero_states:
        states = _mamba_states(cache)
        assert states, f"no Mamba2 states in {type(cache).__name__}"
        for state in states:
            state.zero_()
    tokens, logprobs = [], []
    logits = out.logits[:, -1]
    for _ in range(steps):
        lp = torch.log_softmax(logits.float(), -1)
        token = lp.argmax(-1)
        tokens.append(int(token))
        logprobs.append(float(lp[0, token]))
        out = model(input_ids=token[:, None], past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
    return tokens, logprobs


def main(names) -> None:
    import models
    from transformers import AutoModelForCausalLM

    for name in names:
        path = Path(tempfile.mkdtemp(prefix=name))
        CHECKPOINTS[name](models, path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(0)
        for length in (7, 64, 255):
            ids = torch.randint(10, model.config.vocab_size, (1, length), generator=gen)
            with torch.no_grad():
                kept, zeroed = greedy(model, ids, 8, False), greedy(model, ids, 8, True)
            split = next(
                (i for i, (a, b) in enumerate(zip(kept[0], zeroed[0])) if a != b), None
            )
            moved = max(
                (abs(a - b) for a, b in list(zip(kept[1], zeroed[1]))[: split or 8]),
                default=0.0,
            )
            print(f"{name} {length} tokens: split at step {split}, logprobs moved "
                  f"{moved:.4f} before")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:] or ["nemotron_h_mlp", "granite"])
