# SPDX-License-Identifier: Apache-2.0
"""``sglang-graphfix status``: what an sglang server started here would get from
this plugin -- the sglang found, whether sglang selects the plugin, and each
patch (its target, the upstream bug, the upstream change, when it can go) with
whether it applied in this process after sglang's own ``load_plugins()``.

``python3 -m sglang_graphfix.status --patch-table`` prints the README's patch
table, generated from ``PATCHES``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import textwrap
from importlib.metadata import entry_points

ENTRY_POINT = "graphfix"
HEADER_FIELDS = ("What", "Why", "How", "Upstream", "Removal")
_SRT = "sglang.srt."


def header(hook) -> dict[str, str]:
    """The What / Why / How / Upstream / Removal lines that open a patch
    function (the comment block above its ``def``), each joined to one line."""
    fields: dict[str, str] = {}
    current = None
    for line in (inspect.getcomments(inspect.unwrap(hook)) or "").splitlines():
        text = line.lstrip("#").strip()
        match = re.match(r"(\w+):\s*(.*)", text)
        if match and match.group(1) in HEADER_FIELDS:
            current = match.group(1)
            fields[current] = match.group(2)
        elif current is not None and text:
            fields[current] += " " + text
    return fields


def selection() -> tuple[bool, str]:
    """Whether sglang's load_plugins() would run this plugin here, and why."""
    from sglang_graphfix import OFF_SWITCH, switched_off

    found = [
        ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == ENTRY_POINT
    ]
    if not found:
        return False, (
            f"no '{ENTRY_POINT}' entry point in group sglang.srt.plugins: "
            "sglang-graphfix is not installed in this environment (pip install .)"
        )
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    names = {x.strip() for x in allowed.split(",") if x.strip()}
    if allowed and ENTRY_POINT not in names:
        return False, f"SGLANG_PLUGINS={allowed} leaves '{ENTRY_POINT}' out"
    if switched_off():
        return False, f"switched off by {OFF_SWITCH}={os.environ[OFF_SWITCH]}"
    how = (
        f"SGLANG_PLUGINS={allowed}" if allowed else "SGLANG_PLUGINS unset: every plugin"
    )
    return True, f"selected ({how}; entry point {found[0].value})"


def _short_target(target: str) -> str:
    return target[len(_SRT) :] if target.startswith(_SRT) else target


def _split_target(target: str):
    """(upstream file, name inside it) of a hook target: the file relative to
    sglang/srt, or from sglang/ outside it."""
    import pkgutil

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            pkgutil.resolve_name(module)
        except (ImportError, AttributeError, ValueError):
            continue
        if module in sys.modules and hasattr(sys.modules[module], "__file__"):
            path = module.removeprefix(_SRT).replace(".", "/") + ".py"
            return path, ".".join(parts[cut:])
    return target, ""


def patch_table(patches=None) -> str:
    """The README's patch table (between its patches:begin/end markers): one
    row per patch, grouped by the upstream file it fixes."""
    from sglang_graphfix.patches import PATCHES

    by_file: dict[str, list[str]] = {}
    for patch in PATCHES if patches is None else patches:
        path, name = _split_target(patch.target)
        by_file.setdefault(path, []).append(f"`{name}` | `{patch.hook.__name__}` |")
    rows = ["| upstream file | hook target | fix |", "| --- | --- | --- |"]
    for path, cells in by_file.items():
        rows.append(f"| `{path}` | {cells[0]}")
        rows += [f"| | {cell}" for cell in cells[1:]]
    return "\n".join(rows)


def report() -> tuple[list[str], bool]:
    """Run sglang's load_plugins() as a server process does, then verify every
    patch. Returns the report's lines and whether every patch applied."""
    import sglang_graphfix
    from sglang_graphfix import SUPPORTED_SGLANG, graphfix_version, installed_sglang
    from sglang_graphfix.patches import (
        GUARD_TARGET,
        PATCHES,
        _lookup,
        hook_in_chain,
        patch_applied,
        refuse_incomplete_patch_set,
    )

    found = installed_sglang()
    selected, why = selection()
    lines = [
        f"sglang-graphfix {graphfix_version()}",
        f"sglang         {found} (supported: {SUPPORTED_SGLANG})",
        f"plugin         {why}",
    ]
    from sglang.srt.plugins import load_plugins

    load_plugins()
    if not selected and not sglang_graphfix._registered:
        lines.append("patches        none applied: sglang would run as upstream")
    elif found != SUPPORTED_SGLANG:
        lines.append(
            f"patches        none applied: sglang {found} is not {SUPPORTED_SGLANG}"
        )
    if sglang_graphfix._refusal:
        lines.append("refusal        " + sglang_graphfix._refusal)
    elif selected and found == SUPPORTED_SGLANG:
        guarded = hook_in_chain(_lookup(GUARD_TARGET), refuse_incomplete_patch_set)
        lines.append(
            f"guard          {'installed' if guarded else 'MISSING'} on {_short_target(GUARD_TARGET)}"
        )
    lines.append("")
    wrap = textwrap.TextWrapper(
        width=120,
        initial_indent="      ",
        subsequent_indent=" " * 16,
        break_long_words=False,
        break_on_hyphens=False,
    )
    applied_count = 0
    for patch in PATCHES:
        applied = patch_applied(patch)
        applied_count += applied
        fields = header(patch.hook)
        lines.append(f"[{'applied' if applied else 'MISSING'}] {patch.hook.__name__}")
        lines.append(f"      {'target:':<10}{_short_target(patch.target)}")
        for label, key in (
            ("bug", "Why"),
            ("upstream", "Upstream"),
            ("removal", "Removal"),
        ):
            lines += wrap.wrap(
                f"{label + ':':<10}{fields.get(key, '(no header line)')}"
            )
    ok = selected and applied_count == len(PATCHES)
    lines.append("")
    lines.append(
        f"{applied_count} of {len(PATCHES)} patches applied in this process"
        + ("" if ok else "; a server started here would NOT have every fix")
    )
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 when every patch applied in this process, 1 otherwise
    (not installed, not selected, switched off, other sglang, or a patch
    missing)."""
    parser = argparse.ArgumentParser(
        prog="sglang-graphfix status",
        description="What sglang-graphfix does in an sglang process started here.",
    )
    parser.add_argument(
        "--patch-table",
        action="store_true",
        help="print the README's patch table, generated from PATCHES, and exit",
    )
    args = parser.parse_args(argv)
    if args.patch_table:
        print(patch_table())
        return 0
    import warnings

    warnings.filterwarnings("ignore")  # import-time notices of sglang's quant modules
    lines, ok = report()
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
