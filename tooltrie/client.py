"""Client library for the registry: channel set-up (limits, TLS, token) and typed calls."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from tooltrie.grpc_limits import DEFAULT_REGISTRY_ADDRESS, channel_options
from tooltrie.paths import admin_token_path
from tooltrie.registry.v1 import registry_pb2 as pb
from tooltrie.registry.v1 import registry_pb2_grpc
from tooltrie.rpc_status import FieldViolation

TOKEN_ENV = "TOOLTRIE_TOKEN"
REGISTRY_ENV = "TOOLTRIE_REGISTRY"


def resolve_token(explicit: str | None = None) -> str | None:
    """--token, else $TOOLTRIE_TOKEN, else the admin token a local registry generated in the data dir."""
    if explicit:
        return explicit
    if env := os.environ.get(TOKEN_ENV):
        return env
    path = admin_token_path()
    if path.exists():
        return path.read_text().strip().partition(":")[2] or None
    return None


def make_channel(address: str, tls_ca: Path | None = None) -> grpc.Channel:
    if tls_ca is not None:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(tls_ca.read_bytes()), channel_options())
    return grpc.insecure_channel(address, channel_options())


def error_details(error: grpc.RpcError) -> list[FieldViolation]:
    """The google.rpc.BadRequest field violations a failed call carries (empty when none)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is None:
        return []
    found: list[FieldViolation] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            request = error_details_pb2.BadRequest()
            detail.Unpack(request)
            found.extend(FieldViolation(v.field, v.description) for v in request.field_violations)
    return found


class RegistryClient:
    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        tls_ca: Path | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.address = address or os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY_ADDRESS
        self.channel = make_channel(self.address, tls_ca)
        self.stub = registry_pb2_grpc.RegistryStub(self.channel)
        self.token = resolve_token(token)
        self.timeout = timeout

    def channel_ready(self, timeout: float = 30.0) -> None:
        """Waits until the server answers its health check as SERVING (it may still be migrating)."""
        deadline = time.monotonic() + timeout
        stub = health_pb2_grpc.HealthStub(self.channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=max(0.1, deadline - time.monotonic()))
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"registry at {self.address} not serving after {timeout:.0f}s")
            time.sleep(0.05)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _auth(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def push(
        self, catalog: str, payload: bytes | list[dict[str, Any]], activate: bool = False
    ) -> pb.PushCatalogResponse:
        """Pushes MCP tools/list JSON bytes (sent as is, validated by the registry) or a list of tool dicts."""
        if not isinstance(payload, bytes):
            payload = json.dumps({"tools": payload}, ensure_ascii=False).encode("utf-8")
        request = pb.PushCatalogRequest(catalog=catalog, mcp_tools_list_json=payload, activate=activate)
        return self.stub.PushCatalog(request, timeout=self.timeout, metadata=self._auth())

    def get(self, catalog: str, version: int = 0, names_only: bool = False) -> pb.GetCatalogResponse:
        view = pb.CATALOG_VIEW_NAMES if names_only else pb.CATALOG_VIEW_FULL
        request = pb.GetCatalogRequest(catalog=catalog, version=version, view=view)
        return self.stub.GetCatalog(request, timeout=self.timeout)

    def catalogs(self, page_size: int = 0) -> Iterator[pb.Catalog]:
        request = pb.ListCatalogsRequest(page_size=page_size)
        return self._paginate(self.stub.ListCatalogs, request, "catalogs")

    def versions(self, catalog: str, page_size: int = 0) -> Iterator[pb.CatalogVersion]:
        request = pb.ListVersionsRequest(catalog=catalog, page_size=page_size)
        return self._paginate(self.stub.ListVersions, request, "versions")

    def _paginate(self, call: Callable[..., Any], request: Any, field: str) -> Iterator[Any]:
        """Every item of a paginated list, fetching the next page as the previous one runs out."""
        while True:
            page = call(request, timeout=self.timeout)
            yield from getattr(page, field)
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def diff(self, catalog: str, from_version: int, to_version: int) -> pb.DiffVersionsResponse:
        request = pb.DiffVersionsRequest(catalog=catalog, from_version=from_version, to_version=to_version)
        return self.stub.DiffVersions(request, timeout=self.timeout)

    def activate(self, catalog: str, version: int, expected_current: int | None = None) -> pb.ActivateVersionResponse:
        request = pb.ActivateVersionRequest(catalog=catalog, version=version)
        if expected_current is not None:
            request.expected_current_version = expected_current
        return self.stub.ActivateVersion(request, timeout=self.timeout, metadata=self._auth())

    def rollback(self, catalog: str) -> pb.RollbackResponse:
        return self.stub.Rollback(pb.RollbackRequest(catalog=catalog), timeout=self.timeout, metadata=self._auth())

    def register_tokenizer(self, blob: pb.TokenizerBlob) -> pb.RegisterTokenizerResponse:
        request = pb.RegisterTokenizerRequest(tokenizer=blob)
        return self.stub.RegisterTokenizer(request, timeout=self.timeout, metadata=self._auth())

    def compile(
        self, catalog: str, version: int, fingerprint: str, char_mode: bool = False
    ) -> pb.CompileCatalogResponse:
        mode = pb.GRAMMAR_MODE_CHAR if char_mode else pb.GRAMMAR_MODE_TOKEN
        request = pb.CompileCatalogRequest(
            catalog=catalog, version=version, tokenizer_fingerprint=fingerprint, mode=mode
        )
        return self.stub.CompileCatalog(request, timeout=self.timeout, metadata=self._auth())

    def status(self, catalog: str) -> pb.GetCatalogStatusResponse:
        return self.stub.GetCatalogStatus(pb.GetCatalogStatusRequest(catalog=catalog), timeout=self.timeout)

    def audit(self, catalog: str = "", page_size: int = 0) -> Iterator[pb.AuditEvent]:
        request = pb.ListAuditEventsRequest(catalog=catalog, page_size=page_size)
        return self._paginate(self.stub.ListAuditEvents, request, "events")
