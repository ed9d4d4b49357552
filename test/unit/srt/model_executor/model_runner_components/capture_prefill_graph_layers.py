"""Run in a subprocess by test_cuda_graph_setup.py: with sglang-graphfix
registered, resolve the prefill graph argv[2] ("full" / "breakable") for the
model directory argv[1] (the served model) as an H200 server would (flashinfer
attention, bfloat16, MAMBA2_LAYER_GAPS_CAPTURED on); then per case
BUILT,SWITCH[,START] in argv[3:], build sglang's own model class for BUILT (the
model the graph is for; meta device, one CPU rank on gloo) and run sglang's
capture_prefill_graph on it (its layers from START on, default 0, as a later
pipeline stage scans them) with the switch set to SWITCH ("on" / "off") and the
GPU parts (the runner's graph capture, the memory probe) stubbed. Prints one
JSON object {case: whether capture_prefill_graph reached the prefill runner's
construction}."""

import json
import sys
import types
from unittest import mock

import meta_models  # first: it stubs what sglang's model modules import

# Under test/mutate_patches.py (GRAPHFIX_MUTATE set), importing it swaps the
# named hook for a pass-through before register(), as its pytest plugin does in
# the parent process; otherwise the import does nothing.
import mutate_patches  # noqa: F401

import sglang_graphfix
from sglang.srt.model_executor.model_runner_components import cuda_graph_setup
from sglang.srt.model_executor.model_runner_components.layer_setup import (
    compute_attention_and_moe_layers,
)
from sglang.srt.runtime_context import SpawnRanks, create_context, use_context
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.cli import simulated_gpu
from sglang_graphfix.srt import full_prefill_graph_capability as capability


def _model_runner(path: str, start_layer: int):
    config, model = meta_models.build_on_meta(path)
    return types.SimpleNamespace(
        is_draft_worker=False,
        lora_manager=None,
        spec_algorithm=types.SimpleNamespace(is_eagle=lambda: False),
        model=model,
        model_config=config,
        req_to_token_pool=types.SimpleNamespace(size=8),
        layer_info=types.SimpleNamespace(
            start_layer=start_layer, end_layer=len(model.model.layers)
        ),
        get_cuda_graph_layers=compute_attention_and_moe_layers,
        device="cuda",
        gpu_id=0,
    )


def captures(served: str, backend: str, cases: list[str]) -> dict:
    capability.MAMBA2_LAYER_GAPS_CAPTURED = True
    args = ServerArgs(
        model_path=served,
        cuda_graph_backend_prefill=backend,
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
        meta_models.init_one_gloo_rank()
        for case in cases:
            built, switch, *start = case.split(",")
            capability.MAMBA2_LAYER_GAPS_CAPTURED = switch == "on"
            built_runner.clear()
            runner = _model_runner(built, int(start[0]) if start else 0)
            cuda_graph_setup.capture_prefill_graph(
                model_runner=runner, eager_runner=object()
            )
            kept[case] = bool(built_runner)
    return kept


if __name__ == "__main__":
    sglang_graphfix.register()
    print(json.dumps(captures(sys.argv[1], sys.argv[2], sys.argv[3:])))
