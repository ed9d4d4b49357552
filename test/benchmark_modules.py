"""benchmark/'s scripts as modules for the tests: they are scripts, not a
package on the path, so each loads from its file."""

import importlib.util
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmark"


def load_benchmark(name: str, module_name: str | None = None):
    """benchmark/<name>.py, executed afresh as module ``module_name`` (``name``)."""
    spec = importlib.util.spec_from_file_location(
        module_name or name, BENCHMARK / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
