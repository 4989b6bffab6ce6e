"""initial schema: catalogs, versions, tools, activations, audit log

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("catalog_name", sa.String(length=128), nullable=False),
        sa.Column("version_number", sa.Integer(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index("ix_audit_events_catalog", ["catalog_name", "id"], unique=False)

    op.create_table(
        "catalogs",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latest_number", sa.Integer(), nullable=False),
        sa.Column("active_number", sa.Integer(), nullable=False),
        sa.Column("current_activation_id", ID, nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "activations",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("catalog_id", ID, nullable=False),
        sa.Column("version_number", sa.Integer(), nullable=False),
        sa.Column("previous_id", ID, nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["catalog_id"], ["catalogs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["previous_id"],
            ["activations.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("activations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_activations_catalog_id"), ["catalog_id"], unique=False)

    op.create_table(
        "catalog_versions",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("catalog_id", ID, nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("content_sha256", sa.String(length=64), nullable=False),
        sa.Column("author", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("parent_number", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("tool_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["catalog_id"], ["catalogs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("catalog_id", "number", name="uq_catalog_versions_number"),
    )
    with op.batch_alter_table("catalog_versions", schema=None) as batch_op:
        batch_op.create_index("ix_catalog_versions_sha", ["catalog_id", "content_sha256"], unique=False)

    op.create_table(
        "tools",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("version_id", ID, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("input_schema", sa.Text(), nullable=True),
        sa.Column("extra", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["catalog_versions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("version_id", "name", name="uq_tools_version_name"),
    )


def downgrade() -> None:
    op.drop_table("tools")
    with op.batch_alter_table("catalog_versions", schema=None) as batch_op:
        batch_op.drop_index("ix_catalog_versions_sha")

    op.drop_table("catalog_versions")
    with op.batch_alter_table("activations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_activations_catalog_id"))

    op.drop_table("activations")
    op.drop_table("catalogs")
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_events_catalog")

    op.drop_table("audit_events")
