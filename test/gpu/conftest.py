"""GPU tests: run on an H200 with sglang==0.5.23 and sglang-graphfix installed
(the engines' scheduler processes load it through the plugin entry point).
`python3 -m pytest` leaves them out (pyproject.toml's testpaths); named
explicitly (`python3 -m pytest test/gpu`), they skip where no CUDA device is.

Imports: pytest puts this folder on sys.path (a conftest outside a package) and
pyproject.toml's pythonpath puts test/ (tiny_configs) there."""

from pathlib import Path

import pytest
import torch
from models import tiny_qwen3_5_moe, tiny_qwen3_next
from tiny_configs import write_config


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason="no CUDA device: test/gpu runs on a GPU (an H200 for the engine tests)"
    )
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def qwen3_next_path(tmp_path_factory):
    return tiny_qwen3_next(tmp_path_factory.mktemp("qwen3_next"))


@pytest.fixture(scope="session")
def qwen3_5_moe_path(tmp_path_factory):
    return tiny_qwen3_5_moe(tmp_path_factory.mktemp("qwen3_5_moe"))


@pytest.fixture(scope="session")
def nemotron_h_path(tmp_path_factory):
    """Config only: the rejection comes before any weights load."""
    return write_config("nemotron_h", tmp_path_factory.mktemp("nemotron_h"))
