"""The registry's schema (SQLAlchemy 2.0 typed ORM). Alembic owns its evolution: see migrations/.

Compiled grammars hang off catalog_versions.id and tokenizers.id; decoder nodes record what they run.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY, PostgreSQL wants 64 bits for tool rows.
Id = BigInteger().with_variant(Integer(), "sqlite")
NAME_LENGTH = 128


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on the way in and out, also on SQLite, which stores no zone."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class CatalogRow(Base):
    __tablename__ = "catalogs"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Version numbers come from this counter, bumped under the catalog's row lock: strictly increasing, never reused.
    latest_number: Mapped[int] = mapped_column(Integer, default=0)
    # 0 when no version is active.
    active_number: Mapped[int] = mapped_column(Integer, default=0)
    # Top of the activation stack that Rollback pops; null when nothing was ever activated.
    current_activation_id: Mapped[int | None] = mapped_column(Id, nullable=True)


class VersionRow(Base):
    __tablename__ = "catalog_versions"
    __table_args__ = (
        UniqueConstraint("catalog_id", "number", name="uq_catalog_versions_number"),
        Index("ix_catalog_versions_sha", "catalog_id", "content_sha256"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    catalog_id: Mapped[int] = mapped_column(ForeignKey("catalogs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    content_sha256: Mapped[str] = mapped_column(String(64))
    author: Mapped[str] = mapped_column(String(NAME_LENGTH))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    parent_number: Mapped[int] = mapped_column(Integer, default=0)
    # "staged" (never active), "active", "retired" (was active).
    state: Mapped[str] = mapped_column(String(16))
    tool_count: Mapped[int] = mapped_column(Integer)


class ToolRow(Base):
    __tablename__ = "tools"
    __table_args__ = (UniqueConstraint("version_id", "name", name="uq_tools_version_name"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("catalog_versions.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Canonical JSON; null when the tool carried no inputSchema.
    input_schema: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Canonical JSON object of every other MCP field.
    extra: Mapped[str] = mapped_column(Text, default="{}")


class ActivationRow(Base):
    __tablename__ = "activations"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    catalog_id: Mapped[int] = mapped_column(ForeignKey("catalogs.id", ondelete="CASCADE"), index=True)
    version_number: Mapped[int] = mapped_column(Integer)
    # The activation this one replaced on the stack; Rollback returns to it.
    previous_id: Mapped[int | None] = mapped_column(ForeignKey("activations.id"), nullable=True)
    kind: Mapped[str] = mapped_column(String(16))  # "activate" or "rollback"
    actor: Mapped[str] = mapped_column(String(NAME_LENGTH))
    at: Mapped[datetime] = mapped_column(UTCDateTime())


class AuditRow(Base):
    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_catalog", "catalog_name", "id"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(String(NAME_LENGTH))
    action: Mapped[str] = mapped_column(String(32))
    catalog_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version_number: Mapped[int] = mapped_column(Integer, default=0)
    detail: Mapped[str] = mapped_column(Text, default="{}")


class TokenizerRow(Base):
    """A tokenizer some decoder runs; every catalog version is compiled for each one."""

    __tablename__ = "tokenizers"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(32))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class CompiledGrammarRow(Base):
    """One catalog version compiled for one tokenizer in one mode: the trie blob, or why it failed."""

    __tablename__ = "compiled_grammars"
    __table_args__ = (UniqueConstraint("version_id", "tokenizer_id", "mode", name="uq_compiled_grammars_key"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("catalog_versions.id", ondelete="CASCADE"))
    tokenizer_id: Mapped[int] = mapped_column(ForeignKey("tokenizers.id", ondelete="CASCADE"))
    mode: Mapped[str] = mapped_column(String(16))  # "token" or "char"
    ok: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str] = mapped_column(Text, default="")
    # JSON object: nodes, edges, max_out_degree, depth, bytes, root_out_degree, fits_constant_bank, compile_seconds.
    stats: Mapped[str] = mapped_column(Text, default="{}")
    trie: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class DecoderNodeRow(Base):
    __tablename__ = "decoder_nodes"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(String(256), unique=True)
    tokenizer_fingerprint: Mapped[str] = mapped_column(String(64))
    connected: Mapped[bool] = mapped_column(Boolean, default=False)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime())


class DecoderGrammarRow(Base):
    """What one decoder runs for one catalog: its last ACK and its last NACK."""

    __tablename__ = "decoder_grammars"
    __table_args__ = (UniqueConstraint("node_id", "catalog_id", name="uq_decoder_grammars_key"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("decoder_nodes.id", ondelete="CASCADE"))
    catalog_id: Mapped[int] = mapped_column(ForeignKey("catalogs.id", ondelete="CASCADE"))
    applied_version: Mapped[int] = mapped_column(Integer, default=0)
    applied_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    nacked_version: Mapped[int] = mapped_column(Integer, default=0)
    nack_error: Mapped[str] = mapped_column(Text, default="")
    nacked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
