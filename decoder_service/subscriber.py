"""The decoder's side of grammar distribution: subscribe, upload the tokenizer when asked, load, swap, ACK/NACK.

Runs in its own thread, off the serving path. When the registry is unreachable the decoder keeps serving the
grammars it has and reconnects with exponential backoff; each hello states what it holds.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc

from decoder_service.engines.catalog import Tool
from decoder_service.grammar_store import GrammarStore
from decoder_service.metrics import DecoderMetrics
from tooltrie.client import make_channel
from tooltrie.grammar import Tokenizer
from tooltrie.grammar.tokenizers.blob import to_blob
from tooltrie.registry.v1 import registry_pb2 as pb
from tooltrie.registry.v1 import registry_pb2_grpc

log = logging.getLogger(__name__)

_CLOSE = object()


class RegistrySubscriber:
    def __init__(
        self,
        address: str,
        token: str | None,
        node_id: str,
        tokenizer: Tokenizer,
        store: GrammarStore,
        metrics: DecoderMetrics,
        tls_ca: Path | None = None,
        max_backoff: float = 10.0,
        char_mode: bool = False,
    ) -> None:
        self.address, self.token, self.node_id, self.tokenizer = address, token, node_id, tokenizer
        self.mode = pb.GRAMMAR_MODE_CHAR if char_mode else pb.GRAMMAR_MODE_TOKEN
        self.store, self.metrics, self.tls_ca, self.max_backoff = store, metrics, tls_ca, max_backoff
        self._stopping = threading.Event()
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name=f"subscriber-{node_id}", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                self._session()
                backoff = 0.1
            except grpc.RpcError as error:
                if self._stopping.is_set():
                    return
                log.warning("registry %s: %s: %s", self.address, error.code().name, error.details())  # type: ignore[attr-defined]
            except Exception:
                log.exception("subscription to %s failed", self.address)
            finally:
                self.connected.clear()
            # Jitter keeps a fleet of decoders from reconnecting in lockstep after a registry restart.
            self._stopping.wait(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self.max_backoff)

    def _session(self) -> None:
        outbox: queue.Queue[object] = queue.Queue()
        held = [pb.HeldGrammar(catalog=c, version=v) for c, v in sorted(self.store.active().items())]
        hello = pb.DecoderHello(
            node_id=self.node_id,
            tokenizer_fingerprint=self.tokenizer.fingerprint,
            held=held,
            mode=self.mode,
        )
        outbox.put(pb.SubscribeRequest(hello=hello))

        def requests() -> Iterator[pb.SubscribeRequest]:
            while (item := outbox.get()) is not _CLOSE:
                yield item  # type: ignore[misc]

        metadata = [("authorization", f"Bearer {self.token}")] if self.token else []
        with make_channel(self.address, self.tls_ca) as channel:
            call = registry_pb2_grpc.RegistryStub(channel).Subscribe(requests(), metadata=metadata)
            self._call = call
            try:
                self.connected.set()
                log.info("subscribed to registry %s as %s", self.address, self.node_id)
                for response in call:
                    kind = response.WhichOneof("message")
                    if kind == "tokenizer_wanted":
                        blob = to_blob(self.tokenizer)
                        outbox.put(
                            pb.SubscribeRequest(
                                tokenizer=pb.TokenizerBlob(
                                    fingerprint=blob.fingerprint, kind=blob.kind, data=blob.data, name=blob.name
                                )
                            )
                        )
                    elif kind == "grammar":
                        outbox.put(self._apply(response.grammar))
            finally:
                outbox.put(_CLOSE)
                self._call = None

    def _apply(self, update: pb.GrammarUpdate) -> pb.SubscribeRequest:
        """Loads and swaps in one pushed grammar; any failure is a NACK and the previous version keeps serving."""
        try:
            if update.mode != self.mode:
                wanted = pb.GrammarMode.Name(self.mode)
                raise ValueError(
                    f"got a {pb.GrammarMode.Name(update.mode)} grammar; this decoder subscribed for {wanted}"
                )
            tools = [Tool(t.name, t.description) for t in update.tools]
            grammar = self.store.load(update.catalog, update.version, update.content_sha256, tools, update.trie)
            self.store.activate(grammar)
        except Exception as exc:
            self.store.refuse(update.catalog, update.version, str(exc))
            kept = self.store.active().get(update.catalog, 0)
            log.warning("NACK %s v%d (keeping v%d): %s", update.catalog, update.version, kept, exc)
            self.metrics.nacks.inc()
            nack = pb.GrammarNack(
                nonce=update.nonce, catalog=update.catalog, version=update.version, kept_version=kept, error=str(exc)
            )
            return pb.SubscribeRequest(nack=nack)
        self.metrics.swaps.inc()
        self.metrics.grammar_version.labels(update.catalog).set(update.version)
        log.info("serving %s v%d", update.catalog, update.version)
        ack = pb.GrammarAck(nonce=update.nonce, catalog=update.catalog, version=update.version)
        return pb.SubscribeRequest(ack=ack)
