"""Engine, sessions and schema checks for SQLite (default) and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from registry_service.db import migrate

# Execution option that makes a SQLite transaction take the write lock at BEGIN, so two writers
# serialise instead of deadlocking when both try to upgrade a read lock.
_WRITE = "tooltrie_write"


def normalise_url(url: str) -> str:
    """Accepts plain postgresql:// URLs and routes them to psycopg 3, the driver we ship."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


class Database:
    def __init__(self, url: str) -> None:
        self.url = normalise_url(url)
        self.is_sqlite = make_url(self.url).get_backend_name() == "sqlite"
        self.engine = self._create_engine()

    def _create_engine(self) -> Engine:
        if not self.is_sqlite:
            # pre_ping replaces connections a PostgreSQL restart killed, so the next request succeeds.
            return create_engine(self.url, pool_pre_ping=True, pool_size=8, max_overflow=8)
        database = make_url(self.url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(self.url, connect_args={"timeout": 60})
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def write_session(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back on any exception."""
        with self.engine.connect() as connection:
            connection.execution_options(**{_WRITE: True})
            with Session(bind=connection, expire_on_commit=False) as session, session.begin():
                yield session

    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def schema_is_current(self) -> bool:
        with self.engine.connect() as connection:
            return migrate.current_revision(connection) == migrate.head_revision()

    def migrate(self) -> None:
        with self.engine.begin() as connection:
            migrate.upgrade(connection)

    def dispose(self) -> None:
        self.engine.dispose()


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control from pysqlite so BEGIN is ours (SQLAlchemy's documented recipe).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_on_begin(connection: Any) -> None:
    mode = "IMMEDIATE" if connection.get_execution_options().get(_WRITE) else "DEFERRED"
    connection.exec_driver_sql(f"BEGIN {mode}")
