"""Registration: the version guard, the patch index, and loud failure."""

import logging

import pytest

import sglang_graphfix
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
    assert sglang_graphfix._refusal is None  # a newer sglang may have the fixes


def test_a_target_another_hook_already_holds_is_named():
    """A target HookRegistry already counts as patched (another plugin applied
    its hooks there first) does not get ours: apply_patches names it."""
    real = "sglang.srt.arg_groups.cuda_graph_hook.generate_cpu_graph_batch_sizes"
    HookRegistry._patched.add(real)
    try:
        with pytest.raises(RuntimeError, match="_noop_hook on " + real):
            apply_patches([Patch(real, _noop_hook, HookType.AROUND)])
    finally:
        HookRegistry._patched.discard(real)
        HookRegistry._hooks.pop(real, None)


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
        with pytest.raises(
            RuntimeError, match="did not apply 1 of 1 patches: _noop_hook on " + target
        ):
            apply_patches([Patch(target, _noop_hook, HookType.AROUND)])
    finally:
        HookRegistry._hooks.pop(target, None)
