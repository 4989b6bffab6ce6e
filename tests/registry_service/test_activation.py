"""ActivateVersion (with compare-and-set), Rollback along the activation history, and the audit log."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.support.catalogs import mcp_bytes, tool
from tests.support.registry import RunningRegistry
from tooltrie.client import RegistryClient
from tooltrie.registry.v1 import registry_pb2 as pb


def push_versions(client: RegistryClient, count: int, catalog: str = "cat") -> None:
    for n in range(1, count + 1):
        client.push(catalog, mcp_bytes([tool(f"tool{i}") for i in range(n)]))


def states(client: RegistryClient, catalog: str = "cat") -> dict[int, int]:
    return {v.number: v.state for v in client.versions(catalog)}


def test_activate_switches_states(registry: RunningRegistry) -> None:
    with registry.client() as client:
        push_versions(client, 3)
        assert client.activate("cat", 1).previous_version == 0
        response = client.activate("cat", 3)
        assert response.previous_version == 1 and response.version.state == pb.VERSION_STATE_ACTIVE
        assert states(client) == {3: pb.VERSION_STATE_ACTIVE, 2: pb.VERSION_STATE_STAGED, 1: pb.VERSION_STATE_RETIRED}
        assert next(c for c in client.catalogs() if c.name == "cat").active_version == 3
        assert client.get("cat").version.number == 3


def test_activate_compare_and_set(registry: RunningRegistry) -> None:
    with registry.client() as client:
        push_versions(client, 2)
        client.activate("cat", 1, expected_current=0)
        with pytest.raises(grpc.RpcError) as raised:
            client.activate("cat", 2, expected_current=0)
        assert raised.value.code() == grpc.StatusCode.ABORTED
        assert "version 1 active" in raised.value.details()
        assert client.get("cat").version.number == 1
        assert client.activate("cat", 2, expected_current=1).previous_version == 1


def test_activate_unknown(registry: RunningRegistry) -> None:
    with registry.client() as client:
        push_versions(client, 1)
        for catalog, version in (("cat", 9), ("other", 1)):
            with pytest.raises(grpc.RpcError) as raised:
                client.activate(catalog, version)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_rollback_walks_back_the_history(registry: RunningRegistry) -> None:
    with registry.client() as client:
        push_versions(client, 3)
        with pytest.raises(grpc.RpcError) as raised:
            client.rollback("cat")
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        for version in (1, 3, 2):
            client.activate("cat", version)
        back = client.rollback("cat")
        assert (back.version.number, back.previous_version) == (3, 2)
        assert client.rollback("cat").version.number == 1
        with pytest.raises(grpc.RpcError) as raised:
            client.rollback("cat")
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert client.get("cat").version.number == 1
        # A new activation after rollbacks stacks on the current one.
        client.activate("cat", 2)
        assert client.rollback("cat").version.number == 1


def test_push_and_activate_in_one_call(registry: RunningRegistry) -> None:
    with registry.client() as client:
        pushed = client.push("cat", mcp_bytes([tool("a")]), activate=True)
        assert pushed.version.state == pb.VERSION_STATE_ACTIVE
        again = client.push("cat", mcp_bytes([tool("a")]), activate=True)
        assert not again.created and again.version.number == 1
        with pytest.raises(grpc.RpcError):
            client.rollback("cat")  # the idempotent re-push did not stack a second activation


def test_diff(registry: RunningRegistry) -> None:
    v1 = [tool("keep"), tool("drop"), tool("edit", "old"), tool("schema")]
    v2 = [tool("keep"), tool("add"), tool("edit", "new", title="T"), {"name": "schema", "inputSchema": {"type": "x"}}]
    with registry.client() as client:
        client.push("cat", mcp_bytes(v1))
        client.push("cat", mcp_bytes(v2))
        diff = client.diff("cat", 1, 2)
        assert list(diff.added) == ["add"]
        assert list(diff.removed) == ["drop"]
        assert {c.name: list(c.fields) for c in diff.changed} == {
            "edit": ["description", "title"],
            "schema": ["inputSchema"],
        }
        reverse = client.diff("cat", 2, 1)
        assert list(reverse.added) == ["drop"] and list(reverse.removed) == ["add"]
        with pytest.raises(grpc.RpcError) as raised:
            client.diff("cat", 1, 5)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_pagination(registry: RunningRegistry) -> None:
    with registry.client() as client:
        for i in range(7):
            client.push(f"cat{i}", mcp_bytes([tool("a")]))
        push_versions(client, 5, catalog="many")
        assert [c.name for c in client.catalogs(page_size=2)] == sorted([f"cat{i}" for i in range(7)] + ["many"])
        assert [v.number for v in client.versions("many", page_size=2)] == [5, 4, 3, 2, 1]
        page = client.stub.ListVersions(pb.ListVersionsRequest(catalog="many", page_size=2))
        assert len(page.versions) == 2 and page.next_page_token
        with pytest.raises(grpc.RpcError) as raised:
            client.stub.ListCatalogs(pb.ListCatalogsRequest(page_token=page.next_page_token))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as raised:
            client.stub.ListCatalogs(pb.ListCatalogsRequest(page_token="!!garbage"))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_audit_log_records_every_write(registry: RunningRegistry) -> None:
    with registry.client("alice") as alice, registry.client("bob") as bob:
        alice.push("cat", mcp_bytes([tool("a")]))
        bob.push("cat", mcp_bytes([tool("a"), tool("b")]))
        alice.activate("cat", 2)
        bob.activate("cat", 1)
        alice.rollback("cat")
        events = list(alice.audit("cat", page_size=2))
    assert [(e.actor, e.action, e.version) for e in reversed(events)] == [
        ("alice", "push", 1),
        ("bob", "push", 2),
        ("alice", "activate", 2),
        ("bob", "activate", 1),
        ("alice", "rollback", 2),
    ]
    assert json.loads(events[0].detail_json) == {"previous": 1}


def test_versions_record_author_and_parent(registry: RunningRegistry) -> None:
    with registry.client("alice") as alice, registry.client("bob") as bob:
        alice.push("cat", mcp_bytes([tool("a")]))
        bob.push("cat", mcp_bytes([tool("b")]))
        versions = {v.number: v for v in alice.versions("cat")}
    assert (versions[1].author, versions[1].parent) == ("alice", 0)
    assert (versions[2].author, versions[2].parent) == ("bob", 1)
    assert versions[2].created_at.ToDatetime() >= versions[1].created_at.ToDatetime()
