"""GPU tests: run on an H200 with sglang==0.5.23 and sglang-graphfix installed
(the engines' scheduler processes load it through the plugin entry point)."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from models import tiny_qwen3_next  # noqa: E402
from tiny_configs import write_config  # noqa: E402


@pytest.fixture(scope="session")
def qwen3_next_path(tmp_path_factory):
    return tiny_qwen3_next(tmp_path_factory.mktemp("qwen3_next"))


@pytest.fixture(scope="session")
def nemotron_h_path(tmp_path_factory):
    """Config only: the rejection comes before any weights load."""
    return write_config("nemotron_h", tmp_path_factory.mktemp("nemotron_h"))
