"""Assembles and runs the registry's gRPC server: service, health, reflection, TLS, graceful shutdown."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from registry_service.db.database import Database
from registry_service.service import RegistryServicer
from registry_service.store import CatalogStore
from registry_service.validation import CatalogLimits
from tooltrie.auth import Authenticator, load_server_tokens
from tooltrie.grpc_limits import DEFAULT_REGISTRY_ADDRESS
from tooltrie.grpc_listen import bind, new_server
from tooltrie.registry.v1 import registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = registry_pb2.DESCRIPTOR.services_by_name["Registry"].full_name


@dataclass(slots=True)
class RegistryConfig:
    db_url: str
    listen: str = DEFAULT_REGISTRY_ADDRESS
    tokens_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Migrate on start; off, the registry waits (NOT_SERVING) until `tooltrie registry migrate` ran.
    migrate: bool = True
    limits: CatalogLimits = field(default_factory=CatalogLimits)
    max_workers: int = 32
    db_check_seconds: float = 2.0


class RegistryServer:
    def __init__(self, config: RegistryConfig) -> None:
        self.config = config
        self.database = Database(config.db_url)
        self.servicer = RegistryServicer(
            CatalogStore(self.database), Authenticator(load_server_tokens(config.tokens_file)), config.limits
        )
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self._stopping = threading.Event()
        self._server = new_server(config.max_workers, "registry")
        registry_pb2_grpc.add_RegistryServicer_to_server(self.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME, health.SERVICE_NAME), self._server)
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.port = bind(self._server, config.listen, config.tls_cert, config.tls_key)
        self._watcher = threading.Thread(target=self._watch_database, name="registry-db-watch", daemon=True)

    def start(self) -> None:
        self._server.start()
        self._watcher.start()

    def _set_health(self, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        self.health.set("", status)
        self.health.set(SERVICE_NAME, status)

    def _watch_database(self) -> None:
        """NOT_SERVING until the database is reachable and migrated; then watch it, so health tells the truth."""
        delay = 0.2
        serving = False
        while not self._stopping.is_set():
            try:
                if not self.servicer.ready.is_set():
                    self._prepare_schema()
                    self.servicer.ready.set()
                else:
                    self.database.ping()
                healthy = True
            except Exception as exc:  # any database failure keeps us NOT_SERVING and retrying
                healthy = False
                log.warning("database not ready (%s); retrying in %.1fs", _short(exc), delay)
            if healthy != serving:
                serving = healthy
                self._set_health(
                    health_pb2.HealthCheckResponse.SERVING if healthy else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                log.info("registry %s", "serving" if healthy else "not serving")
            wait = self.config.db_check_seconds if healthy else delay
            delay = 0.2 if healthy else min(delay * 2, 5.0)
            self._stopping.wait(wait)

    def _prepare_schema(self) -> None:
        if self.config.migrate:
            self.database.migrate()
        elif not self.database.schema_is_current():
            raise RuntimeError("schema is not at the latest migration; run `tooltrie registry migrate --db URL`")

    def stop(self, grace: float | None = 5.0) -> None:
        """Refuses new calls, lets running ones finish within grace seconds, then closes the database."""
        self._stopping.set()
        self.health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
        self.database.dispose()

    def wait(self) -> None:
        self._server.wait_for_termination()


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
