"""The canonical form of a catalog: tools sorted by name, canonical JSON, hashed with sha256.

Reordering tools or keys does not change the hash, so pushing the same tools twice is idempotent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept as characters: one spelling per JSON value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as MCP carries it: name, optional description and inputSchema, and every other field."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_mcp(self) -> dict[str, Any]:
        tool: dict[str, Any] = dict(self.extra)
        tool["name"] = self.name
        if self.description is not None:
            tool["description"] = self.description
        if self.input_schema is not None:
            tool["inputSchema"] = self.input_schema
        return tool


def content_sha256(tools: Iterable[ToolSpec]) -> str:
    ordered = sorted(tools, key=lambda t: t.name)
    payload = canonical_json([t.as_mcp() for t in ordered]).encode("utf-8")
    return hashlib.sha256(payload).hexdigest()
