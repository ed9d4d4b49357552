"""``sglang-graphfix explain`` on bad input: sglang's (or our) error as one line on
stderr with a hint, exit status 2, nothing on stdout, and no network."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_graphfix import cli

ROOT = Path(__file__).resolve().parents[2]
HINT = "(see sglang-graphfix explain --help)"


def run(capsys, *argv):
    start = time.monotonic()
    status = cli.main(["explain", *argv])
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    return status, out, err, elapsed


def assert_one_line(status, out, err, message):
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("sglang-graphfix explain: error: ")
    assert message in err
    assert err.rstrip("\n").endswith(HINT)


@pytest.mark.parametrize(
    "argv, message",
    [
        # sglang's parser: an unknown flag, a bad choice, a bad int, bad JSON.
        (["--bogus-flag", "1"], "unrecognized arguments: --bogus-flag 1"),
        (
            ["--cuda-graph-backend-prefill", "fulll"],
            "argument --cuda-graph-backend-prefill: invalid choice: 'fulll' "
            "(choose from 'full', 'breakable', 'disabled')",
        ),
        (["--tp-size", "two"], "argument --tp-size/--tensor-parallel-size: invalid int value: 'two'"),
        (
            ["--cuda-graph-config", "{bad"],
            "argument --cuda-graph-config: --cuda-graph-config must be JSON: "
            "Expecting property name enclosed in double quotes",
        ),
        (
            ["--cuda-graph-config", '{"prefil": {"backend": "full"}}'],
            "unknown phase 'prefil'",
        ),
        # explain's own options.
        (["--gpu", "b200"], "argument --gpu: invalid choice: 'b200'"),
        (["--sample", "nope"], "argument --sample: invalid choice: 'nope'"),
    ],
)  # fmt: skip
def test_bad_flag_is_one_line(capsys, argv, message):
    status, out, err, elapsed = run(capsys, *argv)
    assert_one_line(status, out, err, message)
    assert "usage:" not in err and "sglang serve" not in err
    assert elapsed < 10


def test_missing_model_directory(capsys, tmp_path):
    missing = tmp_path / "no-such-model"
    status, out, err, elapsed = run(capsys, "--model-path", str(missing))
    assert_one_line(status, out, err, f"--model-path {missing}: no such directory")
    assert "Repo id" not in err and "--allow-download" not in err
    assert elapsed < 2


def test_model_directory_without_config(capsys, tmp_path):
    status, out, err, _ = run(capsys, "--model-path", str(tmp_path))
    assert_one_line(
        status, out, err, f"--model-path {tmp_path}: the directory has no config.json"
    )


def test_hub_id_needs_allow_download(capsys, monkeypatch):
    """A hub id is not looked up (no request, no retries) unless asked for."""

    def no_network(*args, **kwargs):
        raise AssertionError("explain reached the network")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", no_network)
    monkeypatch.setattr("socket.create_connection", no_network)
    status, out, err, elapsed = run(capsys, "--model-path", "deepseek-ai/DeepSeek-V3.2")
    assert_one_line(
        status,
        out,
        err,
        "--model-path deepseek-ai/DeepSeek-V3.2: no such directory; to read a "
        "Hugging Face Hub model's config.json, add --allow-download",
    )
    assert elapsed < 2


def test_without_allow_download_hugging_face_is_offline(capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    seen = {}
    resolve = cli.resolve

    def record(*args, **kwargs):
        seen["offline"] = os.environ.get("HF_HUB_OFFLINE")
        return resolve(*args, **kwargs)

    monkeypatch.setattr(cli, "resolve", record)
    assert cli.main(["explain", "--sample", "llama"]) == 0
    assert seen["offline"] == "1"


def test_no_command(capsys):
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err == (
        "sglang-graphfix: error: the following arguments are required: command "
        "(see sglang-graphfix --help)\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cuda-graph-config", "{bad"], "--cuda-graph-config must be JSON"),
        (["--model-path", "/no/such/model"], "--model-path /no/such/model: no such directory"),
    ],
)  # fmt: skip
def test_console_run_prints_one_line(argv, message):
    """As a user runs it: sglang's parser would print its whole usage (hundreds
    of lines, as 'sglang serve'); explain prints one line."""
    path = os.pathsep.join(str(ROOT / d) for d in ("python", "sgl-kernel/python"))
    done = subprocess.run(
        [sys.executable, "-m", "sglang_graphfix.cli", "explain", *argv],
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert message in lines[0] and lines[0].endswith(HINT)
