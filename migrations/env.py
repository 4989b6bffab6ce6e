"""Alembic environment: runs on the connection the registry hands over, or on the URL given to alembic -x db=URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from registry_service.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_on(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run_on(connection)
else:
    from registry_service.db.database import normalise_url

    url = context.get_x_argument(as_dictionary=True).get("db") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the database as: alembic -x db=URL ...")
    with create_engine(normalise_url(url)).begin() as own_connection:
        run_on(own_connection)
