"""A partial patch set stops an Engine start on the GPU, naming the patch, before any
weights load; the default path (every patch applied) starts and serves.

The partial set is made as another plugin would make it: one of our targets is
already marked patched in sglang's HookRegistry before sglang's own
load_plugins() (inside Engine) runs sglang-graphfix's register(). sglang's loader
swallows what register() raises; the start-up guard must still stop the engine.
"""

import subprocess
import sys
import textwrap
import time

from engine_utils import run_engine, write_result
from models import prompts

HELD = (
    "sglang.srt.layers.attention.hybrid_linear_attn_backend."
    "MambaAttnBackendBase._replay_metadata"
)
ENGINE = dict(
    skip_tokenizer_init=True,
    mem_fraction_static=0.15,
    max_total_tokens=16384,
    max_mamba_cache_size=16,
    cuda_graph_max_bs_decode=4,
    log_level="warning",
)

_PARTIAL = textwrap.dedent(
    """
    import json, sys, time
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry._patched.add(sys.argv[1])  # another plugin holds this target
    import sglang

    t0 = time.monotonic()
    try:
        engine = sglang.Engine(model_path=sys.argv[2], **json.loads(sys.argv[3]))
    except Exception as exc:
        print("ENGINE REFUSED after %.1f s: %s: %s"
              % (time.monotonic() - t0, type(exc).__name__, " ".join(str(exc).split())),
              flush=True)
    else:
        print("ENGINE STARTED", flush=True)
        engine.shutdown()
    """
)


def test_partial_patch_set_stops_the_engine_naming_the_patch(qwen3_next_path):
    import json

    done = subprocess.run(
        [sys.executable, "-c", _PARTIAL, HELD, qwen3_next_path, json.dumps(ENGINE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    refused = [line for line in out.splitlines() if line.startswith("ENGINE REFUSED")]
    write_result(
        "plugin_partial_patch_set_refusal",
        {"held_target": HELD, "refusal": refused, "tail": out[-3000:]},
    )
    assert "ENGINE STARTED" not in out
    assert refused, out[-3000:]
    line = refused[0]
    assert "replay_metadata_requires_graph_state" in line or HELD in line, line
    assert "SGLANG_GRAPHFIX=0" in line, line
    # Refused at server-argument resolution: no weights were loaded.
    assert "Load weight begin" not in out


def test_default_engine_starts_and_serves(qwen3_next_path):
    start = time.monotonic()
    (batch,) = run_engine(
        {"model_path": qwen3_next_path, **ENGINE},
        [{"input_ids": prompts(7, [5, 40]), "max_new_tokens": 8}],
    )
    write_result(
        "plugin_default_engine_serves",
        {
            "seconds": time.monotonic() - start,
            "output_ids": [r["output_ids"] for r in batch],
        },
    )
    assert [len(r["output_ids"]) for r in batch] == [8, 8]
