# SPDX-License-Identifier: Apache-2.0
"""sglang-graphfix: fixes for two CUDA-graph failures in sglang 0.5.23.

Loaded by sglang's general-plugin entry point (``sglang.srt.plugins``); the
patches themselves are indexed in ``sglang_graphfix.patches``.
"""

import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version

__version__ = "0.1.0"
SUPPORTED_SGLANG = "0.5.23"
# This plugin's own off switch (SGLANG_PLUGINS stays sglang's, for every plugin).
OFF_SWITCH = "SGLANG_GRAPHFIX"
_OFF_VALUES = ("0", "false", "off", "no")

# Every patch applied and verified in this process.
_registered = False
# Why this process must not serve: the patch set is partial or missing. Read by
# the start-up guard (patches.refuse_incomplete_patch_set), which raises it from
# server-argument resolution, where sglang does not swallow it.
_refusal: str | None = None

logger = logging.getLogger(__name__)


def installed_sglang() -> str:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return "not installed"


def graphfix_version() -> str:
    try:
        return version("sglang-graphfix")
    except PackageNotFoundError:
        return __version__


def switched_off() -> bool:
    return os.environ.get(OFF_SWITCH, "").strip().lower() in _OFF_VALUES


def announce(level: int, msg: str, *args) -> None:
    """Log one line that shows in this process's output whatever sglang's
    logging state. sglang loads plugins before it configures logging (and an
    Engine defaults to --log-level error), so a plain logger.info is lost: when
    no configured handler would show the record, it is written to stderr by a
    handler attached for this record only."""
    if logging.getLogger().handlers and logger.isEnabledFor(level):
        logger.log(level, msg, *args)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    handler.handle(logger.makeRecord(logger.name, level, __file__, 0, msg, args, None))


def refusal_message(cause: BaseException) -> str:
    detail = str(cause).removeprefix("sglang-graphfix: ")
    return (
        f"sglang-graphfix {graphfix_version()} refuses to start this server: its "
        f"patch set on sglang {SUPPORTED_SGLANG} is incomplete, so the server would "
        f"run with some of its fixes missing. {detail} To proceed, reinstall "
        f"sglang=={SUPPORTED_SGLANG} and sglang-graphfix (or remove the other plugin "
        f"that hooks the same function), or run without this plugin: "
        f"{OFF_SWITCH}=0, or `pip uninstall sglang-graphfix`."
    )


def register() -> None:
    """Entry point, once per process: apply and verify every patch on sglang
    0.5.23; on any other sglang patch nothing and log why at ERROR level; with
    SGLANG_GRAPHFIX=0 patch nothing and say so.

    The start-up guard is installed first: if the patch set then fails to apply
    (sglang's plugin loader only logs what this raises), the guard stops the
    server at server-argument resolution with the reason. If the guard itself
    cannot be installed, SystemExit, which sglang's loader does not catch.
    """
    global _registered, _refusal
    if _registered or _refusal is not None:
        return
    if switched_off():
        announce(
            logging.WARNING,
            "sglang-graphfix %s is off (%s=%s): nothing patched, sglang %s runs "
            "as upstream.",
            graphfix_version(),
            OFF_SWITCH,
            os.environ[OFF_SWITCH],
            installed_sglang(),
        )
        return
    found = installed_sglang()
    if found != SUPPORTED_SGLANG:
        announce(
            logging.ERROR,
            "sglang-graphfix supports sglang==%s only, found sglang==%s; nothing "
            "was patched. Install sglang==%s, or uninstall sglang-graphfix (or "
            "set %s=0).",
            SUPPORTED_SGLANG,
            found,
            SUPPORTED_SGLANG,
            OFF_SWITCH,
        )
        return
    try:
        # The guard lives with the patches: a package whose patch modules do not
        # import (a broken install, a missing sglang module) has no guard either.
        from sglang_graphfix import patches

        patches.install_guard()
    except Exception as exc:
        message = refusal_message(
            RuntimeError(
                "Its start-up guard could not be installed "
                f"({type(exc).__name__}: {exc})."
            )
        )
        announce(logging.ERROR, "%s", message)
        raise SystemExit(message) from exc
    try:
        applied = patches.apply_patches()
    except Exception as exc:
        _refusal = refusal_message(exc)
        announce(logging.ERROR, "%s", _refusal)
        raise
    _registered = True
    announce(
        logging.INFO,
        "sglang-graphfix %s: applied %d patches to sglang %s (%s=0 turns it off)",
        graphfix_version(),
        applied,
        found,
        OFF_SWITCH,
    )
