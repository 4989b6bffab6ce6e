"""Concurrent pushers to one catalog: strictly increasing versions, none lost, none duplicated."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.support.catalogs import mcp_bytes, tool
from tests.support.registry import RunningRegistry

PUSHERS = 8
PUSHES_EACH = 6


def test_concurrent_pushers_get_strictly_increasing_versions(registry: RunningRegistry) -> None:
    def pusher(worker: int) -> list[tuple[int, str]]:
        seen = []
        with registry.client() as client:
            for push in range(PUSHES_EACH):
                content = mcp_bytes([tool("shared"), tool(f"w{worker}.p{push}")])
                response = client.push("cat", content)
                assert response.created
                seen.append((response.version.number, response.version.content_sha256))
        return seen

    with ThreadPoolExecutor(PUSHERS) as pool:
        results = list(pool.map(pusher, range(PUSHERS)))

    numbers = [n for seen in results for n, _ in seen]
    assert sorted(numbers) == list(range(1, PUSHERS * PUSHES_EACH + 1))  # none lost, none reused
    for seen in results:  # each pusher saw its own versions in increasing order
        assert [n for n, _ in seen] == sorted(n for n, _ in seen)
    with registry.client() as client:
        stored = {v.number: v for v in client.versions("cat")}
        assert len(stored) == PUSHERS * PUSHES_EACH
        assert {v.number: v.content_sha256 for v in stored.values()} == dict(sha for s in results for sha in s)
        for number, version in stored.items():
            assert version.parent == number - 1
            assert len(client.get("cat", number, names_only=True).tools) == 2


def test_concurrent_identical_pushes_make_one_version(registry: RunningRegistry) -> None:
    content = mcp_bytes([tool("a"), tool("b")])

    def push(_: int) -> tuple[int, bool]:
        with registry.client() as client:
            response = client.push("same", content)
            return response.version.number, response.created

    with ThreadPoolExecutor(PUSHERS) as pool:
        results = list(pool.map(push, range(PUSHERS)))
    assert {number for number, _ in results} == {1}
    assert sum(created for _, created in results) == 1
