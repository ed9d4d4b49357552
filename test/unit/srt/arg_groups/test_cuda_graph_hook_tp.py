"""The prefill CUDA-graph plan under tensor parallelism and DP attention: the real
``ServerArgs.resolve_once`` pipeline with --tp-size 2 (and --enable-dp-attention
--dp-size 2), hardware probes answered as on an H200 (resolution reads no GPU
count). sglang-graphfix's verdict depends on the model, the attention backend and
the linear-attention kernel, not on the parallel layout: every plan must equal
the single-GPU plan, and for a model without linear attention (Llama) the plan
sglang resolves without sglang-graphfix."""

import pytest
from tiny_configs import write_config

from sglang.srt.arg_groups import cuda_graph_hook as upstream
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.cli import simulated_gpu
from sglang_graphfix.patches import PATCHES

FAMILIES = ("qwen3_next", "kimi_linear", "llama")
PARALLEL = {
    "tp1": {},
    "tp2": {"tp_size": 2},
    "tp2-dp-attention2": {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True},
}
# How the prefill graph is asked for -> the plan on every layout, or the flag the
# refusal names (the full graph on an attention backend that cannot capture it).
REQUESTS = {
    "default": {"attention_backend": "fa3"},
    "full-fa3": {"attention_backend": "fa3", "cuda_graph_backend_prefill": "full"},
    "full-triton": {
        "attention_backend": "triton",
        "cuda_graph_backend_prefill": "full",
    },
}
EXPECTED = {
    ("qwen3_next", "default"): Backend.BREAKABLE,
    ("qwen3_next", "full-fa3"): Backend.FULL,
    ("qwen3_next", "full-triton"): "set --attention-backend fa3 / fa4",
    # sglang's own breakable rule for KDA models other than GLM-5.3 Flash.
    ("kimi_linear", "default"): Backend.DISABLED,
    ("kimi_linear", "full-fa3"): Backend.FULL,
    ("kimi_linear", "full-triton"): "set --attention-backend fa3 / fa4",
    ("llama", "default"): Backend.BREAKABLE,
    ("llama", "full-fa3"): Backend.FULL,
    ("llama", "full-triton"): "set --attention-backend fa3 / fa4",
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    return {family: write_config(family, root / family) for family in FAMILIES}


def _plan(model_dir, parallel, request):
    """The resolved prefill backend, or the refusal's message."""
    args = ServerArgs(model_path=model_dir, **PARALLEL[parallel], **REQUESTS[request])
    try:
        with simulated_gpu("h200"):
            args.resolve_once()
    except ValueError as exc:
        return str(exc)
    assert (args.tp_size, args.enable_dp_attention) == (
        PARALLEL[parallel].get("tp_size", 1),
        PARALLEL[parallel].get("enable_dp_attention", False),
    )
    return resolving_view(args).cuda_graph_config.prefill.backend


@pytest.mark.parametrize("request_", sorted(REQUESTS))
@pytest.mark.parametrize("parallel", sorted(PARALLEL))
@pytest.mark.parametrize("family", FAMILIES)
def test_plan_does_not_depend_on_the_parallel_layout(
    model_dirs, family, parallel, request_
):
    plan = _plan(model_dirs[family], parallel, request_)
    expected = EXPECTED[family, request_]
    if expected not in Backend.ALL:  # a refusal, naming the way out
        assert plan not in Backend.ALL and expected in plan, plan
        assert "--cuda-graph-backend-prefill disabled" in plan
    else:
        assert plan == expected
    assert plan == _plan(model_dirs[family], "tp1", request_)


@pytest.mark.parametrize("parallel", sorted(PARALLEL))
def test_llama_plan_is_upstreams(model_dirs, parallel, monkeypatch):
    """Without linear attention the plan is the one sglang resolves alone, on
    every layout, where sglang's graph captures (fa3); the control: on triton,
    which cannot replay a full prefill graph (the refusal above), sglang alone
    resolves FULL, so the comparison can fail."""
    ours = {r: _plan(model_dirs["llama"], parallel, r) for r in REQUESTS}
    for patch in PATCHES:
        module, name = patch.target.rsplit(".", 1)
        if module == upstream.__name__:
            monkeypatch.setattr(upstream, name, getattr(upstream, name).__wrapped__)
    alone = {r: _plan(model_dirs["llama"], parallel, r) for r in REQUESTS}
    assert ours["default"] == alone["default"] == Backend.BREAKABLE
    assert ours["full-fa3"] == alone["full-fa3"] == Backend.FULL
    assert alone["full-triton"] == Backend.FULL != ours["full-triton"]
