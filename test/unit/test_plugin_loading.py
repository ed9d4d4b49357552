"""Loading through sglang's own plugin loader: the refusal sglang cannot swallow,
the off switch, the line every server process logs, ``status`` and ``--version``.

Fresh processes where the point is a whole process (a partial patch set,
``sglang serve``); in this process otherwise, with the patch set conftest applied.
"""

import importlib.metadata
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sglang.srt.plugins as sglang_plugins
import sglang_graphfix
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang_graphfix import patches, status
from sglang_graphfix.cli import SAMPLE_CONFIGS, simulated_gpu

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(SAMPLE_CONFIGS / "qwen3-next")
REPLAY = (
    "sglang.srt.layers.attention.hybrid_linear_attn_backend."
    "MambaAttnBackendBase._replay_metadata"
)


def _installed_entry_point() -> bool:
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    return any(ep.name == "graphfix" for ep in eps)


@pytest.fixture(scope="module")
def entry_point_dir(tmp_path_factory):
    """A directory whose metadata declares the ``graphfix`` entry point, for a
    checkout that is not pip-installed (None when it is installed): sglang's
    load_plugins() finds the plugin exactly as after ``pip install``."""
    if _installed_entry_point():
        return None
    root = tmp_path_factory.mktemp("entry_point")
    dist = root / f"sglang_graphfix-{sglang_graphfix.__version__}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang-graphfix\nVersion: {sglang_graphfix.__version__}\n"
    )
    (dist / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\ngraphfix = sglang_graphfix:register\n"
    )
    return str(root)


@pytest.fixture
def fresh_loader(monkeypatch, entry_point_dir):
    """sglang's load_plugins() may run again in this process, and finds graphfix."""
    if entry_point_dir:
        monkeypatch.syspath_prepend(entry_point_dir)
    monkeypatch.setattr(sglang_plugins, "_plugins_loaded", False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv("SGLANG_GRAPHFIX", raising=False)


def _env(entry_point_dir, **extra):
    path = [str(ROOT / "python"), str(ROOT / "sgl-kernel" / "python")]
    if entry_point_dir:
        path.insert(0, entry_point_dir)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_PLUGINS", "SGLANG_GRAPHFIX")
    }
    env.update(PYTHONPATH=os.pathsep.join(path), PYTHONWARNINGS="ignore", **extra)
    return env


def _plugin_lines(caplog, capsys):
    """What the plugin logged: through logging where a configured handler shows
    it, else the line written to stderr (its "[date time] " prefix cut)."""
    err = [re.sub(r"^\[[^]]*\] ", "", x) for x in capsys.readouterr().err.splitlines()]
    return [r.getMessage() for r in caplog.records if r.name == "sglang_graphfix"] + [
        x for x in err if x.startswith("sglang-graphfix")
    ]


def _resolve(args):
    with simulated_gpu("h200"):
        args.resolve_once()
    return args


def test_sglang_plugin_loader_runs_the_entry_point(monkeypatch, fresh_loader, caplog):
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert [ep.value for ep in eps if ep.name == "graphfix"] == [
        "sglang_graphfix:register"
    ]
    monkeypatch.setenv("SGLANG_PLUGINS", "graphfix")
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins"):
        sglang_plugins.load_plugins()
    assert "Executed general plugin: graphfix" in caplog.text
    assert "Failed" not in caplog.text
    assert all(patches.patch_applied(p) for p in patches.PATCHES)


# -- a partial patch set: the server does not start --------------------------

# Run as a fresh sglang process: a target is made unpatchable before sglang's
# load_plugins() runs graphfix's register(); the loader swallows what register
# raises, then status, the launch_server/serve argument path and an Engine start.
_PARTIAL = textwrap.dedent(
    """
    import sys
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as m

    how, target = sys.argv[1], sys.argv[2]
    if how == "held":  # another plugin already holds (applied) this target
        HookRegistry._patched.add(target)
    else:  # the target is gone
        del m.MambaAttnBackendBase._replay_metadata

    from sglang.srt.plugins import load_plugins
    load_plugins()
    print("LOADER RETURNED", flush=True)

    from sglang_graphfix.status import main as status_main
    print("STATUS EXIT", status_main([]), flush=True)

    from sglang.srt.server_args import prepare_server_args
    from sglang_graphfix.cli import simulated_gpu
    args = prepare_server_args(["--model-path", sys.argv[3]])
    try:
        with simulated_gpu("h200"):
            args.resolve_once()
    except RuntimeError as exc:
        print("SERVER ARGS REFUSED:", exc, flush=True)

    import sglang
    try:
        sglang.Engine(model_path=sys.argv[3])
    except RuntimeError as exc:
        print("ENGINE REFUSED:", exc, flush=True)
    """
)


@pytest.mark.parametrize(
    "how, named",
    [
        ("held", "replay_metadata_requires_graph_state on " + REPLAY),
        ("gone", REPLAY + " (type object 'MambaAttnBackendBase' has no attribute"),
    ],
)
def test_partial_patch_set_stops_server_args_and_engine(entry_point_dir, how, named):
    done = subprocess.run(
        [sys.executable, "-c", _PARTIAL, how, REPLAY, SAMPLE],
        capture_output=True,
        text=True,
        env=_env(entry_point_dir),
        timeout=600,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    # sglang's loader logged register's error and carried on ...
    assert "Failed to execute general plugin: graphfix" in out
    assert "LOADER RETURNED" in out
    # ... but the refusal was printed, status says what is missing and exits 1,
    assert re.search(
        r"^\[.*\] sglang-graphfix \S+ refuses to start this server", out, re.M
    )
    assert "STATUS EXIT 1" in out
    assert "refusal        sglang-graphfix" in out
    # and server-argument resolution (sglang serve / launch_server) and an
    # Engine start both refuse, naming the patch and the way out.
    for step in ("SERVER ARGS REFUSED:", "ENGINE REFUSED:"):
        (line,) = [line for line in out.splitlines() if line.startswith(step)]
        assert named in line, line
        assert "SGLANG_GRAPHFIX=0" in line and "pip uninstall sglang-graphfix" in line


def test_guard_refuses_resolution_while_a_refusal_is_recorded(monkeypatch):
    """The guard is installed on ServerArgs.resolve_once in this process too: a
    recorded refusal stops resolution on both argument paths; none, and it is
    transparent."""
    assert patches.patch_applied(
        patches.Patch(patches.GUARD_TARGET, patches.refuse_incomplete_patch_set, None)
    )
    _resolve(ServerArgs(model_path=SAMPLE))
    monkeypatch.setattr(sglang_graphfix, "_refusal", "graphfix refusal for the test")
    for args in (
        ServerArgs(model_path=SAMPLE),
        prepare_server_args(["--model-path", SAMPLE]),
    ):
        with pytest.raises(RuntimeError, match="graphfix refusal for the test"):
            _resolve(args)


def test_guard_that_cannot_be_installed_exits_through_sglangs_loader(
    monkeypatch, fresh_loader
):
    """No guard, no later refusal: register raises SystemExit, which sglang's
    loader (``except Exception``) does not catch."""
    monkeypatch.setattr(sglang_graphfix, "_registered", False)

    def no_guard():
        raise RuntimeError("HookRegistry did not apply the guard")

    monkeypatch.setattr(patches, "install_guard", no_guard)
    monkeypatch.setattr(
        patches, "apply_patches", lambda: pytest.fail("patched unguarded")
    )
    with pytest.raises(SystemExit, match="start-up guard could not be installed"):
        sglang_plugins.load_plugins()


def test_patch_modules_that_fail_to_import_exit_through_sglangs_loader(
    monkeypatch, fresh_loader
):
    """A patch module that does not import (seen on the H200: a source file with
    merge markers) leaves no guard: register raises SystemExit, so the server
    cannot start silently without its fixes."""
    monkeypatch.setattr(sglang_graphfix, "_registered", False)
    monkeypatch.delattr(sglang_graphfix, "patches")
    monkeypatch.setitem(sys.modules, "sglang_graphfix.patches", None)
    with pytest.raises(
        SystemExit, match="start-up guard could not be installed .ModuleNotFoundError"
    ):
        sglang_plugins.load_plugins()


def test_other_sglang_version_logs_error_and_does_not_refuse(
    monkeypatch, fresh_loader, caplog, capsys
):
    monkeypatch.setattr(sglang_graphfix, "_registered", False)
    monkeypatch.setattr(sglang_graphfix, "version", lambda name: "0.5.24")
    monkeypatch.setattr(patches, "install_guard", lambda: pytest.fail("guarded"))
    monkeypatch.setattr(patches, "apply_patches", lambda: pytest.fail("patched"))
    sglang_plugins.load_plugins()
    (line,) = _plugin_lines(caplog, capsys)
    assert (
        "supports sglang==0.5.23 only, found sglang==0.5.24; nothing was patched"
        in line
    )
    assert sglang_graphfix._refusal is None
    _resolve(ServerArgs(model_path=SAMPLE))


# -- the off switch ------------------------------------------------------------


def test_off_switch_patches_nothing_says_so_and_does_not_refuse(
    monkeypatch, fresh_loader, caplog, capsys
):
    monkeypatch.setattr(sglang_graphfix, "_registered", False)
    monkeypatch.setenv("SGLANG_GRAPHFIX", "0")
    monkeypatch.setattr(patches, "install_guard", lambda: pytest.fail("guarded"))
    monkeypatch.setattr(patches, "apply_patches", lambda: pytest.fail("patched"))
    sglang_plugins.load_plugins()
    (line,) = _plugin_lines(caplog, capsys)
    assert re.fullmatch(
        r"sglang-graphfix \S+ is off \(SGLANG_GRAPHFIX=0\): nothing patched, "
        r"sglang 0\.5\.23 runs as upstream\.",
        line,
    )
    assert sglang_graphfix._refusal is None
    _resolve(ServerArgs(model_path=SAMPLE))
    selected, why = status.selection()
    assert not selected and why == "switched off by SGLANG_GRAPHFIX=0"


def test_sglang_plugins_none_still_turns_off_every_plugin(monkeypatch, fresh_loader):
    monkeypatch.setattr(sglang_graphfix, "_registered", False)
    monkeypatch.setenv("SGLANG_PLUGINS", "none")
    monkeypatch.setattr(patches, "apply_patches", lambda: pytest.fail("patched"))
    sglang_plugins.load_plugins()
    assert status.selection() == (False, "SGLANG_PLUGINS=none leaves 'graphfix' out")


# -- visible in a running server -----------------------------------------------


def test_sglang_serve_log_shows_the_plugin_line(entry_point_dir, tmp_path):
    """`sglang serve` on this CPU machine: the plugin's line (version, patches
    applied) is in its default output, whatever happens after (no GPU here)."""
    serve = Path(sys.executable).parent / "sglang"
    command = (
        [str(serve)] if serve.exists() else [sys.executable, "-m", "sglang.cli.main"]
    )
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*command, "serve", "--model-path", SAMPLE, "--port", "39217"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(entry_point_dir),
            cwd=tmp_path,
            start_new_session=True,
        )
        line = re.compile(
            r"^\[.*\] sglang-graphfix \S+: applied \d+ patches to sglang 0\.5\.23", re.M
        )
        deadline = time.monotonic() + 180
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                if line.search(log.read_text()):
                    break
                time.sleep(1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert line.search(text), text[-3000:]
    assert f"applied {len(patches.PATCHES)} patches" in text


def test_line_shows_once_whatever_the_logging_state(monkeypatch, caplog, capsys):
    root = logging.getLogger()
    # configured logging that shows INFO: through it, not stderr as well
    with caplog.at_level(logging.INFO, logger="sglang_graphfix"):
        sglang_graphfix.announce(logging.INFO, "graphfix %s", "line")
    assert [r.getMessage() for r in caplog.records] == ["graphfix line"]
    assert "graphfix line" not in capsys.readouterr().err
    # nothing configured that would show it (sglang before configure_logger):
    # written to stderr, once
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    caplog.clear()
    sglang_graphfix.announce(logging.INFO, "graphfix %s", "line")
    assert re.fullmatch(r"\[.*\] graphfix line\n", capsys.readouterr().err)


def test_version_names_ours_and_the_sglang_found(entry_point_dir):
    done = subprocess.run(
        [sys.executable, "-m", "sglang_graphfix.cli", "--version"],
        capture_output=True,
        text=True,
        env=_env(entry_point_dir),
        check=True,
    )
    assert done.stdout.strip() == (
        f"sglang-graphfix {sglang_graphfix.graphfix_version()} "
        "(sglang 0.5.23 found; supports sglang 0.5.23)"
    )


# -- status ----------------------------------------------------------------------


def test_status_all_applied_exits_0(monkeypatch, fresh_loader, capsys):
    assert status.main([]) == 0
    out = capsys.readouterr().out
    assert f"{len(patches.PATCHES)} of {len(patches.PATCHES)} patches applied" in out
    assert "guard          installed on server_args.ServerArgs.resolve_once" in out
    for patch in patches.PATCHES:
        assert f"[applied] {patch.hook.__name__}" in out


def test_status_names_a_patch_missing_in_this_process(
    monkeypatch, fresh_loader, capsys
):
    owner_path, name = REPLAY.rsplit(".", 1)
    import pkgutil

    owner = pkgutil.resolve_name(owner_path)
    monkeypatch.setattr(owner, name, getattr(owner, name).__wrapped__)
    assert status.main([]) == 1
    out = capsys.readouterr().out
    assert "[MISSING] replay_metadata_requires_graph_state" in out
    assert "; a server started here would NOT have every fix" in out


def test_every_patch_has_the_header_status_shows():
    for patch in patches.PATCHES:
        fields = status.header(patch.hook)
        missing = [f for f in status.HEADER_FIELDS if not fields.get(f)]
        assert not missing, f"{patch.hook.__name__}: no {missing} header line"
        assert fields["Upstream"].startswith("sglang/"), patch.hook.__name__


def test_readme_patch_table_is_generated_from_patches():
    readme = (ROOT / "README.md").read_text()
    match = re.search(
        r"<!-- patches:begin -->\n(.*?)\n<!-- patches:end -->", readme, re.S
    )
    assert match, "README.md lost its <!-- patches:begin/end --> markers"
    assert match.group(1) == status.patch_table(), (
        "README's patch table differs from PATCHES: regenerate it with "
        "`python3 -m sglang_graphfix.status --patch-table`"
    )


def test_cli_status_subcommand(monkeypatch, fresh_loader, capsys):
    from sglang_graphfix import cli

    assert cli.main(["status", "--patch-table"]) == 0
    assert capsys.readouterr().out.strip() == status.patch_table()
    monkeypatch.setenv("SGLANG_GRAPHFIX", "off")
    assert cli.main(["status"]) == 1
    assert (
        "plugin         switched off by SGLANG_GRAPHFIX=off" in capsys.readouterr().out
    )
