"""Grammar distribution: hot swap under load, NACKs that keep the old version serving, a registry restart.

Each runs against a registry on SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from decoder_service.model_runtime import ModelRuntime
from registry_service.db.database import Database
from registry_service.db.models import CompiledGrammarRow, VersionRow
from tests.support.catalogs import mcp_bytes, tool
from tests.support.decoder import start_decoder, tiny_runtime
from tests.support.registry import RunningRegistry, start_registry
from tests.support.waiting import wait_until
from tooltrie.grammar import compile_catalog, load_tokenizer

V1_NAMES = [f"alpha.tool_{i}" for i in range(12)]
V2_NAMES = [f"beta.other_{i}" for i in range(9)]
CLIENTS = 4
SWAPS = 20


@pytest.fixture(scope="module")
def runtime(tiny_dir: Path) -> ModelRuntime:
    return tiny_runtime(tiny_dir)


@pytest.fixture
def registry(db_url: str, tmp_path: Path) -> Iterator[RunningRegistry]:
    """A registry on SQLite and on PostgreSQL (the `db_url` fixture's two parameters)."""
    running = start_registry(db_url, tmp_path)
    yield running
    running.server.stop(grace=1)


def test_hot_swap_under_load(registry: RunningRegistry, runtime: ModelRuntime) -> None:
    with registry.client() as client:
        client.push("cat", mcp_bytes([tool(n) for n in V1_NAMES]), activate=True)
        client.push("cat", mcp_bytes([tool(n) for n in V2_NAMES]))
    decoder = start_decoder(registry, runtime, max_queued=16)
    decoder.wait_for("cat", 1)
    swaps: list[tuple[float, int]] = [(time.monotonic(), 1)]
    decoder.server.store.on_change(lambda: swaps.append((time.monotonic(), decoder.server.store.active()["cat"])))
    stop = threading.Event()
    answers: list[tuple[float, float, int, list[str]]] = []
    failures: list[BaseException] = []

    def client_loop(worker: int) -> None:
        with decoder.client() as client:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    events = list(client.decode("cat", f"request {worker} at {sent}", 2))
                except grpc.RpcError as error:
                    failures.append(error)
                    continue
                pointers = [e.pointer for e in events if e.WhichOneof("event") == "pointer"]
                versions = {p.catalog_version for p in pointers} | {events[-1].summary.catalog_version}
                assert len(versions) == 1, versions
                answers.append((sent, time.monotonic(), versions.pop(), [p.tool for p in pointers]))

    workers = [threading.Thread(target=client_loop, args=(w,)) for w in range(CLIENTS)]
    for w in workers:
        w.start()
    try:
        with registry.client() as client:
            for swap in range(SWAPS):
                if swap % 2 == 0:
                    client.activate("cat", 2)
                    decoder.wait_for("cat", 2)
                else:
                    client.rollback("cat")
                    decoder.wait_for("cat", 1)
                time.sleep(0.05)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=120)
        decoder.server.stop(grace=1)

    assert failures == []
    assert len(answers) >= CLIENTS
    assert {version for _, _, version, _ in answers} == {1, 2}, "the load never saw both versions"
    for sent, received, version, tools in answers:
        names = V1_NAMES if version == 1 else V2_NAMES
        assert len(tools) == 2 and len(set(tools)) == 2 and set(tools) <= set(names)
        # The version reported is one that was active on the decoder between sending and the answer.
        active_then = [v for t, v in swaps if t <= sent][-1:] + [v for t, v in swaps if sent < t <= received]
        assert version in active_then, (version, active_then)


def test_corrupted_and_mismatched_grammars_are_nacked(registry: RunningRegistry, runtime: ModelRuntime) -> None:
    with registry.client() as client:
        client.push("cat", mcp_bytes([tool(n) for n in V1_NAMES]), activate=True)
    decoder = start_decoder(registry, runtime)
    decoder.wait_for("cat", 1)
    with registry.client() as client:  # pushed after the decoder registered its tokenizer: compiled for it now
        for names in (V2_NAMES, V2_NAMES[:5]):
            (compiled,) = client.push("cat", mcp_bytes([tool(n) for n in names])).compiled
            assert compiled.ok and compiled.tokenizer_fingerprint == runtime.tokenizer.fingerprint
    database = Database(registry.server.database.url)
    try:
        # v2: the stored trie's bytes are damaged; v3: a trie compiled for another tokenizer.
        with database.write_session() as session:
            trie_of = {
                number: row
                for row, number in session.execute(
                    select(CompiledGrammarRow, VersionRow.number).join(
                        VersionRow, VersionRow.id == CompiledGrammarRow.version_id
                    )
                )
            }
            damaged = bytearray(trie_of[2].trie)
            damaged[len(damaged) // 2] ^= 0xFF
            trie_of[2].trie = bytes(damaged)
            trie_of[3].trie = compile_catalog(V2_NAMES[:5], load_tokenizer("qwen3.6")).to_bytes()
        with registry.client() as client:
            for version, phrase in ((2, "checksum"), (3, "compiled for tokenizer")):
                client.activate("cat", version)
                wait_until(
                    lambda v=version: client.status("cat").decoders[0].nacked_version == v, f"the NACK of v{version}"
                )
                status = client.status("cat").decoders[0]
                assert phrase in status.nack_error.lower()
                assert status.applied_version == 1
                # The old grammar keeps serving.
                assert decoder.server.store.active()["cat"] == 1
                with decoder.client() as d:
                    events = list(d.decode("cat", "anything", 1))
                assert events[0].pointer.tool in V1_NAMES and events[0].pointer.catalog_version == 1
        assert decoder.server.metrics.nacks._value.get() == 2
    finally:
        decoder.server.stop(grace=1)
        database.dispose()


def test_registry_restart(db_url: str, tmp_path: Path, runtime: ModelRuntime) -> None:
    first = start_registry(db_url, tmp_path)
    with first.client() as client:
        client.push("cat", mcp_bytes([tool(n) for n in V1_NAMES]), activate=True)
        client.push("cat", mcp_bytes([tool(n) for n in V2_NAMES]))
    decoder = start_decoder(first, runtime)
    decoder.wait_for("cat", 1)
    port = first.server.port
    first.server.stop(grace=0)
    try:
        # The registry is gone: the decoder keeps serving what it has.
        with decoder.client() as d:
            assert next(iter(d.decode("cat", "anything", 1))).pointer.catalog_version == 1
        second = start_registry(db_url, tmp_path, listen=f"127.0.0.1:{port}", tokens=first.tokens)
        try:
            wait_until(decoder.server.subscriber.connected.is_set, "the decoder to reconnect")
            with second.client() as client:
                client.activate("cat", 2)
                decoder.wait_for("cat", 2)
                wait_until(lambda: client.status("cat").decoders[0].applied_version == 2, "the ACK of v2")
                (status,) = client.status("cat").decoders
            assert status.connected
        finally:
            second.server.stop(grace=0)
    finally:
        decoder.server.stop(grace=1)
