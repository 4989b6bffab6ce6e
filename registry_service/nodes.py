"""The ledger of decoder nodes: who is connected, and per catalog what each one ACKed or NACKed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry_service.db.database import Database
from registry_service.db.models import CatalogRow, DecoderGrammarRow, DecoderNodeRow, utcnow
from registry_service.errors import NotFound


@dataclass(frozen=True, slots=True)
class NodeGrammarStatus:
    node_id: str
    tokenizer_fingerprint: str
    connected: bool
    applied_version: int
    applied_at: datetime | None
    nacked_version: int
    nack_error: str
    last_seen: datetime


class NodeLedger:
    def __init__(self, database: Database) -> None:
        self.db = database

    def hello(self, node_id: str, fingerprint: str, held: dict[str, int]) -> None:
        """A (re)connected decoder: mark it connected and record what it says it runs."""
        with self.db.write_session() as session:
            node = session.scalars(select(DecoderNodeRow).where(DecoderNodeRow.node_id == node_id)).first()
            if node is None:
                node = DecoderNodeRow(node_id=node_id, tokenizer_fingerprint=fingerprint, last_seen=utcnow())
                session.add(node)
            node.tokenizer_fingerprint, node.connected, node.last_seen = fingerprint, True, utcnow()
            session.flush()
            for catalog, version in held.items():
                row = self._grammar_row(session, node.id, catalog)
                if row is not None:
                    row.applied_version, row.applied_at = version, utcnow()

    def disconnected(self, node_id: str) -> None:
        with self.db.write_session() as session:
            node = session.scalars(select(DecoderNodeRow).where(DecoderNodeRow.node_id == node_id)).first()
            if node is not None:
                node.connected, node.last_seen = False, utcnow()

    def applied(self, node_id: str, catalog: str, version: int) -> None:
        with self.db.write_session() as session:
            row = self._grammar_row(session, self._node_pk(session, node_id), catalog)
            if row is not None:
                row.applied_version, row.applied_at = version, utcnow()

    def refused(self, node_id: str, catalog: str, version: int, error: str) -> None:
        with self.db.write_session() as session:
            row = self._grammar_row(session, self._node_pk(session, node_id), catalog)
            if row is not None:
                row.nacked_version, row.nack_error, row.nacked_at = version, error[:4000], utcnow()

    def status(self, catalog: str) -> tuple[int, list[NodeGrammarStatus]]:
        """The catalog's active version and every decoder that ever ran or refused a version of it."""
        with self.db.read_session() as session:
            row = session.scalars(select(CatalogRow).where(CatalogRow.name == catalog)).first()
            if row is None:
                raise NotFound(f"no catalog named {catalog!r}")
            rows = session.execute(
                select(DecoderNodeRow, DecoderGrammarRow)
                .join(DecoderGrammarRow, DecoderGrammarRow.node_id == DecoderNodeRow.id)
                .where(DecoderGrammarRow.catalog_id == row.id)
                .order_by(DecoderNodeRow.node_id)
            ).all()
            return row.active_number, [
                NodeGrammarStatus(
                    node.node_id,
                    node.tokenizer_fingerprint,
                    node.connected,
                    grammar.applied_version,
                    grammar.applied_at,
                    grammar.nacked_version,
                    grammar.nack_error,
                    node.last_seen,
                )
                for node, grammar in rows
            ]

    @staticmethod
    def _node_pk(session: Session, node_id: str) -> int:
        pk = session.scalar(select(DecoderNodeRow.id).where(DecoderNodeRow.node_id == node_id))
        if pk is None:
            raise NotFound(f"unknown decoder node {node_id!r}")
        return pk

    @staticmethod
    def _grammar_row(session: Session, node_pk: int, catalog: str) -> DecoderGrammarRow | None:
        catalog_pk = session.scalar(select(CatalogRow.id).where(CatalogRow.name == catalog))
        if catalog_pk is None:
            return None
        row = session.scalars(
            select(DecoderGrammarRow).where(
                DecoderGrammarRow.node_id == node_pk, DecoderGrammarRow.catalog_id == catalog_pk
            )
        ).first()
        if row is None:
            row = DecoderGrammarRow(node_id=node_pk, catalog_id=catalog_pk, applied_version=0, nacked_version=0)
            session.add(row)
        return row
