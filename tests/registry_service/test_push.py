"""PushCatalog and GetCatalog over real gRPC, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.support.catalogs import mcp_bytes, synthetic_tools, tool
from tests.support.registry import RunningRegistry
from tooltrie.registry.v1 import registry_pb2 as pb


def test_push_example_catalog_roundtrips(registry: RunningRegistry, example_catalog_bytes: bytes) -> None:
    with registry.client() as client:
        pushed = client.push("workplace", example_catalog_bytes)
        assert pushed.created
        assert pushed.version.number == 1
        assert pushed.version.author == "alice"
        assert pushed.version.state == pb.VERSION_STATE_STAGED
        got = client.get("workplace", 1)
    original = {t["name"]: t for t in json.loads(example_catalog_bytes)["tools"]}
    assert got.version.tool_count == len(original) == len(got.tools)
    assert [t.name for t in got.tools] == sorted(original)
    for t in got.tools:
        assert t.description == original[t.name]["description"]
        assert json.loads(t.input_schema_json) == original[t.name]["inputSchema"]


def test_identical_content_is_idempotent_whatever_the_order(registry: RunningRegistry) -> None:
    tools = [tool("b.tool", "second"), tool("a.tool", "first", title="A")]
    with registry.client() as client:
        first = client.push("cat", mcp_bytes(tools))
        reordered = [{k: v for k, v in reversed(list(t.items()))} for t in reversed(tools)]
        again = client.push("cat", mcp_bytes(reordered))
        assert not again.created
        assert again.version.number == first.version.number
        assert again.version.content_sha256 == first.version.content_sha256
        changed = client.push("cat", mcp_bytes([*tools, tool("c.tool")]))
        assert changed.created and changed.version.number == 2 and changed.version.parent == 1
        assert [v.number for v in client.versions("cat")] == [2, 1]


def test_extra_mcp_fields_are_kept(registry: RunningRegistry) -> None:
    annotated = tool("files.read", "Read a file", title="Read file", annotations={"readOnlyHint": True})
    annotated["outputSchema"] = {"type": "object"}
    with registry.client() as client:
        client.push("cat", mcp_bytes([annotated]))
        got = client.get("cat", 1).tools[0]
    assert json.loads(got.extra_json) == {
        "title": "Read file",
        "annotations": {"readOnlyHint": True},
        "outputSchema": {"type": "object"},
    }


def test_push_with_structured_tools(registry: RunningRegistry) -> None:
    request = pb.PushCatalogRequest(
        catalog="structured",
        tools=pb.ToolList(tools=[pb.Tool(name="x.y", description="d", input_schema_json='{"type":"object"}')]),
    )
    with registry.client() as client:
        response = client.stub.PushCatalog(request, metadata=client._auth())
        assert response.version.tool_count == 1
        assert client.get("structured", 1).tools[0].input_schema_json == '{"type":"object"}'


def test_get_defaults_to_active_and_names_view(registry: RunningRegistry) -> None:
    with registry.client() as client:
        client.push("cat", mcp_bytes([tool("one")]))
        with pytest.raises(grpc.RpcError) as raised:
            client.get("cat")
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        client.push("cat", mcp_bytes([tool("one"), tool("two", "second tool")]), activate=True)
        active = client.get("cat")
        assert active.version.number == 2 and active.version.state == pb.VERSION_STATE_ACTIVE
        names = client.get("cat", names_only=True)
        assert [t.name for t in names.tools] == ["one", "two"]
        assert all(not t.description and not t.input_schema_json for t in names.tools)


def test_unknown_catalog_and_version(registry: RunningRegistry) -> None:
    with registry.client() as client:
        with pytest.raises(grpc.RpcError) as raised:
            client.get("nope", 1)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        client.push("cat", mcp_bytes([tool("one")]))
        with pytest.raises(grpc.RpcError) as raised:
            client.get("cat", 7)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no version 7" in raised.value.details()


def test_large_catalog_passes_default_grpc_limits(registry: RunningRegistry) -> None:
    """A catalog well over gRPC's default 4 MB message limit, both ways."""
    tools = synthetic_tools(12_000, description_words=40)
    payload = mcp_bytes(tools)
    assert len(payload) > 5 * 1024 * 1024
    with registry.client() as client:
        pushed = client.push("big", payload)
        assert pushed.version.tool_count == 12_000
        got = client.get("big", 1)
    assert got.ByteSize() > 4 * 1024 * 1024
    assert len(got.tools) == 12_000
