"""Registration: the version guard, the patch index, and loud failure."""

import importlib.metadata
import logging

import pytest

import sglang.srt.plugins as sglang_plugins
import sglang_graphfix
from sglang.srt.arg_groups import cuda_graph_hook
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang_graphfix.patches import PATCHES, Patch, _lookup, apply_patches


def _noop_hook(original, *args, **kwargs):
    return original(*args, **kwargs)


def test_every_indexed_patch_wraps_its_upstream_target():
    for patch in PATCHES:
        current = _lookup(patch.target)
        assert hasattr(current, "__wrapped__"), patch.target
        assert current.__name__ == patch.target.rsplit(".", 1)[1]


def test_other_sglang_version_patches_nothing_and_logs_why(monkeypatch, caplog):
    monkeypatch.setattr(sglang_graphfix, "_registered", False)
    monkeypatch.setattr(sglang_graphfix, "version", lambda _: "0.5.24")

    def must_not_run():
        raise AssertionError("patches applied for the wrong sglang")

    monkeypatch.setattr("sglang_graphfix.patches.apply_patches", must_not_run)
    with caplog.at_level(logging.ERROR, logger="sglang_graphfix"):
        assert sglang_graphfix.register() is None
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert "supports sglang==0.5.23 only, found sglang==0.5.24" in record.getMessage()
    assert "nothing was patched" in record.getMessage()
    assert not sglang_graphfix._registered


def test_missing_target_patches_nothing():
    real = "sglang.srt.arg_groups.cuda_graph_hook.generate_cpu_graph_batch_sizes"
    before = _lookup(real)
    with pytest.raises(RuntimeError, match="not found, nothing patched"):
        apply_patches(
            [
                Patch(real, _noop_hook, HookType.AROUND),
                Patch(
                    "sglang.srt.arg_groups.cuda_graph_hook.no_such_fn",
                    _noop_hook,
                    HookType.AROUND,
                ),
            ]
        )
    assert _lookup(real) is before
    assert real not in HookRegistry._hooks


def test_hook_that_fails_to_apply_raises():
    # HookRegistry refuses AROUND on a class and only logs it; we must raise.
    target = "sglang.srt.plugins.hook_registry.HookSource"
    try:
        with pytest.raises(RuntimeError, match="did not apply: " + target):
            apply_patches([Patch(target, _noop_hook, HookType.AROUND)])
    finally:
        HookRegistry._hooks.pop(target, None)


def test_sglang_plugin_loader_runs_the_entry_point(monkeypatch, caplog):
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert [ep.value for ep in eps if ep.name == "graphfix"] == [
        "sglang_graphfix:register"
    ]
    monkeypatch.setattr(sglang_plugins, "_plugins_loaded", False)
    monkeypatch.setenv("SGLANG_PLUGINS", "graphfix")
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins"):
        sglang_plugins.load_plugins()
    assert "Executed general plugin: graphfix" in caplog.text
    assert "Failed" not in caplog.text
    assert hasattr(
        cuda_graph_hook.finalize_cuda_graph_prefill_max_context, "__wrapped__"
    )
