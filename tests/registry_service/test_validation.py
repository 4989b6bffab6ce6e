"""Every validation rule answers INVALID_ARGUMENT with field-level details, and writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from registry_service.validation import CatalogLimits
from tests.support.catalogs import mcp_bytes, tool
from tests.support.registry import RunningRegistry, start_registry
from tooltrie.client import RegistryClient, error_details
from tooltrie.registry.v1 import registry_pb2 as pb
from tooltrie.registry.v1 import registry_pb2_grpc
from tooltrie.rpc_status import FieldViolation


def rejected(client: RegistryClient, catalog: str, payload: bytes) -> list[FieldViolation]:
    with pytest.raises(grpc.RpcError) as raised:
        client.push(catalog, payload)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    violations = error_details(raised.value)
    assert violations, "INVALID_ARGUMENT without field violations"
    return violations


def assert_nothing_written(client: RegistryClient, catalog: str) -> None:
    assert [c.name for c in client.catalogs() if c.name == catalog] in ([], [catalog])
    with pytest.raises(grpc.RpcError) as raised:
        client.get(catalog, 1)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


CASES: list[tuple[str, Callable[[], bytes], str, str]] = [
    ("empty catalog", lambda: mcp_bytes([]), "tools", "empty"),
    ("bare empty list", lambda: b"[]", "tools", "empty"),
    (
        "duplicate names",
        lambda: mcp_bytes([tool("a"), tool("b"), tool("a")]),
        "tools[2].name",
        "duplicate of tools[0].name",
    ),
    ("name too long", lambda: mcp_bytes([tool("x" * 129)]), "tools[0].name", "129 characters"),
    ("name with a space", lambda: mcp_bytes([tool("send message")]), "tools[0].name", "[A-Za-z0-9_.-]"),
    ("name with unicode", lambda: mcp_bytes([tool("café")]), "tools[0].name", "[A-Za-z0-9_.-]"),
    ("name with a slash", lambda: mcp_bytes([tool("a/b")]), "tools[0].name", "[A-Za-z0-9_.-]"),
    ("missing name", lambda: mcp_bytes([{"description": "no name"}]), "tools[0].name", "missing"),
    ("empty name", lambda: mcp_bytes([tool("")]), "tools[0].name", "missing"),
    ("name not a string", lambda: mcp_bytes([{"name": 7}]), "tools[0].name", "expected a string"),
    ("not UTF-8", lambda: b'{"tools": [{"name": "a", "description": "\xff\xfe"}]}', "mcp_tools_list_json", "UTF-8"),
    ("not JSON", lambda: b'{"tools": [', "mcp_tools_list_json", "invalid JSON"),
    ("no tool list", lambda: b'{"tool": []}', "mcp_tools_list_json", "tools/list"),
    ("tool not an object", lambda: b'{"tools": ["a"]}', "tools[0]", "JSON object"),
    ("schema not an object", lambda: mcp_bytes([{"name": "a", "inputSchema": [1]}]), "tools[0].inputSchema", "object"),
    (
        "description not a string",
        lambda: mcp_bytes([{"name": "a", "description": 3}]),
        "tools[0].description",
        "string",
    ),
    ("lone surrogate", lambda: b'{"tools": [{"name": "a", "description": "\\ud800"}]}', "tools[0]", "UTF-8"),
]


@pytest.mark.parametrize(("case", "payload", "field", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_rule(registry: RunningRegistry, case: str, payload: Callable[[], bytes], field: str, phrase: str) -> None:
    with registry.client() as client:
        violations = rejected(client, "cat", payload())
        assert any(v.field == field and phrase in v.description for v in violations), violations
        assert_nothing_written(client, "cat")


def test_every_violation_reported_at_once(registry: RunningRegistry) -> None:
    payload = mcp_bytes([tool("ok"), tool("bad name"), tool("ok"), {"description": "x"}])
    with registry.client() as client:
        fields = {v.field for v in rejected(client, "cat", payload)}
    assert fields == {"tools[1].name", "tools[2].name", "tools[3].name"}


def test_violation_list_is_bounded(registry: RunningRegistry) -> None:
    """Thousands of violations still come back as INVALID_ARGUMENT (under the 8 KiB metadata default)."""
    payload = mcp_bytes([tool(f"bad name {i}" + "x" * 100) for i in range(5000)])
    with registry.client() as client:
        violations = rejected(client, "cat", payload)
    assert 5 < len(violations) < 100
    assert violations[0].field == "tools[0].name"
    assert f"{5000 - (len(violations) - 1)} more" in violations[-1].description
    # A client with gRPC's default limits (8 KiB of metadata) gets the same status, not a transport error.
    request = pb.PushCatalogRequest(catalog="cat", mcp_tools_list_json=payload)
    with grpc.insecure_channel(registry.address) as channel, pytest.raises(grpc.RpcError) as raised:
        auth = [("authorization", f"Bearer {registry.tokens['alice']}")]
        registry_pb2_grpc.RegistryStub(channel).PushCatalog(request, metadata=auth)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_names_are_case_sensitive(registry: RunningRegistry) -> None:
    with registry.client() as client:
        assert client.push("cat", mcp_bytes([tool("Get"), tool("get")])).version.tool_count == 2


def test_catalog_name_rules(registry: RunningRegistry) -> None:
    with registry.client() as client:
        for bad in ("", "has space", "x" * 129):
            violations = rejected(client, bad, mcp_bytes([tool("a")]))
            assert violations[0].field == "catalog"


def test_structured_tool_with_bad_schema_json(registry: RunningRegistry) -> None:
    request = pb.PushCatalogRequest(
        catalog="cat", tools=pb.ToolList(tools=[pb.Tool(name="a", input_schema_json="{oops")])
    )
    with registry.client() as client, pytest.raises(grpc.RpcError) as raised:
        client.stub.PushCatalog(request, metadata=client._auth())
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(raised.value)[0].field == "tools[0].input_schema_json"


@pytest.fixture
def strict_registry(tmp_path: Path) -> RunningRegistry:
    limits = CatalogLimits(max_tools=10, max_description_chars=50, max_payload_bytes=64 * 1024)
    running = start_registry(f"sqlite:///{tmp_path / 'strict.db'}", tmp_path, limits=limits)
    yield running  # type: ignore[misc]
    running.server.stop(grace=1)


def test_limits(strict_registry: RunningRegistry) -> None:
    with strict_registry.client() as client:
        too_many = rejected(client, "cat", mcp_bytes([tool(f"t{i}") for i in range(11)]))
        assert too_many[0].field == "tools" and "over the limit of 10" in too_many[0].description
        long_description = rejected(client, "cat", mcp_bytes([tool("a", "d" * 51)]))
        assert long_description[0].field == "tools[0].description"
        big = json.dumps({"tools": [tool("a")], "padding": "x" * 70_000}).encode()
        oversized = rejected(client, "cat", big)
        assert oversized[0].field == "mcp_tools_list_json" and "over the limit" in oversized[0].description
        assert_nothing_written(client, "cat")
        assert client.push("cat", mcp_bytes([tool(f"t{i}", "d" * 50) for i in range(10)])).created
