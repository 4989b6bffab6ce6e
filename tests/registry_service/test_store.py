"""The store's transactions, below gRPC: a failure at the last moment leaves nothing behind."""

from __future__ import annotations

import pytest

from registry_service.canonical import ToolSpec, content_sha256
from registry_service.db.database import Database
from registry_service.errors import DeadlineExceeded, NotFound
from registry_service.store import CatalogStore


@pytest.fixture
def store(db_url: str) -> CatalogStore:
    database = Database(db_url)
    database.migrate()
    yield CatalogStore(database)  # type: ignore[misc]
    database.dispose()


def test_failure_before_commit_writes_nothing(store: CatalogStore) -> None:
    tools = [ToolSpec(name=f"t{i}", description="d") for i in range(100)]

    def deadline_passed() -> None:
        raise DeadlineExceeded("too late")

    with pytest.raises(DeadlineExceeded):
        store.push("cat", tools, "alice", activate=True, before_commit=deadline_passed)
    assert store.list_catalogs("", 10) == []
    assert store.list_audit("", 0, 10) == []
    first = store.push("cat", tools, "alice")
    assert first.created and first.version.number == 1


def test_content_hash_ignores_order() -> None:
    a = ToolSpec(name="a", description="x", input_schema={"b": 1, "a": 2})
    b = ToolSpec(name="b", extra={"title": "B"})
    same_a = ToolSpec(name="a", description="x", input_schema={"a": 2, "b": 1})
    assert content_sha256([a, b]) == content_sha256([b, same_a])
    assert content_sha256([a, b]) != content_sha256([a, ToolSpec(name="b", extra={"title": "C"})])
    assert content_sha256([a]) != content_sha256([ToolSpec(name="a", description="x")])


def test_unknown_catalog(store: CatalogStore) -> None:
    with pytest.raises(NotFound, match="no catalog named 'ghost'"):
        store.activate("ghost", 1, "alice")
