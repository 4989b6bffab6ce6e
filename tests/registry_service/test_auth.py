"""Bearer tokens on writes; reads stay open; the generated admin token."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
import pytest

from registry_service.server import RegistryConfig, RegistryServer
from tests.support.catalogs import mcp_bytes, tool
from tests.support.registry import RunningRegistry
from tooltrie.auth import TokenConfigError, ensure_admin_token, parse_token_entries
from tooltrie.client import RegistryClient
from tooltrie.paths import admin_token_path


def test_writes_need_a_valid_token(registry: RunningRegistry) -> None:
    with registry.client(None) as anonymous:
        for call in (
            lambda: anonymous.push("cat", mcp_bytes([tool("a")])),
            lambda: anonymous.activate("cat", 1),
            lambda: anonymous.rollback("cat"),
        ):
            with pytest.raises(grpc.RpcError) as raised:
                call()
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        anonymous.token = "not-a-real-token-at-all"
        with pytest.raises(grpc.RpcError) as raised:
            anonymous.push("cat", mcp_bytes([tool("a")]))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert list(anonymous.catalogs()) == []  # nothing was written; reads are open


def test_reads_are_open(registry: RunningRegistry) -> None:
    with registry.client() as writer, registry.client(None) as reader:
        writer.push("cat", mcp_bytes([tool("a")]), activate=True)
        assert reader.get("cat").tools[0].name == "a"


def test_token_entries() -> None:
    assert parse_token_entries(["# comment", "ci: abcdefghijklmnopq ", ""], "file") == {"abcdefghijklmnopq": "ci"}
    for bad in ("no-colon-here-at-all", ":abcdefghijklmnopq", "name:short"):
        with pytest.raises(TokenConfigError):
            parse_token_entries([bad], "file")


def test_tokens_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLTRIE_REGISTRY_TOKENS", "ci:abcdefghijklmnopqrst,ops:zyxwvutsrqponmlkjih")
    server = RegistryServer(RegistryConfig(db_url=f"sqlite:///{tmp_path / 'r.db'}", listen="127.0.0.1:0"))
    server.start()
    try:
        with RegistryClient(f"127.0.0.1:{server.port}", token="zyxwvutsrqponmlkjih") as client:
            client.channel_ready()
            assert client.push("cat", mcp_bytes([tool("a")])).version.author == "ops"
        assert not admin_token_path().exists()
    finally:
        server.stop(grace=1)


def test_generated_admin_token_is_private_and_found_by_the_client(tmp_path: Path) -> None:
    server = RegistryServer(RegistryConfig(db_url=f"sqlite:///{tmp_path / 'r.db'}", listen="127.0.0.1:0"))
    server.start()
    try:
        path = admin_token_path()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert ensure_admin_token() == path.read_text().strip()  # stable across restarts
        with RegistryClient(f"127.0.0.1:{server.port}") as client:  # no token given: found in the data dir
            client.channel_ready()
            assert client.push("cat", mcp_bytes([tool("a")])).version.author == "admin"
    finally:
        server.stop(grace=1)
