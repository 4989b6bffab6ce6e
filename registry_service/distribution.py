"""Grammar distribution to decoders, in the Envoy xDS pattern.

One `SubscriptionSession` per Subscribe stream: it reads the decoder's hello, asks for the tokenizer when the
registry does not know its fingerprint, then pushes the active version of every catalog (compiled for that
tokenizer) whenever it differs from what the decoder was last sent, and records each ACK and NACK.
Activations wake every session at once through the `ActivationBus`; a periodic re-check also catches
activations made by another registry replica sharing the database.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from sqlalchemy import select

from registry_service.db.database import Database
from registry_service.db.models import CatalogRow
from registry_service.grammars import GrammarBuilder
from registry_service.nodes import NodeLedger
from registry_service.store import CatalogStore
from tooltrie.grammar.tokenizers.blob import TokenizerBlob
from tooltrie.registry.v1 import registry_pb2 as pb

log = logging.getLogger(__name__)

RECHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class _Inbound:
    """One item of a session's queue: a decoder message, a wake-up after an activation, or the stream's end."""

    message: pb.SubscribeRequest | None = None
    closed: bool = False


_WAKE = _Inbound()


class ActivationBus:
    """Wakes every subscription when some catalog's active version changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: set[queue.Queue[_Inbound]] = set()

    def attach(self, inbox: queue.Queue[_Inbound]) -> None:
        with self._lock:
            self._queues.add(inbox)

    def detach(self, inbox: queue.Queue[_Inbound]) -> None:
        with self._lock:
            self._queues.discard(inbox)

    def notify(self) -> None:
        with self._lock:
            for inbox in self._queues:
                inbox.put(_WAKE)


class SubscriptionSession:
    def __init__(
        self,
        database: Database,
        store: CatalogStore,
        grammars: GrammarBuilder,
        ledger: NodeLedger,
        bus: ActivationBus,
        context: grpc.ServicerContext,
    ) -> None:
        self.db, self.store, self.grammars, self.ledger, self.bus = database, store, grammars, ledger, bus
        self.context = context
        self.inbound: queue.Queue[_Inbound] = queue.Queue()
        self.sent: dict[str, int] = {}  # catalog -> version last pushed (or held, as the hello said)
        self.pending: dict[
            str, tuple[str, int]
        ] = {}  # nonce of each update awaiting its ACK/NACK -> (catalog, version)
        self.node_id = ""

    def run(self, requests: Iterator[pb.SubscribeRequest]) -> Iterator[pb.SubscribeResponse]:
        first = next(requests, None)
        if first is None or first.WhichOneof("message") != "hello" or not first.hello.node_id:
            raise ValueError("the first Subscribe message must be a hello with a node_id")
        hello = first.hello
        self.node_id = hello.node_id
        threading.Thread(target=self._read, args=(requests,), name=f"subscribe-{self.node_id}", daemon=True).start()
        held = {g.catalog: g.version for g in hello.held}
        self.sent.update(held)
        self.ledger.hello(self.node_id, hello.tokenizer_fingerprint, held)
        log.info("decoder %s subscribed (tokenizer %s, holds %s)", self.node_id, hello.tokenizer_fingerprint[:16], held)
        try:
            if not self.grammars.known(hello.tokenizer_fingerprint):
                yield pb.SubscribeResponse(tokenizer_wanted=pb.TokenizerWanted(fingerprint=hello.tokenizer_fingerprint))
                if not self._await_tokenizer(hello.tokenizer_fingerprint):
                    return
            yield from self._serve(hello.tokenizer_fingerprint, hello.mode)
        finally:
            self.ledger.disconnected(self.node_id)
            log.info("decoder %s disconnected", self.node_id)

    def _read(self, requests: Iterator[pb.SubscribeRequest]) -> None:
        try:
            for message in requests:
                self.inbound.put(_Inbound(message))
        except grpc.RpcError:
            pass
        finally:
            self.inbound.put(_Inbound(closed=True))

    def _await_tokenizer(self, fingerprint: str) -> bool:
        while self.context.is_active():
            try:
                item = self.inbound.get(timeout=RECHECK_SECONDS)
            except queue.Empty:
                continue
            if item.closed:
                return False
            if item.message is not None and item.message.WhichOneof("message") == "tokenizer":
                t = item.message.tokenizer
                if t.fingerprint != fingerprint:
                    raise ValueError(f"uploaded tokenizer {t.fingerprint[:16]} is not the announced {fingerprint[:16]}")
                self.grammars.register(TokenizerBlob(t.fingerprint, t.kind, t.data, t.name))
                return True
        return False

    def _serve(self, fingerprint: str, mode_value: int) -> Iterator[pb.SubscribeResponse]:
        mode = "char" if mode_value == pb.GRAMMAR_MODE_CHAR else "token"
        self.bus.attach(self.inbound)
        try:
            while self.context.is_active():
                for catalog, version in self._active_versions().items():
                    if self.sent.get(catalog) != version:
                        update = self._update(catalog, version, fingerprint, mode)
                        self.sent[catalog] = version
                        if update is not None:
                            yield pb.SubscribeResponse(grammar=update)
                try:
                    item = self.inbound.get(timeout=RECHECK_SECONDS)
                except queue.Empty:
                    continue  # re-check: another replica may have activated something
                if item.closed:
                    return
                if item.message is not None:
                    self._handle(item.message)
        finally:
            self.bus.detach(self.inbound)

    def _handle(self, message: pb.SubscribeRequest) -> None:
        """Records an ACK or NACK against the update its nonce names; the message's own catalog and version are
        not trusted, and a reply to no pending update (stale, repeated or forged) changes nothing."""
        kind = message.WhichOneof("message")
        if kind not in ("ack", "nack"):
            log.warning("decoder %s sent an unexpected %s message; ignored", self.node_id, kind)
            return
        reply = getattr(message, kind)
        sent = self.pending.pop(reply.nonce, None)
        if sent is None:
            log.warning(
                "decoder %s sent a %s for no pending update (nonce %r); ignored", self.node_id, kind, reply.nonce
            )
            return
        catalog, version = sent
        if kind == "ack":
            self.ledger.applied(self.node_id, catalog, version)
            log.info("decoder %s ACKed %s v%d", self.node_id, catalog, version)
        else:
            self.ledger.refused(self.node_id, catalog, version, reply.error)
            log.warning("decoder %s NACKed %s v%d: %s", self.node_id, catalog, version, reply.error)

    def _active_versions(self) -> dict[str, int]:
        with self.db.read_session() as session:
            rows = session.execute(
                select(CatalogRow.name, CatalogRow.active_number).where(CatalogRow.active_number > 0)
            )
            return {name: number for name, number in rows}

    def _update(self, catalog: str, version: int, fingerprint: str, mode: str) -> pb.GrammarUpdate | None:
        try:
            trie = self.grammars.trie(catalog, version, fingerprint, mode)
        except Exception as exc:  # a version that does not compile for this tokenizer is recorded, not sent
            self.ledger.refused(self.node_id, catalog, version, f"registry could not compile it: {exc}")
            log.warning("not sending %s v%d to %s: %s", catalog, version, self.node_id, exc)
            return None
        info, tools = self.store.get_tools(catalog, version)
        nonce = uuid.uuid4().hex
        self.pending[nonce] = (catalog, version)
        return pb.GrammarUpdate(
            catalog=catalog,
            version=version,
            nonce=nonce,
            mode=pb.GRAMMAR_MODE_CHAR if mode == "char" else pb.GRAMMAR_MODE_TOKEN,
            trie=trie,
            tools=[pb.Tool(name=t.name, description=t.description or "") for t in tools],
            content_sha256=info.content_sha256,
        )
