"""CPU tests: the real sglang 0.5.23 with sglang-graphfix applied, as the plugin
entry point applies it in every sglang process."""

import os

import pytest

# pyproject.toml's pytest `pythonpath` puts the working tree's package first (CI
# also installs it, for the entry point) and the shared test helpers (test/).
import sglang_graphfix

sglang_graphfix.register()


@pytest.fixture(autouse=True)
def _restore_environ():
    """sglang's server-args resolution exports SGLANG_* variables
    (handle_environment_variables): every test starts from the same environment."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
