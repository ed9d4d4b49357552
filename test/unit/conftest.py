"""CPU tests: the real sglang 0.5.23 with sglang-graphfix applied, as the plugin
entry point applies it in every sglang process."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The working tree's package (CI also installs it, for the entry point) and the
# shared tiny configs.
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel" / "python"), str(ROOT / "test")]

import sglang_graphfix  # noqa: E402

sglang_graphfix.register()


@pytest.fixture(autouse=True)
def _restore_environ():
    """sglang's server-args resolution exports SGLANG_* variables
    (handle_environment_variables): every test starts from the same environment."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
