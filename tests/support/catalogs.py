"""Catalog payloads for the tests."""

from __future__ import annotations

import json
from typing import Any


def tool(name: str, description: str = "", **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"name": name, "inputSchema": {"type": "object", "properties": {}}}
    if description:
        result["description"] = description
    result.update(extra)
    return result


def synthetic_tools(count: int, prefix: str = "svc", description_words: int = 8) -> list[dict[str, Any]]:
    """service.verb_object names with short descriptions and a small schema each."""
    verbs = ["get", "list", "create", "update", "delete", "search", "send", "sync"]
    tools = []
    for i in range(count):
        name = f"{prefix}{i // 64}.{verbs[i % len(verbs)]}_object{i}"
        words = " ".join(f"word{(i * 7 + j) % 97}" for j in range(description_words))
        schema = {"type": "object", "properties": {"id": {"type": "string"}, "limit": {"type": "integer"}}}
        tools.append({"name": name, "description": f"Tool {i}: {words}.", "inputSchema": schema})
    return tools


def mcp_bytes(tools: list[dict[str, Any]]) -> bytes:
    return json.dumps({"tools": tools}).encode()
