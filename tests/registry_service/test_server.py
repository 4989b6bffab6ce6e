"""Standard gRPC parts: health, reflection, TLS, deadlines, graceful shutdown."""

from __future__ import annotations

import shutil
import signal
import socket
import sqlite3
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from registry_service.db.database import Database
from registry_service.server import RegistryConfig, RegistryServer
from tests.support.catalogs import mcp_bytes, synthetic_tools, tool
from tests.support.registry import RegistryProcess, RunningRegistry, make_tokens, start_registry, write_tokens_file
from tests.support.tls import self_signed_cert
from tests.support.waiting import wait_until
from tooltrie.client import RegistryClient


def health_status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return reply.status


def wait_for_status(address: str, wanted: int, seconds: float = 20) -> None:
    wait_until(lambda: health_status(address) == wanted, f"health status {wanted}", seconds)


def test_health_and_reflection(registry: RunningRegistry) -> None:
    assert health_status(registry.address) == health_pb2.HealthCheckResponse.SERVING
    assert health_status(registry.address, "tooltrie.registry.v1.Registry") == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(registry.address) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert {"tooltrie.registry.v1.Registry", "grpc.health.v1.Health"} <= services


def test_not_serving_until_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    tokens = write_tokens_file(tmp_path / "tokens", make_tokens("alice"))
    config = RegistryConfig(url, listen="127.0.0.1:0", tokens_file=tokens, migrate=False, db_check_seconds=0.1)
    server = RegistryServer(config)
    server.start()
    address = f"127.0.0.1:{server.port}"
    try:
        time.sleep(0.5)
        assert health_status(address) == health_pb2.HealthCheckResponse.NOT_SERVING
        with RegistryClient(address) as client, pytest.raises(grpc.RpcError) as raised:
            list(client.catalogs())
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        database = Database(url)
        database.migrate()  # what `tooltrie registry migrate` does
        database.dispose()
        wait_for_status(address, health_pb2.HealthCheckResponse.SERVING)
    finally:
        server.stop(grace=1)


def test_not_serving_while_the_database_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/none?connect_timeout=1"
    tokens = write_tokens_file(tmp_path / "tokens", make_tokens("alice"))
    server = RegistryServer(RegistryConfig(url, listen="127.0.0.1:0", tokens_file=tokens))
    server.start()
    try:
        time.sleep(0.5)
        assert health_status(f"127.0.0.1:{server.port}") == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        server.stop(grace=1)


def test_deadline_exceeded_writes_nothing(registry: RunningRegistry) -> None:
    payload = mcp_bytes(synthetic_tools(30_000))
    with registry.client(timeout=0.05) as hasty, pytest.raises(grpc.RpcError) as raised:
        hasty.push("cat", payload)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(3)  # let the server finish whatever it was doing with the call
    with registry.client() as client:
        assert list(client.catalogs()) == []


def test_sigterm_lets_the_running_push_finish(tmp_path: Path) -> None:
    tokens = make_tokens("alice")
    registry = RegistryProcess(f"sqlite:///{tmp_path / 'r.db'}", tmp_path, tokens)
    result: dict[str, object] = {}
    with RegistryClient(registry.address, token=tokens["alice"]) as client:
        client.channel_ready()

        def push() -> None:
            result["version"] = client.push("cat", mcp_bytes(synthetic_tools(20_000))).version.number

        pusher = threading.Thread(target=push)
        pusher.start()
        wait_until_write_lock_held(tmp_path / "r.db")  # the push is inside its transaction now
        registry.process.send_signal(signal.SIGTERM)
        pusher.join(timeout=60)
        assert registry.process.wait(timeout=30) == 0
    assert result.get("version") == 1
    restarted = start_registry(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    try:
        with restarted.client() as client:
            assert client.get("cat", 1).version.tool_count == 20_000
    finally:
        restarted.server.stop(grace=1)


def wait_until_write_lock_held(db: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        connection = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("ROLLBACK")
        except sqlite3.OperationalError:
            return  # "database is locked": a writer holds it
        finally:
            connection.close()
        time.sleep(0.005)
    raise AssertionError("the push never took the write lock")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    registry = start_tls_registry(tmp_path, cert, key)
    try:
        with RegistryClient(registry.address, token=registry.tokens["alice"], tls_ca=cert) as client:
            assert client.push("cat", mcp_bytes([tool("a")])).version.number == 1
        with RegistryClient(registry.address, timeout=3) as plaintext, pytest.raises(grpc.RpcError):
            list(plaintext.catalogs())
    finally:
        registry.server.stop(grace=1)


def start_tls_registry(tmp_path: Path, cert: Path, key: Path) -> RunningRegistry:
    tokens = make_tokens("alice")
    config = RegistryConfig(
        f"sqlite:///{tmp_path / 'tls.db'}",
        listen="127.0.0.1:0",
        tokens_file=write_tokens_file(tmp_path / "tokens", tokens),
        tls_cert=cert,
        tls_key=key,
    )
    server = RegistryServer(config)
    server.start()
    running = RunningRegistry(server, f"localhost:{server.port}", tokens)
    with RegistryClient(running.address, tls_ca=cert) as client:
        client.channel_ready()
    return running
