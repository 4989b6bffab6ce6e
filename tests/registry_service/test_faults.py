"""Faults: a registry killed mid-push leaves no partial version; PostgreSQL restarted under the registry."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from registry_service.db.database import Database
from registry_service.store import count_tools
from tests.support.catalogs import mcp_bytes, synthetic_tools
from tests.support.postgres import PostgresServer
from tests.support.registry import RegistryProcess, make_tokens, start_registry
from tooltrie.client import RegistryClient

BIG = 30_000


def test_sigkill_mid_push_leaves_no_partial_version(db_url: str, tmp_path: Path) -> None:
    tokens = make_tokens("alice")
    small = mcp_bytes(synthetic_tools(10))
    big = mcp_bytes(synthetic_tools(BIG, prefix="big"))
    killed_mid_push = 0
    for attempt, delay in enumerate((0.3, 0.6, 0.9, 1.2, 1.8)):
        registry = RegistryProcess(db_url, tmp_path, tokens)
        outcome: dict[str, object] = {}
        with RegistryClient(registry.address, token=tokens["alice"], timeout=120) as client:
            client.channel_ready(timeout=60)
            if attempt == 0:
                client.push("cat", small, activate=True)

            # Distinct bytes per attempt, same tools: a push that completed earlier must not make this one a no-op.
            payload = big.replace(b"big0.", f"big{attempt}x.".encode(), 1)

            def push(
                client: RegistryClient = client, outcome: dict[str, object] = outcome, payload: bytes = payload
            ) -> None:
                try:
                    outcome["version"] = client.push("cat", payload).version.number
                except grpc.RpcError as error:
                    outcome["error"] = error.code()

            pusher = threading.Thread(target=push)
            pusher.start()
            time.sleep(delay)
            registry.kill()
            pusher.join(timeout=60)
        if "error" in outcome:
            killed_mid_push += 1
            assert outcome["error"] == grpc.StatusCode.UNAVAILABLE
    assert killed_mid_push >= 1, "every push finished before the kill; the test proved nothing"

    # Every version that exists is whole: its tool rows match its declared count; v1 is still active.
    database = Database(db_url)
    survivor = start_registry(db_url, tmp_path)
    try:
        with survivor.client() as client:
            versions = list(client.versions("cat"))
            assert versions[-1].number == 1
            for version in versions:
                assert version.tool_count == count_tools(database, "cat", version.number)
                assert version.tool_count in (10, BIG)
            assert client.get("cat").version.number == 1
    finally:
        survivor.server.stop(grace=1)
        database.dispose()


@pytest.mark.postgres
def test_postgres_restart_under_the_registry(postgres: PostgresServer, tmp_path: Path) -> None:
    registry = start_registry(postgres.create_database("restart_test"), tmp_path)
    try:
        with registry.client() as client:
            client.push("cat", mcp_bytes(synthetic_tools(5)), activate=True)
            postgres.restart()
            # The pool's connections died with the server; the next request must still succeed.
            assert client.get("cat").version.number == 1
            assert client.push("cat", mcp_bytes(synthetic_tools(6))).version.number == 2
    finally:
        registry.server.stop(grace=1)
