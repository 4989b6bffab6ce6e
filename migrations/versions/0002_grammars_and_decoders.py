"""tokenizers, compiled grammars, decoder nodes

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "decoder_nodes",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(length=256), nullable=False),
        sa.Column("tokenizer_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("connected", sa.Boolean(), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node_id"),
    )
    op.create_table(
        "tokenizers",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint"),
    )
    op.create_table(
        "decoder_grammars",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("node_id", ID, nullable=False),
        sa.Column("catalog_id", ID, nullable=False),
        sa.Column("applied_version", sa.Integer(), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("nacked_version", sa.Integer(), nullable=False),
        sa.Column("nack_error", sa.Text(), nullable=False),
        sa.Column("nacked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["catalog_id"], ["catalogs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["node_id"], ["decoder_nodes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node_id", "catalog_id", name="uq_decoder_grammars_key"),
    )
    op.create_table(
        "compiled_grammars",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("version_id", ID, nullable=False),
        sa.Column("tokenizer_id", ID, nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("stats", sa.Text(), nullable=False),
        sa.Column("trie", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tokenizer_id"], ["tokenizers.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["version_id"], ["catalog_versions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("version_id", "tokenizer_id", "mode", name="uq_compiled_grammars_key"),
    )


def downgrade() -> None:
    op.drop_table("compiled_grammars")
    op.drop_table("decoder_grammars")
    op.drop_table("tokenizers")
    op.drop_table("decoder_nodes")
