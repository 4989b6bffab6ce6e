"""Assembles and runs a decoder: model + engine, grammar store, registry subscription, gRPC, health, metrics."""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from decoder_service.admission import Admission
from decoder_service.grammar_store import GrammarStore
from decoder_service.metrics import DecoderMetrics
from decoder_service.model_runtime import ModelRuntime
from decoder_service.service import DecoderIdentity, DecoderServicer
from decoder_service.subscriber import RegistrySubscriber
from tooltrie.auth import Authenticator, load_optional_tokens
from tooltrie.decoder.v1 import decoder_pb2, decoder_pb2_grpc
from tooltrie.grpc_limits import DEFAULT_DECODER_ADDRESS, DEFAULT_REGISTRY_ADDRESS
from tooltrie.grpc_listen import bind, new_server

log = logging.getLogger(__name__)

SERVICE_NAME = decoder_pb2.DESCRIPTOR.services_by_name["Decoder"].full_name


@dataclass(slots=True)
class DecoderConfig:
    registry: str = DEFAULT_REGISTRY_ADDRESS
    registry_token: str | None = None
    registry_tls_ca: Path | None = None
    listen: str = DEFAULT_DECODER_ADDRESS
    node_id: str = ""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # The CPU engine decodes one request at a time; the rest wait in a bounded queue.
    max_active: int = 1
    max_queued: int = 32
    metrics_listen: str | None = None
    # Tokens that Decode accepts (NAME:TOKEN lines); without a file, $TOOLTRIE_DECODER_TOKENS; without both, open.
    tokens_file: Path | None = None
    # Character-level grammars (any tokenization of a name) instead of token tries (canonical tokenization).
    char_mode: bool = False


class DecoderServer:
    def __init__(self, config: DecoderConfig, runtime: ModelRuntime) -> None:
        self.config, self.runtime = config, runtime
        self.metrics = DecoderMetrics()
        self.store = GrammarStore(runtime.prepare)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self._server = new_server(config.max_active + config.max_queued + 8, "decoder")
        self.port = bind(self._server, config.listen, config.tls_cert, config.tls_key)
        self.node_id = config.node_id or f"{socket.gethostname()}:{self.port}"
        self.subscriber = RegistrySubscriber(
            config.registry,
            config.registry_token,
            self.node_id,
            runtime.tokenizer,
            self.store,
            self.metrics,
            tls_ca=config.registry_tls_ca,
            char_mode=config.char_mode,
        )
        identity = DecoderIdentity(
            self.node_id, runtime.path.name, runtime.tokenizer.name, runtime.tokenizer.fingerprint
        )
        self.servicer = DecoderServicer(
            runtime.engine,
            self.store,
            Admission(config.max_active, config.max_queued),
            self.metrics,
            identity,
            registry_connected=self.subscriber.connected.is_set,
            auth=_decode_auth(config.tokens_file),
            on_engine_failed=self._serving_changed,
        )
        decoder_pb2_grpc.add_DecoderServicer_to_server(self.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME, health.SERVICE_NAME), self._server)
        # Serving once the model is loaded (it is, by construction) and at least one grammar is, until the engine fails.
        self.store.on_change(self._serving_changed)
        self.first_grammar = threading.Event()
        self.store.on_change(self.first_grammar.set)
        self.metrics_server = None

    def _serving_changed(self) -> None:
        failed = self.runtime.engine.failure is not None
        self._set_health(
            health_pb2.HealthCheckResponse.NOT_SERVING if failed else health_pb2.HealthCheckResponse.SERVING
        )

    def _set_health(self, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        self.health.set("", status)
        self.health.set(SERVICE_NAME, status)

    def start(self) -> None:
        """Metrics first: an address they cannot take fails the start (OSError) before anything serves."""
        if self.config.metrics_listen:
            try:
                self.metrics_server = self.metrics.serve(self.config.metrics_listen)
            except (OSError, ValueError) as exc:
                raise OSError(f"cannot serve metrics on {self.config.metrics_listen}: {exc}") from exc
        self._server.start()
        self.subscriber.start()

    def stop(self, grace: float | None = 5.0) -> None:
        self.health.enter_graceful_shutdown()
        self.subscriber.stop()
        self._server.stop(grace).wait()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()

    def wait(self) -> None:
        self._server.wait_for_termination()


DECODE_TOKENS_ENV = "TOOLTRIE_DECODER_TOKENS"


def _decode_auth(tokens_file: Path | None) -> Authenticator | None:
    tokens = load_optional_tokens(tokens_file, DECODE_TOKENS_ENV)
    return Authenticator(tokens) if tokens else None
