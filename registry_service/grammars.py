"""Compiled grammars: every catalog version compiled for every registered tokenizer, stored with its stats.

A compile failure is stored too (ok = false, with the error), so the version is kept and the failure shows
in the push response and in CompileCatalog. Tokenizers are rebuilt from their stored blobs once per process.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from registry_service.db.database import Database
from registry_service.db.models import CatalogRow, CompiledGrammarRow, TokenizerRow, ToolRow, VersionRow, utcnow
from registry_service.errors import FailedPrecondition, InvalidArgument, NotFound
from tooltrie.grammar import (
    GrammarError,
    MatcherCache,
    TokenizationCache,
    Tokenizer,
    TokenizerError,
    compile_catalog,
    compile_charlevel,
)
from tooltrie.grammar.tokenizers.blob import TokenizerBlob, from_blob
from tooltrie.rpc_status import FieldViolation

log = logging.getLogger(__name__)

MODES = ("token", "char")


@dataclass(frozen=True, slots=True)
class CompileOutcome:
    catalog: str
    version: int
    tokenizer_fingerprint: str
    tokenizer_name: str
    mode: str
    ok: bool
    error: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


class GrammarBuilder:
    def __init__(self, database: Database) -> None:
        self.db = database
        self._tokenizers: dict[str, Tokenizer] = {}
        self._cache = TokenizationCache()  # names' tokenizations survive across versions: warm compiles
        self._matchers = MatcherCache()  # one vocabulary matcher per tokenizer, for character-level compiles
        self._lock = threading.Lock()

    # ---- tokenizers ---------------------------------------------------------------------------------

    def register(self, blob: TokenizerBlob) -> bool:
        """Stores a tokenizer after checking that it rebuilds with the fingerprint it claims."""
        if self.known(blob.fingerprint):
            return False
        try:
            tokenizer = from_blob(blob)
        except TokenizerError as exc:
            raise InvalidArgument("tokenizer refused", [FieldViolation("tokenizer", str(exc))]) from None
        try:
            with self.db.write_session() as session:
                session.add(
                    TokenizerRow(
                        fingerprint=blob.fingerprint,
                        name=blob.name,
                        kind=blob.kind,
                        data=blob.data,
                        created_at=utcnow(),
                    )
                )
        except IntegrityError:
            return False  # registered concurrently by another decoder
        with self._lock:
            self._tokenizers[blob.fingerprint] = tokenizer
        log.info("registered tokenizer %s (%s)", blob.name, blob.fingerprint[:16])
        return True

    def known(self, fingerprint: str) -> bool:
        if fingerprint in self._tokenizers:
            return True
        with self.db.read_session() as session:
            return session.scalar(select(TokenizerRow.id).where(TokenizerRow.fingerprint == fingerprint)) is not None

    def fingerprints(self) -> list[str]:
        with self.db.read_session() as session:
            return list(session.scalars(select(TokenizerRow.fingerprint).order_by(TokenizerRow.id)))

    def tokenizer(self, fingerprint: str) -> Tokenizer:
        with self._lock:
            if fingerprint in self._tokenizers:
                return self._tokenizers[fingerprint]
        with self.db.read_session() as session:
            row = session.scalars(select(TokenizerRow).where(TokenizerRow.fingerprint == fingerprint)).first()
            if row is None:
                raise NotFound(f"no tokenizer with fingerprint {fingerprint!r}; register it first")
            blob = TokenizerBlob(row.fingerprint, row.kind, row.data, row.name)
        tokenizer = from_blob(blob)
        with self._lock:
            self._tokenizers[fingerprint] = tokenizer
        return tokenizer

    # ---- compiling ----------------------------------------------------------------------------------

    def compile_all(self, catalog: str, version: int) -> list[CompileOutcome]:
        return [self.compile(catalog, version, fp) for fp in self.fingerprints()]

    def compile(self, catalog: str, version: int, fingerprint: str, mode: str = "token") -> CompileOutcome:
        """The stored result for (version, tokenizer, mode), compiling and storing it first if needed."""
        stored = self._stored(catalog, version, fingerprint, mode)
        if stored is not None:
            return stored[0]
        if mode not in MODES:
            raise InvalidArgument("unknown mode", [FieldViolation("mode", f"{mode!r}; expected one of {MODES}")])
        tokenizer = self.tokenizer(fingerprint)
        names = self._names(catalog, version)
        started = time.perf_counter()
        trie_blob: bytes | None = None
        try:
            if mode == "char":
                trie = compile_charlevel(names, tokenizer, matcher_cache=self._matchers)
            else:
                trie = compile_catalog(names, tokenizer, cache=self._cache)
            trie_blob = trie.to_bytes()
            stats = trie.stats.as_dict() | {"compile_seconds": time.perf_counter() - started}
            error = ""
        except (GrammarError, ValueError) as exc:
            stats, error = {}, f"{type(exc).__name__}: {exc}"
            log.warning("compiling %s v%d for %s failed: %s", catalog, version, tokenizer.name, error)
        outcome = CompileOutcome(catalog, version, fingerprint, tokenizer.name, mode, not error, error, stats)
        self._store(outcome, trie_blob)
        return self._stored(catalog, version, fingerprint, mode)[0]  # type: ignore[index]

    def trie(self, catalog: str, version: int, fingerprint: str, mode: str = "token") -> bytes:
        """The serialised trie; FailedPrecondition when compiling it failed."""
        outcome = self.compile(catalog, version, fingerprint, mode)
        if not outcome.ok:
            raise FailedPrecondition(
                f"{catalog} v{version} does not compile for {outcome.tokenizer_name}: {outcome.error}"
            )
        stored = self._stored(catalog, version, fingerprint, mode, with_trie=True)
        assert stored is not None and stored[1] is not None
        return stored[1]

    def _names(self, catalog: str, version: int) -> list[str]:
        with self.db.read_session() as session:
            version_id = self._version_id(session, catalog, version)
            return list(session.scalars(select(ToolRow.name).where(ToolRow.version_id == version_id)))

    @staticmethod
    def _version_id(session: Any, catalog: str, version: int) -> int:
        version_id = session.scalar(
            select(VersionRow.id)
            .join(CatalogRow, CatalogRow.id == VersionRow.catalog_id)
            .where(CatalogRow.name == catalog, VersionRow.number == version)
        )
        if version_id is None:
            raise NotFound(f"catalog {catalog!r} has no version {version}")
        return version_id

    def _stored(
        self, catalog: str, version: int, fingerprint: str, mode: str, with_trie: bool = False
    ) -> tuple[CompileOutcome, bytes | None] | None:
        with self.db.read_session() as session:
            version_id = self._version_id(session, catalog, version)
            columns = [CompiledGrammarRow.ok, CompiledGrammarRow.error, CompiledGrammarRow.stats, TokenizerRow.name]
            if with_trie:
                columns.append(CompiledGrammarRow.trie)
            row = session.execute(
                select(*columns)
                .join(TokenizerRow, TokenizerRow.id == CompiledGrammarRow.tokenizer_id)
                .where(
                    CompiledGrammarRow.version_id == version_id,
                    CompiledGrammarRow.mode == mode,
                    TokenizerRow.fingerprint == fingerprint,
                )
            ).first()
        if row is None:
            return None
        outcome = CompileOutcome(
            catalog, version, fingerprint, row.name, mode, row.ok, row.error, json.loads(row.stats)
        )
        return outcome, (row.trie if with_trie else None)

    def _store(self, outcome: CompileOutcome, trie_blob: bytes | None) -> None:
        try:
            with self.db.write_session() as session:
                version_id = self._version_id(session, outcome.catalog, outcome.version)
                tokenizer_id = session.scalar(
                    select(TokenizerRow.id).where(TokenizerRow.fingerprint == outcome.tokenizer_fingerprint)
                )
                session.add(
                    CompiledGrammarRow(
                        version_id=version_id,
                        tokenizer_id=tokenizer_id,
                        mode=outcome.mode,
                        ok=outcome.ok,
                        error=outcome.error,
                        stats=json.dumps(outcome.stats, sort_keys=True),
                        trie=trie_blob,
                        created_at=utcnow(),
                    )
                )
        except IntegrityError:
            pass  # compiled concurrently; the stored result is the same
