"""The grammars a decoder holds: several catalogs, several versions each, one of them active per catalog.

Loading happens off the serving path (the subscriber's thread); activation is one reference swap under a lock.
A request takes its `LoadedGrammar` at admission and keeps that reference to the end, so it finishes on the
version it started with even when a newer one is activated or an older one is evicted meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from decoder_service.engines.catalog import PreparedCatalog, Tool

# Versions kept per catalog besides the active one: pinned requests and quick rollbacks find them.
KEEP_INACTIVE = 2


class GrammarUnavailable(LookupError):
    """No grammar fits the request: which one is missing and what is held is in the message."""

    def __init__(self, message: str, *, catalog_known: bool) -> None:
        super().__init__(message)
        self.catalog_known = catalog_known


@dataclass(frozen=True, slots=True)
class LoadedGrammar:
    catalog: str
    version: int
    content_sha256: str
    tools: tuple[Tool, ...]
    prepared: PreparedCatalog
    loaded_at: float


Preparer = Callable[[str, int, Sequence[Tool], bytes], PreparedCatalog]


class GrammarStore:
    def __init__(self, prepare: Preparer) -> None:
        self._prepare = prepare
        self._lock = threading.Lock()
        self._versions: dict[str, dict[int, LoadedGrammar]] = {}
        self._active: dict[str, int] = {}
        self._refused: dict[str, str] = {}  # catalog -> why its last pushed version could not be loaded
        self._listeners: list[Callable[[], None]] = []

    def load(
        self, catalog: str, version: int, content_sha256: str, tools: Sequence[Tool], trie: bytes
    ) -> LoadedGrammar:
        """Verifies and prepares a version (slow: tokenizes the prompt, checks the trie); does not activate it."""
        prepared = self._prepare(catalog, version, tools, trie)
        return LoadedGrammar(catalog, version, content_sha256, tuple(tools), prepared, time.time())

    def refuse(self, catalog: str, version: int, reason: str) -> None:
        """Remembers why a pushed version was not loaded, so requests for the catalog hear it."""
        with self._lock:
            self._refused[catalog] = f"{catalog} v{version} could not be loaded by this decoder: {reason}"

    def activate(self, grammar: LoadedGrammar) -> None:
        with self._lock:
            self._refused.pop(grammar.catalog, None)
            versions = self._versions.setdefault(grammar.catalog, {})
            versions[grammar.version] = grammar
            self._active[grammar.catalog] = grammar.version
            inactive = sorted((v for v in versions if v != grammar.version), key=lambda v: versions[v].loaded_at)
            for old in inactive[: max(0, len(inactive) - KEEP_INACTIVE)]:
                del versions[old]
        for listener in self._listeners:
            listener()

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def resolve(self, catalog: str, version: int = 0) -> LoadedGrammar:
        """The active version, or the pinned one if held; GrammarUnavailable otherwise."""
        with self._lock:
            versions = self._versions.get(catalog)
            if not versions and catalog in self._refused:
                raise GrammarUnavailable(self._refused[catalog], catalog_known=True)
            if not versions:
                loaded = ", ".join(sorted(self._versions)) or "none"
                raise GrammarUnavailable(f"no grammar for catalog {catalog!r} (loaded: {loaded})", catalog_known=False)
            wanted = version or self._active[catalog]
            grammar = versions.get(wanted)
            if grammar is None:
                held = ", ".join(f"v{v}" for v in sorted(versions))
                raise GrammarUnavailable(
                    f"catalog {catalog!r} version {wanted} is not held by this decoder (held: {held}; "
                    f"active: v{self._active[catalog]}); activate it on the registry or omit the version",
                    catalog_known=True,
                )
            return grammar

    def active(self) -> dict[str, int]:
        with self._lock:
            return dict(self._active)

    def held(self) -> dict[str, list[int]]:
        with self._lock:
            return {catalog: sorted(versions) for catalog, versions in self._versions.items()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._active)
