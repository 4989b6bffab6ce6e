"""A catalog version made ready for decoding: its names, compiled trie and the token ids of its prompt prefix."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tooltrie.grammar.tokenizers import Tokenizer
from tooltrie.grammar.trie import CompiledTrie
from tooltrie.names import name_problem


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class PreparedCatalog:
    """What an engine needs per catalog version; built once per version (see ``prompt.prepare_catalog``)."""

    version: int
    #: Key of the prefix KV cache: catalog identity, version and prompt settings.
    cache_key: str
    trie: CompiledTrie
    tokenizer: Tokenizer
    prefix_ids: tuple[int, ...]
    #: The chat template's text after the user message (e.g. ``<|im_end|>\n<|im_start|>assistant\n``).
    tail_text: str
    #: How the user message asks for k names; formatted with ``intent`` and ``k``.
    user_template: str
    #: Whether the system message kept descriptions or fell back to names only (prompt budget).
    with_descriptions: bool


def parse_mcp_tools(payload: dict[str, Any] | list[Any]) -> list[Tool]:
    """Tools of an MCP ``tools/list`` result (``{"tools": [...]}``) or of a bare list of tool objects."""
    items = payload.get("tools") if isinstance(payload, dict) else payload
    if not isinstance(items, list) or not items:
        raise ValueError(
            'a catalog is an MCP tools/list result: {"tools": [{"name": ..., "description": ...}, ...]} '
            "with at least one tool"
        )
    tools = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ValueError(f"tool #{i} has no string 'name'; every tool needs one")
        problem = name_problem(item["name"])
        if problem:  # the registry's rule, so a file decoded here is one the registry would take
            raise ValueError(f"tools[{i}].name: {problem}")
        tools.append(Tool(item["name"], str(item.get("description") or "")))
    return tools


def read_catalog_file(path: str | Path) -> tuple[list[Tool], str]:
    """Tools of a catalog JSON file and a content hash identifying it."""
    raw = Path(path).read_bytes()
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON ({exc}); expected an MCP tools/list result") from exc
    return parse_mcp_tools(payload), hashlib.sha256(raw).hexdigest()[:16]
