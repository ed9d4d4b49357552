"""Server-args resolution of a full prefill CUDA graph, through sglang's own
handle_cuda_graph_config, for one tiny model of each linear-attention family."""

import logging

import pytest
from tiny_configs import FAMILIES, write_config

from sglang.srt.arg_groups.cuda_graph_hook import (
    apply_cuda_graph_compatibility,
    handle_cuda_graph_config,
    validate_cuda_graph_config,
)
from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
from sglang.srt.model_executor.cuda_graph_config import (
    Backend,
    Phase,
    default_cuda_graph_config,
    with_phase,
)
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.srt.arg_groups.cuda_graph_hook import linear_attention_family
from sglang.srt.arg_groups.overrides import model_config_of

CAPTURABLE = ["qwen3_next", "llama"]
NOT_CAPTURABLE = ["nemotron_h", "falcon_h1", "lfm2", "kimi_linear"]


def _server_args(tmp_path, family, **kwargs):
    args = ServerArgs(
        model_path=write_config(family, tmp_path), skip_tokenizer_init=True, **kwargs
    )
    args._resolved_overrides = []
    return args


def _prefill_backend(args):
    return resolving_view(args).cuda_graph_config.prefill.backend


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_the_backend_sglang_builds(tmp_path, family):
    args = _server_args(tmp_path, family)
    assert linear_attention_family(model_config_of(args)) == FAMILIES[family][2]


@pytest.mark.parametrize("family", CAPTURABLE)
def test_explicit_full_prefill_graph_is_kept(tmp_path, family):
    args = _server_args(
        tmp_path, family, cuda_graph_config={"prefill": {"backend": "full"}}
    )
    handle_cuda_graph_config(args)
    assert _prefill_backend(args) == Backend.FULL


@pytest.mark.parametrize("family", NOT_CAPTURABLE)
def test_explicit_full_prefill_graph_is_rejected_with_the_flag_to_use(tmp_path, family):
    arch = FAMILIES[family][1]
    args = _server_args(
        tmp_path, family, cuda_graph_config={"prefill": {"backend": "full"}}
    )
    with pytest.raises(ValueError) as err:
        handle_cuda_graph_config(args)
    message = str(err.value)
    assert arch in message and FAMILIES[family][2] in message
    assert "--cuda-graph-backend-prefill breakable" in message


def test_upstream_validation_alone_accepts_it(tmp_path):
    """What the fix adds: upstream's validation passes the same request."""
    args = _server_args(
        tmp_path, "nemotron_h", cuda_graph_config={"prefill": {"backend": "full"}}
    )
    declare_resolution(
        args,
        "test",
        cuda_graph_config=with_phase(
            default_cuda_graph_config(), Phase.PREFILL, backend=Backend.FULL
        ),
    )
    validate_cuda_graph_config.__wrapped__(args)
    with pytest.raises(ValueError):
        validate_cuda_graph_config(args)


@pytest.mark.parametrize("backend", ["breakable", "disabled"])
def test_other_prefill_backends_are_untouched(tmp_path, backend):
    args = _server_args(tmp_path, "nemotron_h", cuda_graph_backend_prefill=backend)
    handle_cuda_graph_config(args)
    assert _prefill_backend(args) == backend


def _automatic_full(args):
    """A full prefill backend chosen by resolution, not by the user (unlocked)."""
    declare_resolution(
        args,
        "test",
        cuda_graph_config=with_phase(
            default_cuda_graph_config(), Phase.PREFILL, backend=Backend.FULL
        ),
    )
    args._cuda_graph_config_locked = set()


def test_automatic_full_prefill_graph_is_downgraded_with_a_warning(tmp_path, caplog):
    args = _server_args(tmp_path, "nemotron_h")
    _automatic_full(args)
    with caplog.at_level(logging.WARNING):
        apply_cuda_graph_compatibility(args)
    assert _prefill_backend(args) == Backend.DISABLED
    assert "NemotronHForCausalLM" in caplog.text
    assert "--cuda-graph-backend-prefill breakable" in caplog.text
    validate_cuda_graph_config(args)  # the downgraded config validates


def test_automatic_full_prefill_graph_stays_on_gdn(tmp_path, caplog):
    args = _server_args(tmp_path, "qwen3_next")
    _automatic_full(args)
    with caplog.at_level(logging.WARNING):
        apply_cuda_graph_compatibility(args)
    assert _prefill_backend(args) == Backend.FULL
    assert "Disabling the full prefill" not in caplog.text
