"""Catalog operations on the database, each one transaction: a failure leaves nothing half-written.

Writers take the catalog's row lock (SELECT ... FOR UPDATE on PostgreSQL, BEGIN IMMEDIATE on SQLite)
before they read the version counter, so concurrent pushers get strictly increasing numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from registry_service.canonical import ToolSpec, canonical_json, content_sha256
from registry_service.db.database import Database
from registry_service.db.models import ActivationRow, AuditRow, CatalogRow, ToolRow, VersionRow, utcnow
from registry_service.errors import Aborted, FailedPrecondition, NotFound

STAGED, ACTIVE, RETIRED = "staged", "active", "retired"


@dataclass(frozen=True, slots=True)
class VersionInfo:
    catalog: str
    number: int
    content_sha256: str
    author: str
    created_at: datetime
    parent: int
    state: str
    tool_count: int


@dataclass(frozen=True, slots=True)
class CatalogInfo:
    name: str
    active_version: int
    latest_version: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class PushResult:
    version: VersionInfo
    created: bool


@dataclass(frozen=True, slots=True)
class ActivationResult:
    version: VersionInfo
    previous_version: int


@dataclass(frozen=True, slots=True)
class ToolChange:
    name: str
    fields: list[str]


@dataclass(frozen=True, slots=True)
class Diff:
    added: list[str]
    removed: list[str]
    changed: list[ToolChange]


@dataclass(frozen=True, slots=True)
class AuditEvent:
    id: int
    at: datetime
    actor: str
    action: str
    catalog: str
    version: int
    detail: dict[str, Any]


class CatalogStore:
    def __init__(self, database: Database) -> None:
        self.db = database

    # ---- writes -------------------------------------------------------------------------------------

    def push(
        self,
        catalog: str,
        tools: Sequence[ToolSpec],
        author: str,
        activate: bool = False,
        before_commit: Callable[[], None] | None = None,
    ) -> PushResult:
        """Stores tools as the catalog's next version; identical content returns the existing version.

        before_commit runs inside the transaction, last: it may raise (e.g. the caller's deadline passed)
        and then nothing is written.
        """
        sha = content_sha256(tools)
        with self.db.write_session() as session:
            row = self._lock_catalog(session, catalog, create=True)
            existing = session.scalars(
                select(VersionRow).where(VersionRow.catalog_id == row.id, VersionRow.content_sha256 == sha)
            ).first()
            if existing is not None:
                version, created = existing, False
            else:
                version, created = self._insert_version(session, row, tools, sha, author), True
            self._audit(session, author, "push", catalog, version.number, created=created, sha256=sha)
            if activate and row.active_number != version.number:
                self._activate(session, row, version, author, kind="activate")
            if before_commit is not None:
                before_commit()
            return PushResult(_version_info(catalog, version), created)

    def activate(self, catalog: str, number: int, actor: str, expected_current: int | None = None) -> ActivationResult:
        with self.db.write_session() as session:
            row = self._lock_catalog(session, catalog)
            previous = row.active_number
            if expected_current is not None and expected_current != previous:
                raise Aborted(
                    f"catalog {catalog!r} has version {previous or 'none'} active, not the expected "
                    f"{expected_current or 'none'}; re-read and retry",
                    current_version=previous,
                )
            version = self._version_row(session, row, catalog, number)
            if previous != number:
                self._activate(session, row, version, actor, kind="activate")
            return ActivationResult(_version_info(catalog, version), previous)

    def rollback(self, catalog: str, actor: str) -> ActivationResult:
        with self.db.write_session() as session:
            row = self._lock_catalog(session, catalog)
            current = session.get(ActivationRow, row.current_activation_id) if row.current_activation_id else None
            target = session.get(ActivationRow, current.previous_id) if current and current.previous_id else None
            if target is None:
                raise FailedPrecondition(
                    f"catalog {catalog!r} has no earlier active version to roll back to "
                    f"(active: {row.active_number or 'none'})"
                )
            version = self._version_row(session, row, catalog, target.version_number)
            previous = row.active_number
            # Popping the stack: the new top remembers what the target had below it, so a second
            # rollback goes one further back instead of flipping between two versions.
            self._activate(session, row, version, actor, kind="rollback", previous_id=target.previous_id)
            return ActivationResult(_version_info(catalog, version), previous)

    # ---- reads --------------------------------------------------------------------------------------

    def get_version(self, catalog: str, number: int = 0) -> VersionInfo:
        with self.db.read_session() as session:
            row = self._catalog_row(session, catalog)
            return _version_info(catalog, self._resolve(session, row, catalog, number))

    def get_tools(self, catalog: str, number: int = 0, names_only: bool = False) -> tuple[VersionInfo, list[ToolSpec]]:
        with self.db.read_session() as session:
            row = self._catalog_row(session, catalog)
            version = self._resolve(session, row, catalog, number)
            if names_only:
                names = session.scalars(
                    select(ToolRow.name).where(ToolRow.version_id == version.id).order_by(ToolRow.name)
                )
                return _version_info(catalog, version), [ToolSpec(name=name) for name in names]
            return _version_info(catalog, version), _load_tools(session, version.id)

    def list_catalogs(self, after: str, limit: int) -> list[CatalogInfo]:
        with self.db.read_session() as session:
            rows = session.scalars(
                select(CatalogRow).where(CatalogRow.name > after).order_by(CatalogRow.name).limit(limit)
            )
            return [CatalogInfo(r.name, r.active_number, r.latest_number, r.created_at) for r in rows]

    def list_versions(self, catalog: str, before: int, limit: int) -> list[VersionInfo]:
        with self.db.read_session() as session:
            row = self._catalog_row(session, catalog)
            query = select(VersionRow).where(VersionRow.catalog_id == row.id)
            if before:
                query = query.where(VersionRow.number < before)
            rows = session.scalars(query.order_by(VersionRow.number.desc()).limit(limit))
            return [_version_info(catalog, v) for v in rows]

    def diff(self, catalog: str, from_number: int, to_number: int) -> Diff:
        with self.db.read_session() as session:
            row = self._catalog_row(session, catalog)
            old = {
                t.name: t.as_mcp()
                for t in _load_tools(session, self._version_row(session, row, catalog, from_number).id)
            }
            new = {
                t.name: t.as_mcp() for t in _load_tools(session, self._version_row(session, row, catalog, to_number).id)
            }
        changed = []
        for name in sorted(old.keys() & new.keys()):
            fields = sorted(k for k in old[name].keys() | new[name].keys() if old[name].get(k) != new[name].get(k))
            if fields:
                changed.append(ToolChange(name, fields))
        return Diff(sorted(new.keys() - old.keys()), sorted(old.keys() - new.keys()), changed)

    def list_audit(self, catalog: str, before: int, limit: int) -> list[AuditEvent]:
        with self.db.read_session() as session:
            query = select(AuditRow)
            if catalog:
                query = query.where(AuditRow.catalog_name == catalog)
            if before:
                query = query.where(AuditRow.id < before)
            rows = session.scalars(query.order_by(AuditRow.id.desc()).limit(limit))
            return [
                AuditEvent(r.id, r.at, r.actor, r.action, r.catalog_name, r.version_number, json.loads(r.detail))
                for r in rows
            ]

    # ---- helpers ------------------------------------------------------------------------------------

    def _lock_catalog(self, session: Session, catalog: str, create: bool = False) -> CatalogRow:
        if create:
            dialect_insert = sqlite_insert if self.db.is_sqlite else pg_insert
            session.execute(
                dialect_insert(CatalogRow)
                .values(name=catalog, created_at=utcnow(), latest_number=0, active_number=0)
                .on_conflict_do_nothing(index_elements=["name"])
            )
        row = session.scalars(select(CatalogRow).where(CatalogRow.name == catalog).with_for_update()).first()
        if row is None:
            raise NotFound(f"no catalog named {catalog!r}")
        return row

    @staticmethod
    def _catalog_row(session: Session, catalog: str) -> CatalogRow:
        row = session.scalars(select(CatalogRow).where(CatalogRow.name == catalog)).first()
        if row is None:
            raise NotFound(f"no catalog named {catalog!r}")
        return row

    @staticmethod
    def _version_row(session: Session, row: CatalogRow, catalog: str, number: int) -> VersionRow:
        version = session.scalars(
            select(VersionRow).where(VersionRow.catalog_id == row.id, VersionRow.number == number)
        ).first()
        if version is None:
            raise NotFound(f"catalog {catalog!r} has no version {number} (latest: {row.latest_number})")
        return version

    def _resolve(self, session: Session, row: CatalogRow, catalog: str, number: int) -> VersionRow:
        if number:
            return self._version_row(session, row, catalog, number)
        if not row.active_number:
            raise FailedPrecondition(
                f"catalog {catalog!r} has no active version; activate one of 1..{row.latest_number} or ask for one"
            )
        return self._version_row(session, row, catalog, row.active_number)

    @staticmethod
    def _insert_version(
        session: Session, row: CatalogRow, tools: Sequence[ToolSpec], sha: str, author: str
    ) -> VersionRow:
        parent = row.latest_number
        row.latest_number = parent + 1
        version = VersionRow(
            catalog_id=row.id,
            number=row.latest_number,
            content_sha256=sha,
            author=author,
            created_at=utcnow(),
            parent_number=parent,
            state=STAGED,
            tool_count=len(tools),
        )
        session.add(version)
        session.flush()
        session.execute(
            insert(ToolRow),
            [
                {
                    "version_id": version.id,
                    "name": t.name,
                    "description": t.description,
                    "input_schema": canonical_json(t.input_schema) if t.input_schema is not None else None,
                    "extra": canonical_json(t.extra),
                }
                for t in sorted(tools, key=lambda t: t.name)
            ],
        )
        return version

    def _activate(
        self,
        session: Session,
        row: CatalogRow,
        version: VersionRow,
        actor: str,
        kind: str,
        previous_id: int | None = None,
    ) -> None:
        previous_number = row.active_number
        if previous_number:
            session.execute(
                update(VersionRow)
                .where(VersionRow.catalog_id == row.id, VersionRow.number == previous_number)
                .values(state=RETIRED)
            )
        version.state = ACTIVE
        activation = ActivationRow(
            catalog_id=row.id,
            version_number=version.number,
            previous_id=row.current_activation_id if kind == "activate" else previous_id,
            kind=kind,
            actor=actor,
            at=utcnow(),
        )
        session.add(activation)
        session.flush()
        row.active_number = version.number
        row.current_activation_id = activation.id
        catalog = row.name
        self._audit(session, actor, kind, catalog, version.number, previous=previous_number)

    @staticmethod
    def _audit(session: Session, actor: str, action: str, catalog: str, version: int, **detail: Any) -> None:
        session.add(
            AuditRow(
                at=utcnow(),
                actor=actor,
                action=action,
                catalog_name=catalog,
                version_number=version,
                detail=canonical_json(detail),
            )
        )


def _version_info(catalog: str, v: VersionRow) -> VersionInfo:
    return VersionInfo(
        catalog, v.number, v.content_sha256, v.author, v.created_at, v.parent_number, v.state, v.tool_count
    )


def _load_tools(session: Session, version_id: int) -> list[ToolSpec]:
    rows = session.execute(
        select(ToolRow.name, ToolRow.description, ToolRow.input_schema, ToolRow.extra)
        .where(ToolRow.version_id == version_id)
        .order_by(ToolRow.name)
    )
    return [
        ToolSpec(
            name=name,
            description=description,
            input_schema=json.loads(schema) if schema is not None else None,
            extra=json.loads(extra),
        )
        for name, description, schema, extra in rows
    ]


def count_tools(database: Database, catalog: str, number: int) -> int:
    """Tool rows stored for a version (tests compare it with the version's tool_count)."""
    with database.read_session() as session:
        row = CatalogStore._catalog_row(session, catalog)
        version = CatalogStore._version_row(session, row, catalog, number)
        return session.scalar(select(func.count()).where(ToolRow.version_id == version.id)) or 0
