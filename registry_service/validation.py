"""Turns a pushed catalog (MCP JSON bytes or a ToolList) into ToolSpecs, or field-level violations.

Rules follow MCP's tool-name rules: 1-128 characters of [A-Za-z0-9_.-], unique, case-sensitive.
Nothing is written unless the whole catalog passes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from registry_service.canonical import ToolSpec, canonical_json
from registry_service.errors import InvalidArgument
from tooltrie.names import NAME_RULE, name_problem
from tooltrie.registry.v1 import registry_pb2
from tooltrie.rpc_status import FieldViolation

# Violations travel in trailing metadata, which gRPC clients cap at 8 KiB by default: report the first
# ones that fit in about 4 KiB (a caller with thousands of violations needs the first few, not all).
MAX_REPORTED_BYTES = 4096


@dataclass(frozen=True, slots=True)
class CatalogLimits:
    max_tools: int = 100_000
    max_description_chars: int = 10_000
    max_payload_bytes: int = 256 << 20


def check_name(value: str, field: str) -> FieldViolation | None:
    problem = name_problem(value)
    return FieldViolation(field, problem) if problem else None


def require_catalog_name(name: str) -> None:
    violation = check_name(name, "catalog")
    if violation:
        raise InvalidArgument("invalid catalog name", [violation])


def parse_push(request: registry_pb2.PushCatalogRequest, limits: CatalogLimits) -> list[ToolSpec]:
    """Validates a PushCatalogRequest's catalog name and tools; raises InvalidArgument with every violation."""
    require_catalog_name(request.catalog)
    source = request.WhichOneof("source")
    violations: list[FieldViolation] = []
    if source == "mcp_tools_list_json":
        raw_tools = _tools_from_json(request.mcp_tools_list_json, limits)
    elif source == "tools":
        _check_size(request.tools.ByteSize(), "tools", limits)
        raw_tools = _tools_from_messages(list(request.tools.tools), violations)
    else:
        raise InvalidArgument("no catalog given", [FieldViolation("source", "set mcp_tools_list_json or tools")])
    return _validate_tools(raw_tools, limits, violations)


def _check_size(size: int, field: str, limits: CatalogLimits) -> None:
    if size > limits.max_payload_bytes:
        raise InvalidArgument(
            "catalog payload too large",
            [FieldViolation(field, f"payload is {size} bytes, over the limit of {limits.max_payload_bytes} bytes")],
        )


def _tools_from_json(payload: bytes, limits: CatalogLimits) -> list[Any]:
    field = "mcp_tools_list_json"
    _check_size(len(payload), field, limits)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            "catalog is not UTF-8", [FieldViolation(field, f"not valid UTF-8 at byte offset {exc.start}")]
        ) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            "catalog is not JSON",
            [FieldViolation(field, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")],
        ) from None
    if isinstance(document, dict) and "tools" in document:
        document = document["tools"]
    if not isinstance(document, list):
        raise InvalidArgument(
            "catalog has no tool list",
            [FieldViolation(field, 'expected an MCP tools/list result {"tools": [...]} or a JSON array of tools')],
        )
    return document


def _tools_from_messages(tools: list[registry_pb2.Tool], out: list[FieldViolation]) -> list[Any]:
    """Rebuilds the MCP object of each Tool message; a JSON field that does not parse is a violation."""
    raw_tools: list[Any] = []
    for index, tool in enumerate(tools):
        raw: dict[str, Any] = {}
        for field, text in (("input_schema_json", tool.input_schema_json), ("extra_json", tool.extra_json)):
            if not text:
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                out.append(FieldViolation(f"tools[{index}].{field}", f"invalid JSON at line {exc.lineno}: {exc.msg}"))
                continue
            if field == "input_schema_json":
                raw["inputSchema"] = value
            elif isinstance(value, dict):
                raw.update(value)
            else:
                out.append(FieldViolation(f"tools[{index}].extra_json", "expected a JSON object"))
        raw["name"] = tool.name
        if tool.description:
            raw["description"] = tool.description
        raw_tools.append(raw)
    return raw_tools


def _validate_tools(raw_tools: list[Any], limits: CatalogLimits, violations: list[FieldViolation]) -> list[ToolSpec]:
    if not raw_tools:
        raise InvalidArgument(
            "empty catalog", [FieldViolation("tools", "the catalog is empty; push at least one tool")]
        )
    if len(raw_tools) > limits.max_tools:
        raise InvalidArgument(
            "too many tools", [FieldViolation("tools", f"{len(raw_tools)} tools, over the limit of {limits.max_tools}")]
        )

    specs: list[ToolSpec] = []
    first_index: dict[str, int] = {}
    for index, raw in enumerate(raw_tools):
        spec = _validate_tool(raw, f"tools[{index}]", limits, violations)
        if spec is None:
            continue
        earlier = first_index.setdefault(spec.name, index)
        if earlier != index:
            duplicate = f"duplicate of tools[{earlier}].name {spec.name!r}"
            violations.append(FieldViolation(f"tools[{index}].name", duplicate))
        specs.append(spec)
    if violations:
        count = len(violations)
        shown = _first_that_fit(violations)
        if count > len(shown):
            shown.append(FieldViolation("tools", f"and {count - len(shown)} more violations not shown"))
        raise InvalidArgument(f"invalid catalog: {count} violation{'s' if count > 1 else ''}", shown)
    return specs


def _first_that_fit(violations: list[FieldViolation]) -> list[FieldViolation]:
    shown: list[FieldViolation] = []
    used = 0
    for violation in violations:
        used += len(violation.field) + len(violation.description.encode()) + 8
        if used > MAX_REPORTED_BYTES:
            break
        shown.append(violation)
    return shown


def _validate_tool(raw: Any, where: str, limits: CatalogLimits, out: list[FieldViolation]) -> ToolSpec | None:
    if not isinstance(raw, dict):
        out.append(FieldViolation(where, f"expected a JSON object, got {type(raw).__name__}"))
        return None
    before = len(out)
    name = raw.get("name")
    if name is None or name == "":
        out.append(FieldViolation(f"{where}.name", f"missing; expected {NAME_RULE}"))
    elif not isinstance(name, str):
        out.append(FieldViolation(f"{where}.name", f"expected a string, got {type(name).__name__}"))
    elif violation := check_name(name, f"{where}.name"):
        out.append(violation)
    description = raw.get("description")
    if description is not None:
        if not isinstance(description, str):
            out.append(FieldViolation(f"{where}.description", f"expected a string, got {type(description).__name__}"))
        elif len(description) > limits.max_description_chars:
            out.append(
                FieldViolation(
                    f"{where}.description",
                    f"{len(description)} characters, over the limit of {limits.max_description_chars}",
                )
            )
    schema = raw.get("inputSchema")
    if schema is not None and not isinstance(schema, dict):
        out.append(FieldViolation(f"{where}.inputSchema", f"expected a JSON object, got {type(schema).__name__}"))
    if len(out) > before:
        return None
    extra = {k: v for k, v in raw.items() if k not in ("name", "description", "inputSchema")}
    try:
        # Lone surrogates and NaN survive json.loads but have no canonical UTF-8 JSON spelling.
        canonical_json(raw).encode("utf-8")
    except (UnicodeEncodeError, ValueError) as exc:
        out.append(FieldViolation(where, f"not representable as UTF-8 JSON: {exc}"))
        return None
    return ToolSpec(name=name, description=description, input_schema=schema, extra=extra)
