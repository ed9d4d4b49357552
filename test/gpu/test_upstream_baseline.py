"""The bug as upstream sglang 0.5.23 has it: the same tiny Qwen3-Next engine with
an explicit full prefill CUDA graph, started with sglang-graphfix excluded,
crashes during capture with "IndexError: list index out of range" in
MambaAttnBackendBase._replay_metadata.

The engine runs in a child process whose SGLANG_PLUGINS names only the test
probe, and the probe (GRAPHFIX_PROBE_UPSTREAM=1) neither registers
sglang-graphfix nor wraps anything: it only records, in every engine process,
that sglang-graphfix's hooks are absent. The test is xfail(strict=True) on that
IndexError: if upstream (or a leaked plugin) ever makes the engine serve, it
XPASSes and fails, and any other failure is reported as itself.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from engine_utils import (
    PROBE_PATH,
    chunk_256_engine_kwargs,
    probe_count,
    write_result,
)

CHILD = textwrap.dedent(
    """
    import json, sys

    if __name__ == "__main__":
        import sglang

        engine = sglang.Engine(**json.loads(sys.argv[1]))
        try:
            engine.generate(
                input_ids=[[5, 6, 7, 8]],
                sampling_params={"max_new_tokens": 2, "temperature": 0.0},
            )
        finally:
            engine.shutdown()
        print("BASELINE ENGINE SERVED", flush=True)
    """
)
SIGNATURE = ("IndexError: list index out of range", "_replay_metadata")


class UpstreamIndexError(Exception):
    """The reported crash, reproduced without sglang-graphfix."""


def _engine_kwargs(model_path):
    full = {"backend": "full", "bs": [16, 32], "full_prefill_max_req": 4}
    return {
        **chunk_256_engine_kwargs(model_path, full),
        "skip_tokenizer_init": True,
        # Triton GDN prefill, as with sglang-graphfix: upstream's FlashInfer
        # default would be a different (kernel-availability) failure.
        "linear_attn_prefill_backend": "triton",
    }


def _run_without_graphfix(model_path, tmp_path):
    script = tmp_path / "baseline_engine.py"
    script.write_text(CHILD)
    env = {
        **os.environ,
        "SGLANG_PLUGINS": "graphfix_test_probe",  # not "graphfix"
        "GRAPHFIX_PROBE_UPSTREAM": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(PROBE_PATH), os.environ.get("PYTHONPATH")) if p
        ),
    }
    env.pop("GRAPHFIX_PROBE_FAULT", None)
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(_engine_kwargs(model_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.xfail(
    strict=True,
    raises=UpstreamIndexError,
    reason="upstream sglang 0.5.23: full prefill CUDA graph on a GDN hybrid "
    "crashes at capture (IndexError in _replay_metadata)",
)
def test_upstream_full_prefill_graph_on_qwen3_next(qwen3_next_path, tmp_path):
    absent_before = probe_count("graphfix_absent")
    rc, output = _run_without_graphfix(qwen3_next_path, tmp_path)
    absent = probe_count("graphfix_absent") - absent_before
    present = probe_count("graphfix_present")
    crashed = all(s in output for s in SIGNATURE)
    write_result(
        "upstream_baseline_qwen3_next_full_prefill",
        {
            "returncode": rc,
            "reproduced_index_error": crashed,
            "processes_without_graphfix": absent,
            "processes_with_graphfix": present,
            "output_tail": output[-3000:],
        },
    )
    assert absent > 0 and present == 0, (
        f"sglang-graphfix was not excluded: {absent} processes without it, "
        f"{present} with it"
    )
    if "BASELINE ENGINE SERVED" in output:
        return  # strict xfail: serving means the bug is gone (or graphfix leaked)
    assert crashed, f"the baseline failed otherwise (rc={rc}):\n{output[-3000:]}"
    raise UpstreamIndexError("IndexError: list index out of range in _replay_metadata")
