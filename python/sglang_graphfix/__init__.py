# SPDX-License-Identifier: Apache-2.0
"""sglang-graphfix: fixes for two CUDA-graph failures in sglang 0.5.23.

Loaded by sglang's general-plugin entry point (``sglang.srt.plugins``); the
patches themselves are indexed in ``sglang_graphfix.patches``.
"""

from importlib.metadata import version

SUPPORTED_SGLANG = "0.5.23"
_registered = False


def register() -> None:
    """Entry point: refuse any sglang but 0.5.23, else apply and verify every patch
    (once per process).

    sglang's plugin loader logs what this raises (with the traceback) and starts
    without the patches.
    """
    global _registered
    if _registered:
        return
    installed = version("sglang")
    if installed != SUPPORTED_SGLANG:
        raise RuntimeError(
            f"sglang-graphfix patches sglang=={SUPPORTED_SGLANG} only, found "
            f"sglang=={installed}; nothing was patched. Install "
            f"sglang=={SUPPORTED_SGLANG} or uninstall sglang-graphfix."
        )
    from sglang_graphfix.patches import apply_patches

    apply_patches()
    _registered = True
