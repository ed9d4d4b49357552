"""The prefill CUDA-graph plan sglang 0.5.23 resolves, with sglang-graphfix, for one
tiny model of each linear-attention family: the real ``ServerArgs.resolve_once``
pipeline on real ModelConfigs, with only the hardware probes answered as on an
H200 (or an A100) by ``sglang_graphfix.cli.simulated_gpu``."""

import logging
import pkgutil
from unittest import mock

import pytest
import torch
from resolution import prefill_backend, resolved
from tiny_configs import FAMILIES, write_config

from sglang.srt.arg_groups import cuda_graph_hook as upstream
from sglang.srt.arg_groups.overrides import (
    attention_backends_of,
    declare_resolution,
    model_config_of,
    resolved_view,
    resolving_view,
)
from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.patches import PATCHES
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.arg_groups import cuda_graph_hook as ours

OURS = "sglang_graphfix.srt.arg_groups.cuda_graph_hook"
# Linear side capturable under a full prefill graph (KDA through KDA_FULL_PREFILL_GRAPH).
LINEAR_CAPTURES = {"qwen3_next", "kimi_linear", "inkling", "llama"}
MLA = {"kimi_linear"}
# sglang's own breakable rules turn the breakable graph off here (KDA rule).
BREAKABLE_REJECTED = {"kimi_linear"}
# sglang refuses these itself, whatever the graph (model_hook: LFM2's first layer
# might not be attention, which triton requires).
SGLANG_REFUSES = {("lfm2", "triton"): "does not support triton attention backend"}


@pytest.fixture(autouse=True)
def full_judged_on_mamba2(monkeypatch):
    """These tests judge the full prefill graph itself: on Mamba2 models that
    sglang's breakable graph runs, a full graph is routed to breakable before it
    is judged (MAMBA2_FULL_BEATS_BREAKABLE off as shipped; the routing tests
    below turn it off again)."""
    monkeypatch.setattr(capability, "MAMBA2_FULL_BEATS_BREAKABLE", True)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    return {family: write_config(family, root / family) for family in FAMILIES}


def resolve(model_dirs, family, **kwargs):
    return resolved(model_dirs[family], **kwargs)


def our_warnings(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == OURS and r.levelno >= logging.WARNING
    ]


def full_captures(family, attention):
    capable = ("fa3", "fa4") if family in MLA else ("fa3", "fa4", "flashinfer")
    return family in LINEAR_CAPTURES and attention in capable


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_the_backend_sglang_builds(model_dirs, family):
    args = ServerArgs(model_path=model_dirs[family])
    model_config = model_config_of(args)
    assert model_config.hf_config.architectures == [FAMILIES[family][1]]
    assert capability.family_label(model_config) == FAMILIES[family][2]


# ---- the matrix: family x how the full graph is asked for x attention backend ----

ATTENTION = ["flashinfer", "triton"]


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_explicit_full(model_dirs, family, attention, caplog):
    kwargs = dict(
        attention_backend=attention, cuda_graph_config={"prefill": {"backend": "full"}}
    )
    if (family, attention) in SGLANG_REFUSES:  # before the prefill graph is judged
        with pytest.raises(AssertionError, match=SGLANG_REFUSES[family, attention]):
            resolve(model_dirs, family, **kwargs)
        return
    if full_captures(family, attention):
        args = resolve(model_dirs, family, **kwargs)
        assert prefill_backend(args) == Backend.FULL
        assert not our_warnings(caplog)
        return
    with pytest.raises(ValueError) as err:
        resolve(model_dirs, family, **kwargs)
    message = str(err.value)
    _, arch, linear = FAMILIES[family]
    assert arch in message and f"linear attention {linear or 'none'}" in message
    assert f"full-attention backend {attention}" in message
    assert "--cuda-graph-backend-prefill disabled" in message
    # breakable is offered only where sglang's own breakable rules allow it
    assert ("--cuda-graph-backend-prefill breakable" in message) == (
        family not in BREAKABLE_REJECTED
    )
    if attention == "triton":
        assert "Invalid forward mode EXTEND for CUDA Graph replay" in message
    if family in LINEAR_CAPTURES:  # the attention backend is the only obstacle
        assert "set --attention-backend fa3 / fa4" in message


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_default_full(model_dirs, family, attention, caplog):
    """A full prefill graph the user did not ask for (a model default, locked like
    Inkling's): kept where it captures, else breakable if sglang's breakable rules
    accept the model, else disabled, with exactly one warning."""
    if (family, attention) in SGLANG_REFUSES:
        with pytest.raises(AssertionError, match=SGLANG_REFUSES[family, attention]):
            resolve(
                model_dirs, family, model_default_full=True, attention_backend=attention
            )
        return
    with caplog.at_level(logging.WARNING):
        args = resolve(
            model_dirs, family, model_default_full=True, attention_backend=attention
        )
    warned = our_warnings(caplog)
    if full_captures(family, attention):
        assert prefill_backend(args) == Backend.FULL and not warned
        return
    expected = Backend.DISABLED if family in BREAKABLE_REJECTED else Backend.BREAKABLE
    assert prefill_backend(args) == expected
    assert len(warned) == 1, warned
    assert FAMILIES[family][1] in warned[0] and "test_model_default" in warned[0]
    assert f"Using the {expected} prefill graph" in warned[0]
    assert "--cuda-graph-backend-prefill" in warned[0]
    # the breakable probe's own upstream warning stays swallowed
    assert not any("Breakable CUDA graph is incompatible" in m for m in caplog.messages)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default(model_dirs, family, attention, caplog):
    """No graph flag: sglang's default breakable graph (off for KDA by sglang's own
    rule), Inkling's full default where its attention backend captures it."""
    if (family, attention) in SGLANG_REFUSES:
        with pytest.raises(AssertionError, match=SGLANG_REFUSES[family, attention]):
            resolve(model_dirs, family, attention_backend=attention)
        return
    with caplog.at_level(logging.WARNING):
        args = resolve(model_dirs, family, attention_backend=attention)
    if family == "inkling":
        captures = full_captures(family, attention)
        assert prefill_backend(args) == (
            Backend.FULL if captures else Backend.BREAKABLE
        )
        assert len(our_warnings(caplog)) == (0 if captures else 1)
        return
    expected = Backend.DISABLED if family in BREAKABLE_REJECTED else Backend.BREAKABLE
    assert prefill_backend(args) == expected
    assert not our_warnings(caplog)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_explicit_breakable(model_dirs, family, attention):
    kwargs = dict(attention_backend=attention, cuda_graph_backend_prefill="breakable")
    if (family, attention) in SGLANG_REFUSES:
        with pytest.raises(AssertionError, match=SGLANG_REFUSES[family, attention]):
            resolve(model_dirs, family, **kwargs)
        return
    if family not in BREAKABLE_REJECTED:
        assert (
            prefill_backend(resolve(model_dirs, family, **kwargs)) == Backend.BREAKABLE
        )
        return
    with pytest.raises(ValueError) as err:
        resolve(model_dirs, family, **kwargs)
    message = str(err.value)
    assert (
        "KimiLinearForCausalLM" in message and "KDA hybrid linear attention" in message
    )
    assert (
        "GLM-5.3 Flash" in message
        and "--cuda-graph-backend-prefill disabled" in message
    )
    # KDA's full graph is offered only with an attention backend that captures it
    assert "--cuda-graph-backend-prefill full" not in message


def test_explicit_breakable_refused_on_kda_under_pipeline_parallelism(model_dirs):
    """Pipeline parallelism is how sglang's breakable graph is opted into; the
    refusal of KDA's breakable graph holds there too, and a refused full graph
    does not offer breakable as the way out."""
    with pytest.raises(ValueError, match="KDA hybrid linear attention"):
        resolve(
            model_dirs, "kimi_linear", cuda_graph_backend_prefill="breakable", pp_size=2
        )
    with pytest.raises(ValueError) as err:
        resolve(
            model_dirs, "kimi_linear", cuda_graph_backend_prefill="full",
            attention_backend="flashinfer", pp_size=2,
        )  # fmt: skip
    assert "--cuda-graph-backend-prefill breakable" not in str(err.value)
    # A model sglang's breakable rules accept keeps breakable among the remedies.
    with pytest.raises(ValueError) as err:
        resolve(
            model_dirs, "qwen3_next", cuda_graph_backend_prefill="full",
            attention_backend="triton", pp_size=2,
        )  # fmt: skip
    assert "--cuda-graph-backend-prefill breakable" in str(err.value)


# ---- the full-attention backend sglang picks itself (fa3 on Hopper) ----


@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear", "llama"])
def test_explicit_full_on_hopper_default_fa3(model_dirs, family):
    """fa3 (sglang's default on an H200, MHA and MLA) plans the extend in
    FlashAttentionBackend._init_full_cg_prefill_metadata: the graph stays full."""
    args = resolve(model_dirs, family, cuda_graph_backend_prefill="full")
    assert attention_backends_of(resolved_view(args)) == ("fa3", "fa3")
    assert prefill_backend(args) == Backend.FULL


def test_attention_backend_sglang_swaps_in_late_is_judged(model_dirs):
    """fa3 with an fp8_e5m2 KV cache: sglang switches to triton after the CUDA-graph
    config resolved; the recheck on the resolved backend still refuses."""
    with pytest.raises(ValueError, match="full-attention backend triton"):
        resolve(
            model_dirs,
            "llama",
            cuda_graph_backend_prefill="full",
            kv_cache_dtype="fp8_e5m2",
        )


def test_inkling_default_full_prefill_graph_on_h200(model_dirs, caplog):
    """Inkling defaults to a full prefill graph; on Hopper its model override picks
    fa4, which captures it: upstream's behaviour, unchanged."""
    with caplog.at_level(logging.WARNING):
        args = resolve(model_dirs, "inkling")
    assert attention_backends_of(resolved_view(args)) == ("fa4", "fa4")
    assert prefill_backend(args) == Backend.FULL and not our_warnings(caplog)
    _assert_upstream_slots_and_cap(args)


def _assert_upstream_slots_and_cap(args):
    """No request-slot floor and no prefill batch cap of ours: upstream's."""
    view = resolving_view(args)
    assert view.cuda_graph_config.prefill.full_prefill_max_req is None
    assert view.prefill_max_requests is None
    sources = [source for source, _ in args._resolved_overrides]
    assert "_hybrid_full_prefill_request_slots" not in sources
    assert "_cap_prefill_batches_at_request_slots" not in sources


def test_inkling_full_graph_keeps_upstreams_slots_and_batches(model_dirs):
    """Inkling's full prefill graph is sglang's own (its short conv records its
    metadata in the graph): at chunked_prefill_size 2048 sglang's rule gives 4
    slots, and its prefill batches stay uncapped (under fa4 its multimodal
    batches run eager whatever their size)."""
    args = resolve(model_dirs, "inkling", chunked_prefill_size=2048)
    assert prefill_backend(args) == Backend.FULL
    _assert_upstream_slots_and_cap(args)


def test_inkling_default_on_a100_falls_back_to_breakable(model_dirs, caplog):
    """Off Hopper/Blackwell Inkling's override picks triton, which cannot capture
    the full graph that its default still selects."""
    with caplog.at_level(logging.WARNING):
        args = resolve(model_dirs, "inkling", gpu="a100")
    assert attention_backends_of(resolved_view(args)) == ("triton", "triton")
    assert prefill_backend(args) == Backend.BREAKABLE
    (warning,) = our_warnings(caplog)
    assert (
        "_apply_inkling_prefill_cuda_graph_default" in warning and "triton" in warning
    )


# ---- linear-attention prefill kernels ----


@pytest.mark.parametrize(
    "family, gpu, capture_sm, captured",
    [
        ("kimi_linear", "h200", 90, "runs the Triton kernels, not flashinfer"),
        ("qwen3_next", "h200", None, "runs the Triton kernels, not flashinfer"),
        ("qwen3_next", "a100", 90, "FlashInfer's on SM90, not flashinfer on SM80"),
    ],
)
def test_explicit_full_with_a_non_triton_linear_prefill_kernel(
    model_dirs, monkeypatch, family, gpu, capture_sm, captured
):
    monkeypatch.setattr(capability, "FLASHINFER_GDN_CAPTURE_SM", capture_sm)
    with pytest.raises(ValueError) as err:
        resolve(
            model_dirs,
            family,
            gpu=gpu,
            cuda_graph_backend_prefill="full",
            linear_attn_prefill_backend="flashinfer",
        )
    assert captured in str(err.value)
    assert "set --linear-attn-prefill-backend triton" in str(err.value)


def test_explicit_full_with_flashinfer_gdn_prefill_where_it_captures(
    model_dirs, monkeypatch, caplog
):
    """With FlashInfer's GDN prefill switched on for SM90, an H200 keeps it."""
    monkeypatch.setattr(capability, "FLASHINFER_GDN_CAPTURE_SM", 90)
    with caplog.at_level(logging.WARNING):
        args = resolve(
            model_dirs,
            "qwen3_next",
            cuda_graph_backend_prefill="full",
            linear_attn_prefill_backend="flashinfer",
        )
    assert prefill_backend(args) == Backend.FULL
    assert not our_warnings(caplog)


def test_model_default_full_with_a_non_triton_linear_prefill_kernel(model_dirs, caplog):
    with caplog.at_level(logging.WARNING):
        args = resolve(
            model_dirs,
            "qwen3_next",
            model_default_full=True,
            linear_attn_backend="cutedsl",
        )
    assert prefill_backend(args) == Backend.BREAKABLE
    assert "not cutedsl" in our_warnings(caplog)[0]


def test_kda_switch_rejects_kda_again(model_dirs, monkeypatch):
    monkeypatch.setattr(capability, "KDA_FULL_PREFILL_GRAPH", False)
    with pytest.raises(
        ValueError, match="KDA linear attention has no capturable extend"
    ):
        resolve(model_dirs, "kimi_linear", cuda_graph_backend_prefill="full")


# ---- the other paths into the rules ----


@pytest.mark.parametrize(
    "family, expected", [("nemotron_h", "breakable"), ("qwen3_next", "full")]
)
def test_unlocked_full_default_goes_through_the_cascade(
    model_dirs, family, expected, caplog
):
    """A future sglang whose own default prefill graph is full (not locked, not
    the user's): judged on the final settings like a model default."""
    with (
        mock.patch(
            "sglang.srt.model_executor.cuda_graph_config.default_prefill_backend",
            return_value=Backend.FULL,
        ),
        caplog.at_level(logging.WARNING),
    ):
        args = resolve(model_dirs, family)
    assert prefill_backend(args) == expected
    assert len(our_warnings(caplog)) == (expected != "full")
    assert ("selected automatically" in caplog.text) == (expected != "full")


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, None),
        ({"cuda_graph_backend_prefill": "full"}, "full"),
        # the JSON config wins over the convenience flag, as in parse_cuda_graph_config
        (
            {
                "cuda_graph_backend_prefill": "full",
                "cuda_graph_config": {"prefill": {"backend": "disabled"}},
            },
            "disabled",
        ),
        ({"disable_cuda_graph": True}, "disabled"),
        ({"cuda_graph_config": {"decode": {"max_bs": 4}}}, None),
    ],
)
def test_user_prefill_backend(model_dirs, kwargs, expected):
    args = ServerArgs(model_path=model_dirs["inkling"], **kwargs)
    # a model default declared before parsing is not the user's
    declare_resolution(args, "test_model_default", cuda_graph_backend_prefill="full")
    assert ours.user_prefill_backend(args) == expected


def test_upstream_alone_lets_every_case_through(model_dirs, monkeypatch):
    """Can-fail control: with this module's hooks unwrapped, sglang resolves a full
    prefill graph for all of them, and each then fails at capture on the GPU."""
    for patch in PATCHES:
        module, name = patch.target.rsplit(".", 1)
        if module == upstream.__name__:
            monkeypatch.setattr(upstream, name, getattr(upstream, name).__wrapped__)
    cases = [
        ("nemotron_h", {"cuda_graph_backend_prefill": "full"}, "h200"),
        (
            "qwen3_next",
            {"cuda_graph_backend_prefill": "full", "attention_backend": "triton"},
            "h200",
        ),
        (
            "kimi_linear",
            {"cuda_graph_backend_prefill": "full", "attention_backend": "flashinfer"},
            "h200",
        ),
        ("inkling", {}, "a100"),
    ]
    for family, kwargs, gpu in cases:
        assert (
            prefill_backend(resolve(model_dirs, family, gpu=gpu, **kwargs))
            == Backend.FULL
        )
    # and sglang's own lock lets the explicit breakable graph through on KDA
    args = resolve(model_dirs, "kimi_linear", cuda_graph_backend_prefill="breakable")
    assert prefill_backend(args) == Backend.BREAKABLE


# ---- outside hybrid models: upstream's decisions, unchanged ----


def upstream_plan(args):
    cfg = resolving_view(args)
    graph = cfg.cuda_graph_config
    return (
        graph.prefill.backend,
        graph.prefill.bs,
        graph.decode.backend,
        graph.decode.bs,
        attention_backends_of(resolved_view(args)),
    )


def _plan_or_error(model_dirs, family, gpu, kwargs):
    try:
        return upstream_plan(resolve(model_dirs, family, gpu=gpu, **kwargs))
    except Exception as exc:  # what stops the server, as a comparable value
        return type(exc).__name__, str(exc)


def _without_graphfix(monkeypatch):
    """Every sglang-graphfix hook unwrapped (SGLANG_PLUGINS=none's resolution)."""
    for patch in PATCHES:
        owner, name = patch.target.rsplit(".", 1)
        target = pkgutil.resolve_name(owner)
        monkeypatch.setattr(target, name, getattr(target, name).__wrapped__)


LLAMA_COMBOS = [
    {},
    {"cuda_graph_backend_prefill": "breakable"},
    {"cuda_graph_backend_prefill": "disabled"},
    {"cuda_graph_backend_prefill": "full"},
    {"cuda_graph_backend_prefill": "full", "attention_backend": "flashinfer"},
    {"cuda_graph_config": {"prefill": {"backend": "full"}}},
    {"enable_two_batch_overlap": True},
    {"enable_two_batch_overlap": True, "cuda_graph_backend_prefill": "breakable"},
    {"enable_two_batch_overlap": True, "cuda_graph_backend_prefill": "full"},
    {"disable_cuda_graph": True},
    {"enable_mis": True, "attention_backend": "flashinfer"},
    {"enable_unified_memory": True, "cuda_graph_backend_prefill": "full"},
    {"speculative_algorithm": "NGRAM", "cuda_graph_backend_prefill": "full"},
    {"attention_backend": "triton"},
    {"attention_backend": "triton", "cuda_graph_backend_prefill": "breakable"},
]


@pytest.mark.parametrize("gpu", ["h200", "a100"])
@pytest.mark.parametrize("kwargs", LLAMA_COMBOS, ids=str)
def test_llama_plan_is_upstreams(model_dirs, monkeypatch, kwargs, gpu):
    """On a model without linear attention, with any prefill graph that can
    capture, the plan (graph backends, buckets, attention backends, or the error
    that stops the server) is the one upstream resolves."""
    ours_plan = _plan_or_error(model_dirs, "llama", gpu, kwargs)
    with monkeypatch.context() as m:
        _without_graphfix(m)
        assert _plan_or_error(model_dirs, "llama", gpu, kwargs) == ours_plan


def test_two_batch_overlap_with_an_explicit_breakable_graph_serves(model_dirs, caplog):
    """sglang's breakable rules turn a default breakable graph off under two-batch
    overlap, but serve an explicit one: so does sglang-graphfix, silently."""
    with caplog.at_level(logging.WARNING):
        args = resolve(
            model_dirs,
            "llama",
            cuda_graph_backend_prefill="breakable",
            enable_two_batch_overlap=True,
        )
    assert prefill_backend(args) == Backend.BREAKABLE
    assert not our_warnings(caplog)
    default = resolve(model_dirs, "llama", enable_two_batch_overlap=True)
    assert prefill_backend(default) == Backend.DISABLED  # sglang's own rule


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cuda_graph_backend_prefill": "full", "attention_backend": "triton"},
        # fa3 with an fp8_e5m2 KV cache: sglang falls back to triton
        {"cuda_graph_backend_prefill": "full", "kv_cache_dtype": "fp8_e5m2"},
    ],
    ids=str,
)
def test_llama_full_graph_on_triton_is_refused_where_upstream_fails_at_capture(
    model_dirs, monkeypatch, kwargs
):
    """The one difference on Llama: upstream resolves a full prefill graph on
    triton, whose capture then raises (TritonAttnBackend._apply_cuda_graph_metadata
    has no EXTEND branch, shown below on CPU); sglang-graphfix refuses it first."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    with pytest.raises(ValueError, match="full-attention backend triton"):
        resolve(model_dirs, "llama", **kwargs)
    with monkeypatch.context() as m:
        _without_graphfix(m)
        assert prefill_backend(resolve(model_dirs, "llama", **kwargs)) == Backend.FULL
    triton = TritonAttnBackend.__new__(TritonAttnBackend)
    with pytest.raises(ValueError, match="Invalid forward mode.*for CUDA Graph replay"):
        triton._apply_cuda_graph_metadata(
            plan=None, bs=1, req_pool_indices=None, seq_lens=None,
            forward_mode=ForwardMode.EXTEND, spec_info=None,
        )  # fmt: skip


# ---- request slots of a hybrid model's full prefill graph ----


def _slots(args):
    return resolving_view(args).cuda_graph_config.prefill.full_prefill_max_req


@pytest.mark.parametrize(
    "family, flags, slots",
    [
        # sglang's rule gives chunked_prefill_size // 512 = 1: raised to 8
        ("qwen3_next", {"chunked_prefill_size": 512}, 8),
        ("kimi_linear", {"chunked_prefill_size": 2048, "attention_backend": "fa3"}, 8),
        # the rule already gives 8 or more (16 at the H200 default chunking): upstream
        ("qwen3_next", {"chunked_prefill_size": 4096}, None),
        ("qwen3_next", {}, None),
        # the user's own slot count, and models without linear attention: upstream
        ("qwen3_next", {"chunked_prefill_size": 512, "full_prefill_max_req": 1}, 1),
        ("llama", {"chunked_prefill_size": 512}, None),
    ],
)
def test_hybrid_full_prefill_graph_gets_request_slots(
    model_dirs, caplog, family, flags, slots
):
    """Through sglang's resolution: a hybrid model's full prefill graph without a
    slot count set gets 8 where sglang's capture-time rule would give fewer, and
    the INFO line names the setting; nothing else changes."""
    flags = dict(flags)
    prefill = {"backend": "full"}
    if "full_prefill_max_req" in flags:
        prefill["full_prefill_max_req"] = flags.pop("full_prefill_max_req")
    args, said, sources = _resolved_with_info(
        model_dirs, caplog, family, prefill, flags, "request slots per captured batch"
    )
    assert prefill_backend(args) == Backend.FULL
    assert _slots(args) == slots
    if family != "llama" and slots == 8:
        (line,) = said
        assert "8 request slots" in line and '"full_prefill_max_req": N' in line
        assert "_hybrid_full_prefill_request_slots" in sources
    else:
        assert not said and "_hybrid_full_prefill_request_slots" not in sources


@pytest.mark.parametrize(
    "chunked, prefill, extra, chunk_tokens, per_request",
    [
        # sglang's rule gives 1 slot at 512 and 4 at 2048: 512 tokens a request
        (512, {}, {}, 4096, 512),
        (2048, {}, {}, 4096, 512),
        # a request pool of 4 (capture caps the slots there)
        (512, {}, {"max_running_requests": 4}, 2048, 512),
        # the user's chunk size is kept (64 tokens a request over 8 slots)
        (512, {"full_prefill_prefix_chunk_tokens": 512}, {}, 512, 64),
    ],
)
def test_mla_hybrid_slots_keep_sglangs_prefix_chunk(
    model_dirs, caplog, chunked, prefill, extra, chunk_tokens, per_request
):
    """Kimi-Linear (MLA, chunked prefix cache): the graph replays a cached prefix
    in chunks of full_prefill_prefix_chunk_tokens shared by the request slots, so
    the slot floor alone would cut each request's chunk, and the longest prefix a
    graph replays, 8x at chunked_prefill_size 512; the floor scales the chunk
    tokens with it, as upstream's runner then reads them."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.runner import prefill_cuda_graph_runner as runner

    args, said, _ = _resolved_with_info(
        model_dirs, caplog, "kimi_linear", {"backend": "full", **prefill},
        {"chunked_prefill_size": chunked, "attention_backend": "fa3", **extra},
        "request slots per captured batch",
    )  # fmt: skip
    view = resolving_view(args)
    assert _slots(args) == 8
    assert view.cuda_graph_config.prefill.full_prefill_prefix_chunk_tokens == (
        chunk_tokens
    )
    (line,) = said
    assert (f"chunks of {chunk_tokens} tokens" in line) == (not prefill)
    assert (f"{per_request} a request" in line) == (not prefill)
    graph_slots = min(8, extra.get("max_running_requests", 8))
    model_runner = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(req_to_token=torch.empty(1, 131072)),
        model_config=SimpleNamespace(context_len=131072),
    )
    graph = SimpleNamespace(cuda_graph_config=view.cuda_graph_config)
    with (
        mock.patch.object(runner, "get_exec", lambda: SimpleNamespace(graph=graph)),
        mock.patch.object(
            runner,
            "get_schedule",
            lambda: SimpleNamespace(chunked_prefill_size=chunked),
        ),
    ):
        shape = runner.PrefillCudaGraphRunner._resolve_prefix_chunk_shape(
            model_runner, graph_slots
        )
    assert shape == (per_request, per_request * graph_slots)


def test_non_mla_hybrid_slots_leave_the_prefix_chunk(model_dirs):
    """Without the chunked prefix cache (not an MLA model) the graph captures no
    cached-prefix chunks: the chunk size stays unset."""
    args = resolve(
        model_dirs, "qwen3_next", chunked_prefill_size=512,
        cuda_graph_config={"prefill": {"backend": "full"}},
    )  # fmt: skip
    assert _slots(args) == 8
    prefill = resolving_view(args).cuda_graph_config.prefill
    assert prefill.full_prefill_prefix_chunk_tokens is None


def _resolved_with_info(model_dirs, caplog, family, prefill, flags, phrase):
    """The resolved ServerArgs for ``prefill`` and ``flags``; our INFO lines
    containing ``phrase``; the sources in sglang's resolution record."""
    with caplog.at_level(logging.INFO, logger=OURS):
        args = resolve(
            model_dirs, family, cuda_graph_config={"prefill": prefill}, **flags
        )
    said = [r.getMessage() for r in caplog.records if phrase in r.getMessage()]
    return args, said, [source for source, _ in args._resolved_overrides]


def test_breakable_graph_keeps_sglangs_slots(model_dirs):
    args = resolve(model_dirs, "qwen3_next", chunked_prefill_size=512)
    assert prefill_backend(args) == Backend.BREAKABLE and _slots(args) is None


# ---- prefill batches within a hybrid model's full prefill graph slots ----


def _batch_cap(args):
    return resolving_view(args).prefill_max_requests


@pytest.mark.parametrize(
    "family, flags, prefill, cap",
    [
        # sglang's slot rule at the H200 default chunking: 8192 // 512
        ("qwen3_next", {}, {"backend": "full"}, 16),
        ("kimi_linear", {"attention_backend": "fa3"}, {"backend": "full"}, 16),
        # the slots hybrid_full_prefill_request_slots gives at chunked_prefill_size 512
        ("qwen3_next", {"chunked_prefill_size": 512}, {"backend": "full"}, 8),
        # the user's slots
        ("qwen3_next", {}, {"backend": "full", "full_prefill_max_req": 4}, 4),
        # the user's own cap, above or below the slots: kept
        ("qwen3_next", {"prefill_max_requests": 32}, {"backend": "full"}, 32),
        ("qwen3_next", {"prefill_max_requests": 2}, {"backend": "full"}, 2),
        # no full graph, or no linear attention: upstream (no cap)
        ("qwen3_next", {}, {"backend": "breakable"}, None),
        ("llama", {}, {"backend": "full"}, None),
        # mixed prefill+decode batches (eager above the slots whatever the cap),
        # and a PD prefill server whose KV reserve a cap would drop: upstream
        ("qwen3_next", {"enable_mixed_chunk": True}, {"backend": "full"}, None),
        (
            "qwen3_next",
            {"disaggregation_mode": "prefill", "max_mamba_cache_size": 64},
            {"backend": "full"},
            None,
        ),
        ("qwen3_next", {"disaggregation_mode": "prefill"}, {"backend": "full"}, 16),
    ],
)
def test_full_prefill_graph_caps_prefill_batches(
    model_dirs, caplog, family, flags, prefill, cap
):
    """Through sglang's resolution: a hybrid model's full prefill graph without a
    prefill batch cap gets one equal to its request slots, declared in sglang's
    record and said once at INFO naming the flag; nothing else changes."""
    args, said, sources = _resolved_with_info(
        model_dirs, caplog, family, prefill, flags, "prefill batch takes"
    )
    assert prefill_backend(args) == prefill["backend"]
    assert _batch_cap(args) == cap
    if cap is not None and "prefill_max_requests" not in flags:
        (line,) = said
        assert f"at most {cap} requests" in line and "--prefill-max-requests" in line
        assert "_cap_prefill_batches_at_request_slots" in sources
    else:
        assert not said and "_cap_prefill_batches_at_request_slots" not in sources


def test_downgraded_full_graph_gets_no_batch_cap(model_dirs):
    """A model-default full graph the model cannot capture becomes breakable: its
    prefill batches stay uncapped, as upstream."""
    args = resolve(model_dirs, "lfm2", model_default_full=True)
    assert prefill_backend(args) == Backend.BREAKABLE and _batch_cap(args) is None


# ---- Mamba2 models that sglang's breakable graph runs: full routed to breakable ----

ROUTED = "sglang's breakable prefill graph runs this model (its Mamba2 layers eager"


@pytest.fixture(scope="module")
def mamba2_dirs(tmp_path_factory):
    """NemotronH of Mamba2 and attention layers only ("M*M": sglang's breakable
    graph runs it, as Falcon-H1), and Falcon-Mamba (Mamba-1 mixer, no attention)."""
    from tiny_configs import _nemotron_h
    from transformers import FalconMambaConfig

    root = tmp_path_factory.mktemp("mamba2")
    nemotron = _nemotron_h(hybrid_override_pattern="M*M")
    falcon_mamba = FalconMambaConfig(
        vocab_size=1024, hidden_size=64, state_size=16, num_hidden_layers=2,
        intermediate_size=128, time_step_rank=8,
    )  # fmt: skip
    for name, config, arch in (
        ("nemotron_h_m_star_m", nemotron, "NemotronHForCausalLM"),
        ("falcon_mamba", falcon_mamba, "FalconMambaForCausalLM"),
    ):
        config.architectures = [arch]
        config.save_pretrained(root / name)
    return {name: str(root / name) for name in ("nemotron_h_m_star_m", "falcon_mamba")}


@pytest.mark.parametrize("asked", ["explicit", "model default"])
@pytest.mark.parametrize(
    "flags", [{}, {"attention_backend": "flashinfer", "dtype": "bfloat16"}]
)
@pytest.mark.parametrize("model", ["falcon_h1", "nemotron_h_m_star_m"])
def test_mamba2_full_where_breakable_runs_becomes_breakable(
    model_dirs, mamba2_dirs, monkeypatch, caplog, asked, flags, model
):
    """Falcon-H1 (attention in every layer) and NemotronH "M*M": a full prefill
    graph, asked for or a model default, capturable or not, runs as breakable
    with one warning naming the measurement and the source, before any refusal
    (no ValueError asking for flags that would only lead here)."""
    monkeypatch.setattr(capability, "MAMBA2_FULL_BEATS_BREAKABLE", False)
    explicit = asked == "explicit"
    extra = {"cuda_graph_backend_prefill": "full"} if explicit else {}
    with caplog.at_level(logging.WARNING):
        args = resolved(
            {**model_dirs, **mamba2_dirs}[model], model_default_full=not explicit,
            **flags, **extra,
        )  # fmt: skip
    assert prefill_backend(args) == Backend.BREAKABLE
    warned = [m for m in our_warnings(caplog) if ROUTED in m]
    assert len(warned) == 1 and len(our_warnings(caplog)) == 1, our_warnings(caplog)
    arch = "FalconH1ForCausalLM" if model == "falcon_h1" else "NemotronHForCausalLM"
    assert arch in warned[0] and "no flag keeps the full graph" in warned[0]
    assert "Falcon-H1-7B's dimensions" in warned[0]
    assert "Using the breakable prefill graph instead" in warned[0]
    assert ("(requested)" in warned[0]) == explicit
    assert (ours.ROUTE_SOURCE, "breakable") in [
        (source, fields["cuda_graph_config"].prefill.backend)
        for source, fields in args._resolved_overrides
        if "cuda_graph_config" in fields
    ]


@pytest.mark.parametrize(
    "family, flags",
    [
        # Layers sglang's graph setup finds no attention module in: breakable
        # would run every prefill eager there.
        ("nemotron_h", {}),
        ("lfm2", {}),
        # Not Mamba2.
        ("qwen3_next", {}),
        # sglang's breakable rules do not take the model (pipeline parallelism).
        ("falcon_h1", {"pp_size": 2}),
    ],
)
def test_mamba2_full_kept_where_breakable_is_no_graph_or_not_allowed(
    model_dirs, monkeypatch, caplog, family, flags
):
    monkeypatch.setattr(capability, "MAMBA2_FULL_BEATS_BREAKABLE", False)
    with caplog.at_level(logging.WARNING):
        args = resolve(
            model_dirs, family, cuda_graph_backend_prefill="full",
            attention_backend="flashinfer", dtype="bfloat16", **flags,
        )  # fmt: skip
    assert prefill_backend(args) == Backend.FULL
    assert not any(ROUTED in m for m in our_warnings(caplog))


def test_mamba1_full_is_refused_for_its_mixer_not_routed(
    mamba2_dirs, monkeypatch, caplog
):
    """Falcon-Mamba is of the Mamba2/short-conv family with no layer sglang's scan
    flags, but its Mamba-1 mixer is not what was measured: the full graph it
    asks for is judged (refused, naming the mixer), not turned breakable."""
    monkeypatch.setattr(capability, "MAMBA2_FULL_BEATS_BREAKABLE", False)
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError) as err:
        resolved(
            mamba2_dirs["falcon_mamba"], cuda_graph_backend_prefill="full",
            attention_backend="flashinfer", dtype="bfloat16",
        )  # fmt: skip
    assert "Mamba-1 mixer" in str(err.value)
    assert not any(ROUTED in m for m in our_warnings(caplog))


def test_mamba2_full_kept_once_it_beats_breakable(model_dirs, caplog):
    """MAMBA2_FULL_BEATS_BREAKABLE on (as in this module's other tests): Falcon-H1
    keeps the full graph it captures."""
    with caplog.at_level(logging.WARNING):
        args = resolve(
            model_dirs, "falcon_h1", cuda_graph_backend_prefill="full",
            attention_backend="flashinfer", dtype="bfloat16",
        )  # fmt: skip
    assert prefill_backend(args) == Backend.FULL and not our_warnings(caplog)
