"""The tooltrie.decoder.v1.Decoder servicer: validate, admit, decode on one grammar version, stream pointers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from decoder_service.admission import Admission, Overloaded
from decoder_service.engines.base import (
    DecodeError,
    DecodeRequest,
    Engine,
    EngineFailed,
    EngineOutOfMemory,
    PointerEvent,
    PromptTooLong,
    SummaryEvent,
)
from decoder_service.engines.prompt import intent_problem
from decoder_service.grammar_store import GrammarStore, GrammarUnavailable
from decoder_service.metrics import DecoderMetrics
from tooltrie.auth import Authenticator
from tooltrie.decoder.v1 import decoder_pb2 as pb
from tooltrie.decoder.v1 import decoder_pb2_grpc
from tooltrie.grammar import K_MAX
from tooltrie.names import name_problem
from tooltrie.rpc_status import FieldViolation, abort, bad_request, retry_info

log = logging.getLogger(__name__)

MAX_INTENT_CHARS = 8_000


def text_field(request: pb.DecodeRequest) -> str:
    """The field that carried a request's text: ``messages`` when given, else ``intent``."""
    return "messages" if request.messages else "intent"


def refuse_text(context: grpc.ServicerContext, request: pb.DecodeRequest, problem: str) -> None:
    """Ends the call with INVALID_ARGUMENT, ``problem`` as the violation of the field that carried the text."""
    abort(
        context,
        grpc.StatusCode.INVALID_ARGUMENT,
        problem,
        [bad_request([FieldViolation(text_field(request), problem)])],
    )


@dataclass(frozen=True, slots=True)
class DecoderIdentity:
    node_id: str
    model: str
    tokenizer: str
    tokenizer_fingerprint: str


class DecoderServicer(decoder_pb2_grpc.DecoderServicer):
    def __init__(
        self,
        engine: Engine,
        store: GrammarStore,
        admission: Admission,
        metrics: DecoderMetrics,
        identity: DecoderIdentity,
        registry_connected: Callable[[], bool] = lambda: False,
        auth: Authenticator | None = None,
        on_engine_failed: Callable[[], None] = lambda: None,
    ) -> None:
        self.engine, self.store, self.admission, self.metrics = engine, store, admission, metrics
        self.identity = identity
        self.registry_connected = registry_connected
        self.on_engine_failed = on_engine_failed  # the server stops reporting itself as serving
        # Decode is open unless the decoder was given tokens; then every call needs one.
        self.auth = auth

    def Decode(self, request: pb.DecodeRequest, context: grpc.ServicerContext) -> Iterator[pb.DecodeResponse]:
        failed = True
        try:
            yield from self._decode(request, context)
            failed = False
        finally:
            code = context.code()  # set by abort; None when the handler ended on its own
            if code is None:
                code = (
                    grpc.StatusCode.CANCELLED
                    if not context.is_active()
                    else (grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK)
                )
            self.metrics.requests.labels(code.name).inc()

    def _decode(self, request: pb.DecodeRequest, context: grpc.ServicerContext) -> Iterator[pb.DecodeResponse]:
        if self.auth is not None and self.auth.identify(context.invocation_metadata()) is None:
            abort(context, grpc.StatusCode.UNAUTHENTICATED, "this decoder needs a bearer token: pass --token")
        intent = self._validate(request, context)
        grammar = self._grammar(request, context)
        if problem := intent_problem(grammar.prepared, intent):
            refuse_text(context, request, problem)
        if request.k > len(grammar.tools):
            field = FieldViolation(
                "k",
                f"k={request.k} but catalog {grammar.catalog!r} v{grammar.version} has only {len(grammar.tools)} tools",
            )
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, "k larger than the catalog", [bad_request([field])])
        admitted = time.perf_counter()
        try:
            with self.admission.slot(context.is_active):
                cancelled = lambda: not context.is_active()  # noqa: E731
                events = self.engine.decode(
                    DecodeRequest(intent=intent, k=request.k, catalog=grammar.prepared, cancelled=cancelled)
                )
                try:
                    yield from self._stream(events, grammar.version, admitted, context)
                finally:
                    events.close()  # a cancelled call stops decoding here and frees its state
        except Overloaded as exc:
            abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), [retry_info(exc.retry_after)])
        except PromptTooLong as exc:  # raised before the first event: nothing was streamed
            refuse_text(context, request, str(exc))
        except EngineFailed as exc:
            self.on_engine_failed()
            abort(context, grpc.StatusCode.UNAVAILABLE, f"this decoder can no longer decode: {exc}")
        except EngineOutOfMemory as exc:
            log.error("decode on %s v%d ran out of device memory: %s", grammar.catalog, grammar.version, exc)
            abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, f"decoding failed: {exc}")
        except DecodeError as exc:
            log.error("decode failed on %s v%d: %s", grammar.catalog, grammar.version, exc)
            abort(context, grpc.StatusCode.INTERNAL, f"decoding failed: {exc}")

    def _stream(
        self, events: Iterator[Any], version: int, admitted: float, context: grpc.ServicerContext
    ) -> Iterator[pb.DecodeResponse]:
        for event in events:
            if not context.is_active():
                return
            if isinstance(event, PointerEvent):
                if event.index == 0:
                    self.metrics.first_pointer.observe(time.perf_counter() - admitted)
                self.metrics.pointers.inc()
                yield pb.DecodeResponse(
                    pointer=pb.Pointer(
                        index=event.index,
                        tool=event.name,
                        catalog_version=version,
                        token_ids=list(event.token_ids),
                        score=event.score,
                        seconds=event.seconds,
                    )
                )
            elif isinstance(event, SummaryEvent):
                self.metrics.tokens.inc(event.tokens_generated)
                self.metrics.answer.observe(time.perf_counter() - admitted)
                yield pb.DecodeResponse(
                    summary=pb.DecodeSummary(
                        tokens_generated=event.tokens_generated,
                        forward_passes=event.forward_passes,
                        prefill_seconds=event.prefill_seconds,
                        decode_seconds=event.decode_seconds,
                        catalog_version=version,
                        prompt_tokens=event.prompt_tokens,
                        prefix_cached=event.prefix_cached,
                        engine=self.engine.name,
                    )
                )

    def _validate(self, request: pb.DecodeRequest, context: grpc.ServicerContext) -> str:
        violations = []
        if problem := name_problem(request.catalog):
            violations.append(FieldViolation("catalog", problem))
        if not 1 <= request.k <= K_MAX:
            violations.append(FieldViolation("k", f"k={request.k}; expected 1 to {K_MAX}"))
        intent = request.intent or "\n".join(f"{m.role}: {m.content}" for m in request.messages)
        if request.intent and request.messages:
            violations.append(FieldViolation("messages", "give either intent or messages, not both"))
        field = text_field(request)
        if not intent.strip():
            violations.append(FieldViolation(field, "empty; say what the agent should do"))
        elif len(intent) > MAX_INTENT_CHARS:
            violations.append(FieldViolation(field, f"{len(intent)} characters, over the limit of {MAX_INTENT_CHARS}"))
        if violations:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid decode request", [bad_request(violations)])
        return intent

    def _grammar(self, request: pb.DecodeRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self.store.resolve(request.catalog, request.version)
        except GrammarUnavailable as exc:
            if exc.catalog_known:  # an unheld pinned version, or a version this decoder refused to load
                abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            if len(self.store) == 0:
                abort(context, grpc.StatusCode.FAILED_PRECONDITION, "no grammar loaded yet; the decoder is starting")
            abort(context, grpc.StatusCode.NOT_FOUND, str(exc))

    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext) -> pb.GetStatusResponse:
        active = self.store.active()
        return pb.GetStatusResponse(
            node_id=self.identity.node_id,
            engine=self.engine.name,
            model=self.identity.model,
            tokenizer=self.identity.tokenizer,
            tokenizer_fingerprint=self.identity.tokenizer_fingerprint,
            registry_connected=bool(self.registry_connected()),
            engine_failure=self.engine.failure or "",
            context=self.engine.context,
            catalogs=[
                pb.HeldCatalog(catalog=c, active_version=active.get(c, 0), held_versions=versions)
                for c, versions in sorted(self.store.held().items())
            ],
        )
