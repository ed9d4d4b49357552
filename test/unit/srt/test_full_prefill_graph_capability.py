"""The capability model of full prefill CUDA graphs, condition by condition:
each one refused (explicit full) or downgraded (model default) when sglang's real
server-argument resolution runs, as on the GPU chosen; and every refusal the
capture-time code can make is made at config time first, before any weights
load."""

import contextlib
import logging
import pkgutil
from types import SimpleNamespace

import pytest
import torch
from gdn_stub import make_gdn
from kda_stub import make_kda
from resolution import prefill_backend, resolved
from tiny_configs import FAMILIES, _nemotron_h, write_config

from sglang.srt.arg_groups.overrides import model_config_of
from sglang.srt.arg_groups.overrides import use_mla_backend as uses_mla
from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel
from sglang.srt.layers.attention.linear.short_conv_backend import ShortConvAttnBackend
from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends
from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.runtime_context import (
    attention_backends,
    create_context,
    get_exec,
    get_server_args,
    use_context,
)
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.cli import simulated_gpu
from sglang_graphfix.patches import PATCHES
from sglang_graphfix.srt import full_prefill_graph_capability as capability

OURS = "sglang_graphfix.srt.arg_groups.cuda_graph_hook"
GDN_PAGE_MAJOR = "--enable-page-major-kv-layout / --enable-unified-memory"
KDA_SWITCH = capability.KDA_CONDITIONS[0].setting
MAMBA2_SWITCH = capability.MAMBA2_CONDITIONS[0].setting
MAMBA2_MIXER = "Mamba2/short-conv (mixer)"
MAMBA2_ATTENTION = "--attention-backend (Mamba2 checked)"
MAMBA2_GROUPS = "mamba_n_groups (model config)"
MAMBA2_STATE = "--mamba-ssm-dtype / SGLANG_MAMBA_CONV_DTYPE"
LAYER_SCAN = "sglang's prefill graph setup (layers without attention)"


@pytest.fixture(autouse=True)
def full_judged_on_mamba2(monkeypatch):
    """These tests judge the full prefill graph itself, which on Mamba2 models
    that sglang's breakable graph runs (Falcon-H1, NemotronH "M*M") is routed to
    breakable first while MAMBA2_FULL_BEATS_BREAKABLE is off, as shipped
    (test/unit/srt/arg_groups/test_cuda_graph_hook.py)."""
    monkeypatch.setattr(capability, "MAMBA2_FULL_BEATS_BREAKABLE", True)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    families = ("qwen3_next", "kimi_linear", "nemotron_h", "falcon_h1", "lfm2", "llama", "granite_moe_hybrid")  # fmt: skip
    dirs = {family: write_config(family, root / family) for family in families}
    # NemotronH of Mamba2 and attention layers only: sglang's prefill graph
    # setup finds an attention module in each (tiny_configs' "M*M-" has an MLP);
    # bfloat16 and one group, as the H200 runs checked (MAMBA2_CHECKED), with
    # 8 groups (checked too) and 2 (not); and one with an MLP and a MoE layer (in which the setup finds
    # none).
    for name, pattern, groups in (
        ("nemotron_h_no_mlp", "M*M", 1),
        ("nemotron_h_no_mlp_8_groups", "M*M", 8),
        ("nemotron_h_no_mlp_2_groups", "M*M", 2),
        ("nemotron_h_mlp_moe", "M-M*E", 1),
    ):
        config = _nemotron_h(hybrid_override_pattern=pattern, mamba_n_groups=groups)
        config.architectures = ["NemotronHForCausalLM"]
        config.dtype = torch.bfloat16
        config.save_pretrained(root / name)
        dirs[name] = str(root / name)
    lfm2 = FAMILIES["lfm2"][0]()
    lfm2.layer_types = ["conv", "full_attention", "conv"]
    lfm2.num_hidden_layers = 3
    lfm2.architectures = ["Lfm2ForCausalLM"]
    lfm2.save_pretrained(root / "lfm2_3_layers")
    dirs["lfm2_3_layers"] = str(root / "lfm2_3_layers")
    falcon = FAMILIES["falcon_h1"][0]()
    falcon.mamba_n_groups = 2
    falcon.architectures = ["FalconH1ForCausalLM"]
    falcon.dtype = torch.bfloat16
    falcon.save_pretrained(root / "falcon_h1_2_groups")
    dirs["falcon_h1_2_groups"] = str(root / "falcon_h1_2_groups")
    return dirs


# One configuration per condition (Condition.setting, or the family that never
# captures): (family, server flags, environment, KDA switch, GPU). GDN's
# FlashInfer prefill can be captured on SM90 (FLASHINFER_GDN_CAPTURE_SM), so its
# kernel case is an A100, refused whatever the switch.
CASES = {
    "--linear-attn-prefill-backend": ("qwen3_next", {"linear_attn_prefill_backend": "flashinfer"}, {}, True, "a100"),
    "--enable-mis": ("qwen3_next", {"enable_mis": True, "attention_backend": "flashinfer"}, {}, True, "h200"),
    GDN_PAGE_MAJOR: ("qwen3_next", {"enable_unified_memory": True}, {}, True, "h200"),
    KDA_SWITCH: ("kimi_linear", {}, {}, False, "h200"),
    "SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND": ("kimi_linear", {}, {"SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND": "1"}, True, "h200"),
    "--linear-attn-verify-backend": ("kimi_linear", {"speculative_algorithm": "NGRAM", "disable_radix_cache": True, "linear_attn_verify_backend": "flashinfer"}, {}, True, "h200"),
    "--attention-backend": ("qwen3_next", {"attention_backend": "triton"}, {}, True, "h200"),
    "--attention-backend (GPU architecture)": ("kimi_linear", {"attention_backend": "fa3"}, {}, True, "a100"),
    MAMBA2_SWITCH: ("nemotron_h", {}, {}, True, "h200"),
    # The rest of the Mamba2 family's conditions, with MAMBA2_FULL_PREFILL_GRAPH on.
    MAMBA2_MIXER: ("lfm2", {}, {}, True, "h200"),
    LAYER_SCAN: ("granite_moe_hybrid", {}, {}, True, "h200"),
    "--enable-mixed-chunk": ("nemotron_h_no_mlp", {"attention_backend": "flashinfer", "enable_mixed_chunk": True}, {}, True, "h200"),
    "--speculative-algorithm": ("nemotron_h_no_mlp", {"attention_backend": "flashinfer", "speculative_algorithm": "NGRAM"}, {}, True, "h200"),
    "--enable-two-batch-overlap": ("nemotron_h_no_mlp", {"attention_backend": "flashinfer", "enable_two_batch_overlap": True}, {}, True, "h200"),
    "--dtype": ("nemotron_h_no_mlp", {"dtype": "float16", "attention_backend": "flashinfer"}, {}, True, "h200"),
    MAMBA2_ATTENTION: ("nemotron_h_no_mlp", {"attention_backend": "fa3"}, {}, True, "h200"),
    MAMBA2_GROUPS: ("nemotron_h_no_mlp_2_groups", {"attention_backend": "flashinfer"}, {}, True, "h200"),
    MAMBA2_STATE: ("nemotron_h_no_mlp", {"attention_backend": "flashinfer", "mamba_ssm_dtype": "bfloat16"}, {}, True, "h200"),
}  # fmt: skip
EXTRA_CASES = {
    # The switch off, through the family's short-conv backend (LFM2: ShortConvAttnBackend).
    f"{MAMBA2_SWITCH} (LFM2)": ("lfm2", {}, {}, True, "h200"),
    # fa3 (sglang's default here; refused for Mamba2 as well): with flashinfer,
    # upstream turns the full prefill graph off under --enable-unified-memory.
    f"{GDN_PAGE_MAJOR} (Mamba2)": ("nemotron_h_no_mlp", {"enable_unified_memory": True}, {}, True, "h200"),
    # The layer scan on NemotronH: tiny_configs' "M*M-" has an MLP-only layer.
    f"{LAYER_SCAN} (NemotronH)": ("nemotron_h", {}, {}, True, "h200"),
    # The SSM state dtype outside what the H200 runs checked.
    f"{MAMBA2_STATE} (Mamba2)": ("nemotron_h_no_mlp", {"attention_backend": "flashinfer"}, {"SGLANG_MAMBA_CONV_DTYPE": "float32"}, True, "h200"),
    f"{MAMBA2_GROUPS} (Falcon-H1)": ("falcon_h1_2_groups", {"attention_backend": "flashinfer"}, {}, True, "h200"),
}  # fmt: skip
# The cases judged with MAMBA2_LAYER_GAPS_CAPTURED off (on as shipped): the
# layer scan's refusal of NemotronH's MLP and Granite's Mamba2 layers exists
# only then.
LAYER_GAPS_OFF = {LAYER_SCAN, f"{LAYER_SCAN} (NemotronH)"}
# The cases judged with MAMBA2_FULL_PREFILL_GRAPH on.
MAMBA2_ON = {
    MAMBA2_MIXER,
    LAYER_SCAN,
    f"{LAYER_SCAN} (NemotronH)",
    "--enable-mixed-chunk",
    "--speculative-algorithm",
    "--enable-two-batch-overlap",
    f"{GDN_PAGE_MAJOR} (Mamba2)",
    "--dtype",
    MAMBA2_ATTENTION,
    MAMBA2_GROUPS,
    MAMBA2_STATE,
    f"{MAMBA2_STATE} (Mamba2)",
    f"{MAMBA2_GROUPS} (Falcon-H1)",
}
# Refusals without a tiny config to resolve: the family-level refusal is the
# code path the Mamba2/short-conv cases took before MAMBA2_FULL_PREFILL_GRAPH.
NO_SAMPLE = {"Lightning", "registry-defined"}
# Upstream's handle_multi_item_scoring turns every CUDA graph off under
# --enable-mis, explicit ones included: the capture is never reached.
UPSTREAM_TURNS_OFF = {"--enable-mis"}
# Upstream's breakable rules turn the breakable prefill graph off for these: a
# downgraded model default ends disabled.
UPSTREAM_BREAKABLE_OFF = {"--enable-two-batch-overlap"}
# The two linear kernels the same Condition covers for GDN and for KDA.
KDA_KERNEL_CASE = ("kimi_linear", {"linear_attn_prefill_backend": "flashinfer"}, {}, True, "h200")  # fmt: skip
ALL_CASES = {
    **CASES,
    **EXTRA_CASES,
    "--linear-attn-prefill-backend (KDA)": KDA_KERNEL_CASE,
}


def _setting(case_id):
    suffixes = ("(LFM2)", "(KDA)", "(Mamba2)", "(NemotronH)", "(Falcon-H1)")
    return case_id.rsplit(" (", 1)[0] if case_id.endswith(suffixes) else case_id


@contextlib.contextmanager
def case_env(monkeypatch, case, case_id=None):
    _, _, env, kda_switch, _ = case
    with monkeypatch.context() as m:
        # --mamba-ssm-dtype sets SGLANG_MAMBA_SSM_DTYPE in os.environ during
        # resolution: restored after the case.
        m.delenv("SGLANG_MAMBA_SSM_DTYPE", raising=False)
        for name, value in env.items():
            m.setenv(name, value)
        m.setattr(capability, "KDA_FULL_PREFILL_GRAPH", kda_switch)
        m.setattr(capability, "MAMBA2_FULL_PREFILL_GRAPH", case_id in MAMBA2_ON)
        m.setattr(
            capability, "MAMBA2_LAYER_GAPS_CAPTURED", case_id not in LAYER_GAPS_OFF
        )
        # The mixer case's LFM2 is refused for its mixer with its switch off.
        m.setattr(capability, "LFM2_FULL_PREFILL_GRAPH", case_id != MAMBA2_MIXER)
        yield


def resolve(model_dirs, case, *, model_default_full=False, full=True):
    family, kwargs, _, _, gpu = case
    if full and not model_default_full:
        kwargs = {**kwargs, "cuda_graph_backend_prefill": "full"}
    return resolved(
        model_dirs[family], gpu=gpu, model_default_full=model_default_full, **kwargs
    )


def expected_support(case_id):
    """The reason and the fix the table gives for this case's condition."""
    setting = _setting(case_id)
    for condition in capability.KDA_CONDITIONS + capability.GDN_CONDITIONS + capability.ATTENTION_CONDITIONS:  # fmt: skip
        if condition.setting == setting:
            return condition
    return None


@pytest.mark.parametrize("case_id", sorted(ALL_CASES))
def test_explicit_full_is_refused_at_config_time(model_dirs, monkeypatch, case_id):
    case = ALL_CASES[case_id]
    with case_env(monkeypatch, case, case_id):
        if case_id in UPSTREAM_TURNS_OFF:
            assert prefill_backend(resolve(model_dirs, case)) == Backend.DISABLED
            return
        with pytest.raises(ValueError) as err:
            resolve(model_dirs, case)
    message = str(err.value)
    assert "The full prefill CUDA graph requested" in message
    assert "--cuda-graph-backend-prefill disabled" in message
    if case_id == "--linear-attn-prefill-backend":
        assert "not flashinfer" in message
        assert "set --linear-attn-prefill-backend triton" in message
    if case_id == "SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND":
        assert "unset SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND" in message
    if case_id == "--linear-attn-verify-backend":
        assert "set --linear-attn-verify-backend triton" in message
    if _setting(case_id) == GDN_PAGE_MAJOR:
        assert "page-major KV layout" in message
    if case_id == KDA_SWITCH or case_id.startswith(MAMBA2_SWITCH):
        assert "has no capturable extend" in message
    if case_id == MAMBA2_MIXER:
        assert "runs MambaMixer2 layers only" in message
        assert "short-conv layers (ShortConvAttnBackend: LFM2) run on per-bucket tables that are switched off here (LFM2_FULL_PREFILL_GRAPH)" in message  # fmt: skip
    if case_id == "--enable-mixed-chunk":
        assert "drop --enable-mixed-chunk" in message
    if case_id == "--enable-two-batch-overlap":
        assert "drop --enable-two-batch-overlap" in message
    if _setting(case_id) == LAYER_SCAN:
        assert "sglang 0.5.23 captures no prefill graph for this model" in message
        layers = (
            "NemotronH's MLP ('-')"
            if case_id.endswith("(NemotronH)")
            else "GraniteMoeHybrid's"
        )
        assert f"finds no attention module in {layers}" in " ".join(message.split())
        # Nothing to set keeps the full graph (dtype and attention advice
        # would not lift the layer scan's refusal).
        assert "keep it" not in message
    if case_id == "--dtype":
        assert "checked on a GPU in bfloat16 only" in message
        assert "serves in float16" in message and "set --dtype bfloat16" in message
    if case_id == MAMBA2_ATTENTION:
        assert "with the flashinfer attention backend only, not fa3" in message
        assert "set --attention-backend flashinfer" in message
    if _setting(case_id) == MAMBA2_GROUPS:
        assert "checked on a GPU with 1 or 8 groups only; this model's Mamba2 layers have 2" in message  # fmt: skip
        assert "keep it" not in message
    if case_id == MAMBA2_STATE:
        assert "float32 SSM / bfloat16 conv states only; this server has bfloat16 / bfloat16" in message  # fmt: skip
        assert "keep it: set --mamba-ssm-dtype float32." in message
    if case_id == f"{MAMBA2_STATE} (Mamba2)":
        assert "this server has float32 / float32" in message
        assert "keep it: set SGLANG_MAMBA_CONV_DTYPE=bfloat16." in message
    if case_id in MAMBA2_ON - {MAMBA2_MIXER}:
        assert "Mamba2" in message


@pytest.mark.parametrize("case_id", sorted(ALL_CASES))
def test_model_default_full_is_downgraded_with_one_warning(
    model_dirs, monkeypatch, caplog, case_id
):
    case = ALL_CASES[case_id]
    with case_env(monkeypatch, case, case_id), caplog.at_level(logging.WARNING):
        args = resolve(model_dirs, case, model_default_full=True)
    ours = [r.getMessage() for r in caplog.records if r.name == OURS]
    if case_id in UPSTREAM_TURNS_OFF:
        assert prefill_backend(args) == Backend.DISABLED and not ours
        return
    # sglang's own breakable rules keep KDA models off the breakable graph
    off = case[0] == "kimi_linear" or case_id in UPSTREAM_BREAKABLE_OFF
    assert prefill_backend(args) == (Backend.DISABLED if off else Backend.BREAKABLE)
    assert len(ours) == 1, ours
    assert "test_model_default" in ours[0] and "cannot be captured here" in ours[0]


def test_every_capture_time_refusal_has_a_config_time_case():
    """The capture-time check refuses only what the table names: each condition
    of a family or of the attention side, and each family that never captures."""
    refusals = {c.setting for f in capability.LINEAR_FAMILIES for c in f.conditions}
    refusals |= {c.setting for c in capability.ATTENTION_CONDITIONS}
    refusals |= {f.name for f in capability.LINEAR_FAMILIES if not f.captures}
    assert refusals == set(CASES) | NO_SAMPLE


@contextlib.contextmanager
def upstream_resolution(monkeypatch):
    """sglang-graphfix's config-time hook unwrapped: upstream's resolution only
    (the capture-time checks stay, as in a process that resolved without it)."""
    with monkeypatch.context() as m:
        for patch in PATCHES:
            if patch.target.startswith("sglang.srt.arg_groups."):
                owner, name = patch.target.rsplit(".", 1)
                module = pkgutil.resolve_name(owner)
                m.setattr(module, name, getattr(module, name).__wrapped__)
        yield


class _Kernel:
    """A non-Triton extend kernel, named as sglang's backend choice."""


def live_linear_backend(family):
    """The linear backend sglang builds for ``family`` from the published context:
    its extend kernel (resolve_linear_attn_backends), the fused-accept pool
    (KDAAttnBackend._can_fuse_accept_state) and --enable-mis, as __init__ sets them."""
    backends = resolve_linear_attn_backends()
    if family in ("qwen3_next", "kimi_linear"):
        triton = TritonGDNKernel if family == "qwen3_next" else TritonKDAKernel
        kernel = triton() if backends.prefill.is_triton() else _Kernel()
        if family == "qwen3_next":
            return make_gdn(kernel, enable_mis=get_exec().features.enable_mis)
        kda = make_kda(kernel)
        if KDAAttnBackend._can_fuse_accept_state(backends.verify):
            kda.accept_lens_pool = torch.ones(4, dtype=torch.int32)
        return kda
    if family == "lfm2":
        return ShortConvAttnBackend.__new__(ShortConvAttnBackend)
    mamba2 = Mamba2AttnBackend.__new__(Mamba2AttnBackend)
    # MambaAttnBackendBase.__init__ keeps its model runner, whose model config
    # the Mamba2 conditions read.
    mamba2._model_runner = SimpleNamespace(
        model_config=model_config_of(get_server_args())
    )
    return mamba2


def prefill_runner():
    """What the full prefill runner holds: the model runner's resolved prefill
    attention backend and MLA flag."""
    return SimpleNamespace(
        model_runner=SimpleNamespace(
            prefill_attention_backend_str=attention_backends()[0],
            use_mla_backend=uses_mla(get_server_args()),
        ),
        dllm_attention=None,
    )


@pytest.mark.parametrize("case_id", sorted(ALL_CASES))
def test_config_time_refuses_every_config_capture_time_would(
    model_dirs, monkeypatch, case_id
):
    """Resolved by upstream alone, the configuration keeps its full prefill graph
    and the capture-time check on the live backends refuses it, naming the same
    condition that config time refuses it for (the test above)."""
    case = ALL_CASES[case_id]
    with case_env(monkeypatch, case, case_id), upstream_resolution(monkeypatch):
        args = resolve(model_dirs, case)
        if case_id in UPSTREAM_TURNS_OFF:
            assert prefill_backend(args) == Backend.DISABLED  # never captured
            return
        assert prefill_backend(args) == Backend.FULL
        with simulated_gpu(case[4]):
            context = create_context(args, role="scheduler")
            with use_context(context):
                linear = live_linear_backend(case[0])
                support = capability.judge(
                    capability.settings_from_linear_backend(linear, prefill_runner())
                )
                with pytest.raises(ValueError, match="cannot capture"):
                    capability.require_capturable_full_prefill_graph(
                        linear, prefill_runner()
                    )
    assert _setting(case_id) in support.violated


# ---- advice that works on the GPU chosen ----


@pytest.mark.parametrize(
    "family, gpu, advised",
    [
        ("qwen3_next", "h200", "fa3 / fa4 / flashinfer"),
        ("qwen3_next", "h100", "fa3 / fa4 / flashinfer"),
        ("qwen3_next", "a100", "fa3 / flashinfer"),  # fa4: Hopper/Blackwell
        ("kimi_linear", "h200", "fa3 / fa4"),
        ("kimi_linear", "h100", "fa3 / fa4"),
        ("kimi_linear", "a100", None),  # fa3 asserts SM90 for MLA models
    ],
)
def test_attention_advice_names_only_backends_of_this_gpu(
    model_dirs, family, gpu, advised
):
    case = (family, {"attention_backend": "triton"}, {}, True, gpu)
    with pytest.raises(ValueError) as err:
        resolve(model_dirs, case)
    message = str(err.value)
    if advised:
        assert f"set --attention-backend {advised}." in message
    else:
        assert "--attention-backend fa" not in message
        assert "no attention backend that sglang runs on sm80" in message
        assert message.endswith("Use --cuda-graph-backend-prefill disabled instead.")


@pytest.mark.parametrize("gpu", ["h200", "h100", "a100"])
def test_fa3_on_an_mla_model_is_judged_on_the_gpu(model_dirs, gpu):
    """sglang's fa3 factory asserts SM90 for MLA models: a full graph on
    Kimi-Linear with fa3 captures on Hopper and is refused on an A100."""
    case = ("kimi_linear", {"attention_backend": "fa3"}, {}, True, gpu)
    if gpu != "a100":
        assert prefill_backend(resolve(model_dirs, case)) == Backend.FULL
        return
    with pytest.raises(ValueError, match="does not run MLA models on sm80"):
        resolve(model_dirs, case)


@pytest.mark.parametrize("gpu", ["h200", "a100"])
def test_fa3_on_an_mha_model_captures_on_ampere_and_hopper(model_dirs, gpu):
    case = ("qwen3_next", {"attention_backend": "fa3"}, {}, True, gpu)
    assert prefill_backend(resolve(model_dirs, case)) == Backend.FULL


def test_the_model_reads_the_gpu_from_sglangs_platform_probes(model_dirs):
    args = ServerArgs(model_path=model_dirs["kimi_linear"], attention_backend="fa3")
    with simulated_gpu("a100"):
        support = capability.full_prefill_graph_support(args)
        assert not support.capable and support.capturing_attention_backends == ()
    with simulated_gpu("h100"):
        support = capability.full_prefill_graph_support(args)
        assert support.capable and support.capturing_attention_backends == (
            "fa3",
            "fa4",
        )


# ---- Mamba2 with MAMBA2_FULL_PREFILL_GRAPH on ----


@pytest.mark.parametrize("family", ["nemotron_h_no_mlp", "falcon_h1"])
def test_mamba2_captures_as_shipped_and_is_refused_with_the_switch_off(
    model_dirs, monkeypatch, family
):
    """A plain Mamba2 hybrid (NemotronH of Mamba2 and attention layers,
    Falcon-H1) in bfloat16 with the resolved defaults: as shipped, the explicit
    full prefill graph stays full at config time and the capture-time check
    passes on the live Mamba2 backend; with the switch off it is refused at both."""
    case = (family, {"dtype": "bfloat16", "attention_backend": "flashinfer"}, {}, True, "h200")  # fmt: skip
    assert capability.MAMBA2_FULL_PREFILL_GRAPH is True
    args = resolve(model_dirs, case)
    assert prefill_backend(args) == Backend.FULL
    with simulated_gpu("h200"):
        context = create_context(args, role="scheduler")
        with use_context(context):
            linear = live_linear_backend(family)
            assert isinstance(linear, Mamba2AttnBackend)
            capability.require_capturable_full_prefill_graph(linear, prefill_runner())
            monkeypatch.setattr(capability, "MAMBA2_FULL_PREFILL_GRAPH", False)
            with pytest.raises(
                ValueError, match="MAMBA2_FULL_PREFILL_GRAPH|no capturable"
            ):
                capability.require_capturable_full_prefill_graph(
                    linear, prefill_runner()
                )
    with pytest.raises(ValueError, match="Mamba2/short-conv linear attention has no"):
        resolve(model_dirs, case)


def test_mamba1_mixer_is_refused_with_the_switch_on(monkeypatch):
    """Falcon-Mamba (Mamba-1 layers) rides the Mamba2 backend; its mixer reads
    host lengths, so the family's switch does not cover it."""
    monkeypatch.setattr(capability, "MAMBA2_FULL_PREFILL_GRAPH", True)
    settings = capability.Settings(
        architecture="FalconMambaForCausalLM", family="Mamba2/short-conv",
        mamba_mixer="mamba1",
    )  # fmt: skip
    support = capability.judge(settings)
    assert MAMBA2_MIXER in support.violated
    assert "Mamba-1 mixer (MambaMixer1: Falcon-Mamba, Mamba) reads host-side sequence lengths" in support.reasons[0]  # fmt: skip


@pytest.mark.parametrize("family", ["granite_moe_hybrid", "nemotron_h"])
def test_layer_scan_refusal_only_with_the_switch_on(model_dirs, monkeypatch, family):
    """With the layer-gaps switch off and the family's switch off, the models
    sglang's prefill graph setup turns off are refused exactly as the rest of the
    family, one reason, word for word; the layer scan's reason appears only with
    the family's switch on (as shipped)."""
    monkeypatch.setattr(capability, "MAMBA2_LAYER_GAPS_CAPTURED", False)
    case = (family, {}, {}, True, "h200")
    with pytest.raises(ValueError, match="captures no prefill graph for this model"):
        resolve(model_dirs, case)
    monkeypatch.setattr(capability, "MAMBA2_FULL_PREFILL_GRAPH", False)
    with pytest.raises(ValueError) as err:
        resolve(model_dirs, case)
    arch = {"granite_moe_hybrid": "GraniteMoeHybridForCausalLM", "nemotron_h": "NemotronHForCausalLM"}[family]  # fmt: skip
    assert str(err.value) == (
        "The full prefill CUDA graph requested (--cuda-graph-backend-prefill full / "
        f"--cuda-graph-config) cannot be captured: architecture {arch}, linear "
        "attention Mamba2/short-conv, full-attention backend fa3; Mamba2/short-conv "
        "linear attention has no capturable extend (its kernels read host-side "
        "sequence lengths, and sglang plans only its decode and verify out of "
        "graph). Use --cuda-graph-backend-prefill breakable or "
        "--cuda-graph-backend-prefill disabled instead."
    )


@pytest.mark.parametrize(
    "family, gaps",
    [
        ("nemotron_h_mlp_moe", None),  # MoE layers: not covered yet
        ("nemotron_h", 1),
        ("granite_moe_hybrid", 1),
        ("nemotron_h_no_mlp", None),
    ],
)
def test_layer_gaps_captured_switch(model_dirs, monkeypatch, family, gaps):
    """NemotronH's MLP layers and GraniteMoeHybrid's Mamba2 layers, which
    sglang's prefill graph setup finds no attention in: refused for the layer
    scan with MAMBA2_LAYER_GAPS_CAPTURED off, that reason gone with it on (as
    shipped: the scan's hook keeps the graph for them); a model without such
    layers is not affected."""
    path = model_dirs[family]
    model_config = model_config_of(ServerArgs(model_path=path))
    gap = capability.layer_gap(model_config)
    assert (gap.full_graph_layers if gap else None) == gaps
    covered = gap is not None and gaps is not None
    case = (family, {"dtype": "bfloat16", "attention_backend": "flashinfer"}, {}, True, "h200")  # fmt: skip
    # The shipped value (on since the H200 checks of 2026-12-02).
    assert capability.MAMBA2_LAYER_GAPS_CAPTURED is True

    def outcome():
        try:
            return prefill_backend(resolve(model_dirs, case))
        except ValueError as err:
            return str(err)

    lifted = outcome()
    monkeypatch.setattr(capability, "MAMBA2_LAYER_GAPS_CAPTURED", False)
    switched_off = outcome()
    scan_refusal = "captures no prefill graph for this model"
    assert (scan_refusal in switched_off) == (gap is not None)
    assert (scan_refusal in lifted) == (gap is not None and not covered)
    if covered and family != "nemotron_h":  # 8 groups: refused for that instead
        assert lifted == Backend.FULL


def test_nemotron_h_moe_layers_with_their_switch(model_dirs, monkeypatch):
    """NemotronH's MoE layers: refused for the layer scan as shipped
    (NEMOTRON_H_MOE_LAYERS_CAPTURED off, no GPU case run yet); with that switch
    on, counted beside the MLP layers and the scan's refusal gone."""
    assert capability.NEMOTRON_H_MOE_LAYERS_CAPTURED is False
    model_config = model_config_of(
        ServerArgs(model_path=model_dirs["nemotron_h_mlp_moe"])
    )
    case = ("nemotron_h_mlp_moe", {"dtype": "bfloat16", "attention_backend": "flashinfer"}, {}, True, "h200")  # fmt: skip

    def outcome():
        try:
            return prefill_backend(resolve(model_dirs, case))
        except ValueError as err:
            return str(err)

    assert capability.layer_gap(model_config).full_graph_layers is None
    assert "captures no prefill graph for this model" in outcome()
    monkeypatch.setattr(capability, "NEMOTRON_H_MOE_LAYERS_CAPTURED", True)
    assert capability.layer_gap(model_config).full_graph_layers == 2
    assert outcome() == Backend.FULL


def test_lfm2_with_its_switch(model_dirs, monkeypatch):
    """LFM2's short-conv layers: captured as shipped (LFM2_FULL_PREFILL_GRAPH on
    since the GPU case lfm2 passed on the H200; as checked: bfloat16, flashinfer
    attention); with the switch off, refused naming it. ZAYA1's stay refused
    either way (Settings: no ZAYA1 sample config)."""
    assert capability.LFM2_FULL_PREFILL_GRAPH is True
    case = ("lfm2", {"dtype": "bfloat16", "attention_backend": "flashinfer"}, {}, True, "h200")  # fmt: skip

    def outcome():
        try:
            return prefill_backend(resolve(model_dirs, case))
        except ValueError as err:
            return " ".join(str(err).split())

    with case_env(monkeypatch, case, MAMBA2_MIXER):  # the switch off
        refused = outcome()
        assert "are switched off here (LFM2_FULL_PREFILL_GRAPH)" in refused
        # sglang's prefill graph setup finds no attention module in its conv
        # layers (they hold `conv`): no prefill graph upstream, as for Granite.
        assert "finds no attention module in LFM2's short-conv layers" in refused
        capability.LFM2_FULL_PREFILL_GRAPH = True  # case_env restores it
        # Every layer but "full_attention" is a conv layer.
        lfm2 = model_config_of(ServerArgs(model_path=model_dirs["lfm2_3_layers"]))
        assert capability.layer_gap(lfm2).full_graph_layers == 2
        assert capability.mamba_mixer_of_config(lfm2) == "lfm2"
        lfm2.hf_config.architectures = ["Lfm2BidirectionalModel"]  # host loops
        assert capability.mamba_mixer_of_config(lfm2) == "short-conv"
        assert outcome() == Backend.FULL
        zaya = capability.Settings(
            architecture="ZayaForCausalLM", family=capability.MAMBA2_FAMILY,
            mamba_mixer="short-conv",
        )  # fmt: skip
        support = capability.judge(zaya)
        assert MAMBA2_MIXER in support.violated
        assert "(ShortConvAttnBackend: ZAYA1, LFM2's bidirectional encoder) loop over host-side slots and lengths" in support.reasons[0]  # fmt: skip


def test_mamba2_group_counts_a_gpu_case_ran(model_dirs, monkeypatch):
    """MAMBA2_CHECKED's groups are the counts a GPU case ran (1, and 8 since
    nemotron_h_groups8 passed on the H200): 8 groups capture, another count is
    refused naming them, and without 8 among them 8 groups are refused."""
    assert capability.MAMBA2_CHECKED["groups"] == (1, 8)
    two = ALL_CASES[MAMBA2_GROUPS]
    eight = ("nemotron_h_no_mlp_8_groups", *two[1:])
    falcon = ALL_CASES[f"{MAMBA2_GROUPS} (Falcon-H1)"]  # 2 groups

    def outcome(case):
        try:
            return prefill_backend(resolve(model_dirs, case))
        except ValueError as err:
            return " ".join(str(err).split())

    with case_env(monkeypatch, two, MAMBA2_GROUPS):
        assert outcome(eight) == Backend.FULL
        assert "with 1 or 8 groups only; this model's Mamba2 layers have 2" in outcome(two)  # fmt: skip
        assert "with 1 or 8 groups only; this model's Mamba2 layers have 2" in outcome(falcon)  # fmt: skip
        monkeypatch.setitem(capability.MAMBA2_CHECKED, "groups", (1,))
        assert "with 1 group only; this model's Mamba2 layers have 8" in outcome(eight)


def test_pure_mamba2_stays_refused_with_layer_gaps_captured(monkeypatch):
    """Every layer of a pure Mamba2 model lacks attention: the scan's hook does
    not cover it (nor would the hybrid backend's capture), switch on or off."""
    monkeypatch.setattr(capability, "MAMBA2_LAYER_GAPS_CAPTURED", True)
    settings = capability.Settings(
        architecture="Mamba2ForCausalLM", family="Mamba2/short-conv",
        mamba_mixer="mamba2", layer_gap="any layer of a pure Mamba2 model",
    )  # fmt: skip
    assert LAYER_SCAN in capability.judge(settings).violated


def test_layer_gap_names_the_layers_sglangs_scan_misses(model_dirs):
    """layer_gap's phrase on the tiny configs: what sglang's
    compute_attention_and_moe_layers finds no attention module in (checked on
    sglang's own model classes, docs/mamba2_full_prefill_graph.md)."""
    gaps = {
        family: capability.layer_gap(
            model_config_of(ServerArgs(model_path=model_dirs[family]))
        )
        for family in ("nemotron_h", "nemotron_h_no_mlp", "falcon_h1", "granite_moe_hybrid", "qwen3_next")
    }  # fmt: skip
    gap = {family: g.layers if g else None for family, g in gaps.items()}
    assert gap == {
        "nemotron_h": "NemotronH's MLP ('-') layers",
        "nemotron_h_no_mlp": None,
        "falcon_h1": None,
        "granite_moe_hybrid": "GraniteMoeHybrid's Mamba2 layers",
        "qwen3_next": None,
    }


def test_mamba2_attention_advice_names_the_checked_backend_only(model_dirs):
    """A Mamba2 model with an attention backend that plans no full extend is
    advised the backend the Mamba2 engines were checked with, not every backend
    that plans one (fa3 would be refused next)."""
    case = ("nemotron_h_no_mlp", {"attention_backend": "triton"}, {}, True, "h200")
    with pytest.raises(ValueError) as err:
        resolve(model_dirs, case)
    message = str(err.value)
    assert "plans no extend for a full prefill graph" in message
    assert message.endswith("keep it: set --attention-backend flashinfer.")
