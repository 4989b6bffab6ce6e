"""Fixtures shared by every test: databases (SQLite and a private PostgreSQL) and running registries."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer, find_pg_bin
from tests.support.registry import RunningRegistry, start_registry

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_CATALOG = REPO / "examples" / "catalogs" / "workplace.json"
# CI sets this so that a missing PostgreSQL fails the run instead of skipping half the suite.
REQUIRE_POSTGRES = os.environ.get("TOOLTRIE_REQUIRE_POSTGRES") == "1"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own data dir, so no test reads a developer's admin token or database."""
    monkeypatch.setenv("TOOLTRIE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TOOLTRIE_TOKEN", raising=False)
    monkeypatch.delenv("TOOLTRIE_REGISTRY_TOKENS", raising=False)
    monkeypatch.delenv("TOOLTRIE_REGISTRY", raising=False)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    bin_dir = find_pg_bin()
    if bin_dir is None:
        message = "PostgreSQL binaries (initdb, pg_ctl) not found; set TOOLTRIE_PG_BIN"
        if REQUIRE_POSTGRES:
            pytest.fail(message)
        pytest.skip(message)
    server = PostgresServer(bin_dir)
    yield server
    server.destroy()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def registry(db_url: str, tmp_path: Path) -> Iterator[RunningRegistry]:
    running = start_registry(db_url, tmp_path)
    yield running
    running.server.stop(grace=1)


@pytest.fixture(scope="session")
def example_catalog_bytes() -> bytes:
    return EXAMPLE_CATALOG.read_bytes()
