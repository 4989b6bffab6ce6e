"""MCP's naming rule, shared by tool names and catalog names: 1-128 characters of [A-Za-z0-9_.-]."""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
NAME_RULE = "1-128 characters of [A-Za-z0-9_.-]"


def name_problem(value: str) -> str | None:
    """Why `value` is not a valid name, or None when it is."""
    if not value:
        return f"missing; expected {NAME_RULE}"
    if not NAME_PATTERN.fullmatch(value):
        shown = value if len(value) <= 140 else value[:137] + "..."
        return f"{shown!r} ({len(value)} characters) is not {NAME_RULE}"
    return None
