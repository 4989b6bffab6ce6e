"""The tooltrie.registry.v1.Registry servicer: requests in, store calls, statuses out."""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from sqlalchemy.exc import DBAPIError, OperationalError

from registry_service import pagination, validation
from registry_service.canonical import ToolSpec, canonical_json
from registry_service.distribution import ActivationBus, SubscriptionSession
from registry_service.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RegistryError,
)
from registry_service.grammars import CompileOutcome, GrammarBuilder
from registry_service.nodes import NodeLedger
from registry_service.store import CatalogStore, VersionInfo
from tooltrie.auth import Authenticator
from tooltrie.grammar.tokenizers.blob import TokenizerBlob
from tooltrie.registry.v1 import registry_pb2 as pb
from tooltrie.registry.v1 import registry_pb2_grpc
from tooltrie.rpc_status import abort, bad_request

log = logging.getLogger(__name__)

_STATES = {"staged": pb.VERSION_STATE_STAGED, "active": pb.VERSION_STATE_ACTIVE, "retired": pb.VERSION_STATE_RETIRED}
_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def rpc(*, write: bool) -> Callable[[_Handler], _Handler]:
    """Readiness, authentication (writes) and the mapping of domain errors to gRPC statuses, in one place."""

    def wrap(handler: _Handler) -> _Handler:
        @functools.wraps(handler)
        def inner(self: RegistryServicer, request: Any, context: grpc.ServicerContext) -> Any:
            if not self.ready.is_set():
                abort(context, grpc.StatusCode.UNAVAILABLE, "registry is starting: database not ready yet; retry")
            kwargs = {}
            if write:
                actor = self.auth.identify(context.invocation_metadata())
                if actor is None:
                    abort(
                        context,
                        grpc.StatusCode.UNAUTHENTICATED,
                        "writes need a valid bearer token: pass --token or set TOOLTRIE_TOKEN",
                    )
                kwargs["actor"] = actor
            try:
                return handler(self, request, context, **kwargs)
            except InvalidArgument as exc:
                abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), [bad_request(exc.violations)])
            except NotFound as exc:
                abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
            except FailedPrecondition as exc:
                abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except Aborted as exc:
                info = error_details_pb2.ErrorInfo(
                    reason="ACTIVE_VERSION_CHANGED",
                    domain="tooltrie.registry.v1",
                    metadata={"current_version": str(exc.current_version)},
                )
                abort(context, grpc.StatusCode.ABORTED, str(exc), [info])
            except DeadlineExceeded as exc:
                abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
            except (OperationalError, DBAPIError) as exc:
                log.warning("database error in %s: %s", handler.__name__, exc.orig if exc.orig else exc)
                abort(context, grpc.StatusCode.UNAVAILABLE, "database unavailable; retry shortly")
            except RegistryError as exc:
                abort(context, grpc.StatusCode.INTERNAL, str(exc))
            return None  # unreachable: abort raises

        return inner  # type: ignore[return-value]

    return wrap


class RegistryServicer(registry_pb2_grpc.RegistryServicer):
    def __init__(self, store: CatalogStore, auth: Authenticator, limits: validation.CatalogLimits) -> None:
        self.store = store
        self.auth = auth
        self.limits = limits
        self.ready = threading.Event()
        self.grammars = GrammarBuilder(store.db)
        self.ledger = NodeLedger(store.db)
        self.bus = ActivationBus()

    @rpc(write=True)
    def PushCatalog(self, request: pb.PushCatalogRequest, context: grpc.ServicerContext, actor: str) -> Any:
        tools = validation.parse_push(request, self.limits)
        result = self.store.push(
            request.catalog, tools, actor, activate=request.activate, before_commit=lambda: _check_deadline(context)
        )
        log.info("push %s v%d by %s (created=%s)", request.catalog, result.version.number, actor, result.created)
        if request.activate:
            self.bus.notify()
        # After the commit: a tokenizer the names do not compile for is reported, and the version is kept.
        compiled = self.grammars.compile_all(request.catalog, result.version.number)
        return pb.PushCatalogResponse(
            version=_version_pb(result.version), created=result.created, compiled=[_compile_pb(c) for c in compiled]
        )

    @rpc(write=False)
    def GetCatalog(self, request: pb.GetCatalogRequest, context: grpc.ServicerContext) -> Any:
        validation.require_catalog_name(request.catalog)
        names_only = request.view == pb.CATALOG_VIEW_NAMES
        version, tools = self.store.get_tools(request.catalog, request.version, names_only=names_only)
        return pb.GetCatalogResponse(version=_version_pb(version), tools=[tool_pb(t) for t in tools])

    @rpc(write=False)
    def ListCatalogs(self, request: pb.ListCatalogsRequest, context: grpc.ServicerContext) -> Any:
        size = pagination.page_size(request.page_size)
        after = pagination.decode(request.page_token, "after") or ""
        rows = self.store.list_catalogs(after, size + 1)
        page, more = rows[:size], len(rows) > size
        return pb.ListCatalogsResponse(
            catalogs=[
                pb.Catalog(
                    name=c.name,
                    active_version=c.active_version,
                    latest_version=c.latest_version,
                    created_at=_timestamp(c.created_at),
                )
                for c in page
            ],
            next_page_token=pagination.encode({"after": page[-1].name}) if more else "",
        )

    @rpc(write=False)
    def ListVersions(self, request: pb.ListVersionsRequest, context: grpc.ServicerContext) -> Any:
        validation.require_catalog_name(request.catalog)
        size = pagination.page_size(request.page_size)
        before = pagination.decode(request.page_token, "before") or 0
        rows = self.store.list_versions(request.catalog, before, size + 1)
        page, more = rows[:size], len(rows) > size
        return pb.ListVersionsResponse(
            versions=[_version_pb(v) for v in page],
            next_page_token=pagination.encode({"before": page[-1].number}) if more else "",
        )

    @rpc(write=False)
    def DiffVersions(self, request: pb.DiffVersionsRequest, context: grpc.ServicerContext) -> Any:
        validation.require_catalog_name(request.catalog)
        diff = self.store.diff(request.catalog, request.from_version, request.to_version)
        return pb.DiffVersionsResponse(
            added=diff.added,
            removed=diff.removed,
            changed=[pb.ToolChange(name=c.name, fields=c.fields) for c in diff.changed],
        )

    @rpc(write=True)
    def ActivateVersion(self, request: pb.ActivateVersionRequest, context: grpc.ServicerContext, actor: str) -> Any:
        validation.require_catalog_name(request.catalog)
        expected = request.expected_current_version if request.HasField("expected_current_version") else None
        result = self.store.activate(request.catalog, request.version, actor, expected_current=expected)
        log.info("activate %s v%d by %s (was v%d)", request.catalog, request.version, actor, result.previous_version)
        self.bus.notify()
        return pb.ActivateVersionResponse(version=_version_pb(result.version), previous_version=result.previous_version)

    @rpc(write=True)
    def Rollback(self, request: pb.RollbackRequest, context: grpc.ServicerContext, actor: str) -> Any:
        validation.require_catalog_name(request.catalog)
        result = self.store.rollback(request.catalog, actor)
        log.info("rollback %s to v%d by %s", request.catalog, result.version.number, actor)
        self.bus.notify()
        return pb.RollbackResponse(version=_version_pb(result.version), previous_version=result.previous_version)

    @rpc(write=False)
    def ListAuditEvents(self, request: pb.ListAuditEventsRequest, context: grpc.ServicerContext) -> Any:
        size = pagination.page_size(request.page_size)
        before = pagination.decode(request.page_token, "before") or 0
        rows = self.store.list_audit(request.catalog, before, size + 1)
        page, more = rows[:size], len(rows) > size
        return pb.ListAuditEventsResponse(
            events=[
                pb.AuditEvent(
                    id=e.id,
                    at=_timestamp(e.at),
                    actor=e.actor,
                    action=e.action,
                    catalog=e.catalog,
                    version=e.version,
                    detail_json=json.dumps(e.detail, sort_keys=True),
                )
                for e in page
            ],
            next_page_token=pagination.encode({"before": page[-1].id}) if more else "",
        )

    @rpc(write=True)
    def RegisterTokenizer(self, request: pb.RegisterTokenizerRequest, context: grpc.ServicerContext, actor: str) -> Any:
        t = request.tokenizer
        created = self.grammars.register(TokenizerBlob(t.fingerprint, t.kind, t.data, t.name))
        return pb.RegisterTokenizerResponse(created=created)

    @rpc(write=True)
    def CompileCatalog(self, request: pb.CompileCatalogRequest, context: grpc.ServicerContext, actor: str) -> Any:
        validation.require_catalog_name(request.catalog)
        version = self.store.get_version(request.catalog, request.version)
        mode = "char" if request.mode == pb.GRAMMAR_MODE_CHAR else "token"
        outcome = self.grammars.compile(request.catalog, version.number, request.tokenizer_fingerprint, mode)
        return pb.CompileCatalogResponse(version=_version_pb(version), result=_compile_pb(outcome))

    @rpc(write=False)
    def GetCatalogStatus(self, request: pb.GetCatalogStatusRequest, context: grpc.ServicerContext) -> Any:
        validation.require_catalog_name(request.catalog)
        active, nodes = self.ledger.status(request.catalog)
        return pb.GetCatalogStatusResponse(
            catalog=request.catalog,
            active_version=active,
            decoders=[
                pb.DecoderGrammarStatus(
                    node_id=n.node_id,
                    tokenizer_fingerprint=n.tokenizer_fingerprint,
                    connected=n.connected,
                    applied_version=n.applied_version,
                    applied_at=_timestamp(n.applied_at) if n.applied_at else None,
                    nacked_version=n.nacked_version,
                    nack_error=n.nack_error,
                    last_seen=_timestamp(n.last_seen),
                )
                for n in nodes
            ],
        )

    def Subscribe(self, request_iterator: Iterator[pb.SubscribeRequest], context: grpc.ServicerContext) -> Any:
        if not self.ready.is_set():
            abort(context, grpc.StatusCode.UNAVAILABLE, "registry is starting: database not ready yet; retry")
        if self.auth.identify(context.invocation_metadata()) is None:
            abort(context, grpc.StatusCode.UNAUTHENTICATED, "Subscribe needs a valid bearer token")
        session = SubscriptionSession(self.store.db, self.store, self.grammars, self.ledger, self.bus, context)
        try:
            yield from session.run(request_iterator)
        except ValueError as exc:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except InvalidArgument as exc:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), [bad_request(exc.violations)])
        except (OperationalError, DBAPIError):
            abort(context, grpc.StatusCode.UNAVAILABLE, "database unavailable; reconnect shortly")


def _compile_pb(outcome: CompileOutcome) -> pb.CompileResult:
    stats = outcome.stats
    return pb.CompileResult(
        tokenizer_fingerprint=outcome.tokenizer_fingerprint,
        tokenizer_name=outcome.tokenizer_name,
        mode=pb.GRAMMAR_MODE_CHAR if outcome.mode == "char" else pb.GRAMMAR_MODE_TOKEN,
        ok=outcome.ok,
        error=outcome.error,
        stats=pb.CompileStats(
            nodes=stats.get("n_nodes", 0),
            edges=stats.get("n_edges", 0),
            max_out_degree=stats.get("max_out_degree", 0),
            depth=stats.get("depth", 0),
            bytes=stats.get("device_bytes", 0),
            root_out_degree=stats.get("root_out_degree", 0),
            fits_constant_bank=stats.get("fits_constant_bank", False),
            compile_seconds=stats.get("compile_seconds", 0.0),
        ),
    )


def _check_deadline(context: grpc.ServicerContext) -> None:
    remaining = context.time_remaining()
    if not context.is_active() or (remaining is not None and remaining <= 0):
        raise DeadlineExceeded("the call's deadline passed before the push could commit; nothing was written")


def _timestamp(value: Any) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def _version_pb(v: VersionInfo) -> pb.CatalogVersion:
    return pb.CatalogVersion(
        catalog=v.catalog,
        number=v.number,
        content_sha256=v.content_sha256,
        author=v.author,
        created_at=_timestamp(v.created_at),
        parent=v.parent,
        state=_STATES[v.state],
        tool_count=v.tool_count,
    )


def tool_pb(tool: ToolSpec) -> pb.Tool:
    return pb.Tool(
        name=tool.name,
        description=tool.description or "",
        input_schema_json=canonical_json(tool.input_schema) if tool.input_schema is not None else "",
        extra_json=canonical_json(tool.extra) if tool.extra else "",
    )
