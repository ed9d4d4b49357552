# SPDX-License-Identifier: Apache-2.0
"""sglang-graphfix: fixes for two CUDA-graph failures in sglang 0.5.23.

Loaded by sglang's general-plugin entry point (``sglang.srt.plugins``); the
patches themselves are indexed in ``sglang_graphfix.patches``.
"""

import logging
from importlib.metadata import PackageNotFoundError, version

SUPPORTED_SGLANG = "0.5.23"
_registered = False

logger = logging.getLogger(__name__)


def installed_sglang() -> str:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return "not installed"


def register() -> None:
    """Entry point: apply and verify every patch on sglang 0.5.23 (once per
    process); on any other sglang, patch nothing and log why at ERROR level.

    A patch that HookRegistry did not apply raises (sglang's plugin loader logs
    it with the traceback).
    """
    global _registered
    if _registered:
        return
    found = installed_sglang()
    if found != SUPPORTED_SGLANG:
        logger.error(
            "sglang-graphfix supports sglang==%s only, found sglang==%s; nothing "
            "was patched. Install sglang==%s, or uninstall sglang-graphfix (or "
            "leave graphfix out of SGLANG_PLUGINS).",
            SUPPORTED_SGLANG,
            found,
            SUPPORTED_SGLANG,
        )
        return
    from sglang_graphfix.patches import apply_patches

    apply_patches()
    _registered = True
