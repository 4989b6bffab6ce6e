"""The catalog commands against a real registry, as a user types them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.conftest import EXAMPLE_CATALOG
from tests.support.catalogs import mcp_bytes, tool
from tests.support.registry import RunningRegistry, start_registry
from tooltrie.cli.main import main


@pytest.fixture
def sqlite_registry(tmp_path: Path) -> RunningRegistry:
    running = start_registry(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path)
    yield running  # type: ignore[misc]
    running.server.stop(grace=1)


def run(registry: RunningRegistry, *args: str, token: str | None = "alice") -> Result:
    env = {"TOOLTRIE_REGISTRY": registry.address}
    if token:
        env["TOOLTRIE_TOKEN"] = registry.tokens[token]
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_push_list_show_diff_activate_rollback(sqlite_registry: RunningRegistry, tmp_path: Path) -> None:
    r = sqlite_registry
    pushed = run(r, "catalog", "push", str(EXAMPLE_CATALOG), "--catalog", "workplace")
    assert pushed.exit_code == 0 and "pushed: workplace v1" in pushed.output
    assert (
        "unchanged, existing: workplace v1"
        in run(r, "catalog", "push", str(EXAMPLE_CATALOG), "--catalog", "workplace").output
    )

    smaller = json.loads(EXAMPLE_CATALOG.read_text())
    smaller["tools"] = [*smaller["tools"][1:], tool("extra.tool", "new")]
    second = tmp_path / "v2.json"
    second.write_text(json.dumps(smaller))
    assert "workplace v2" in run(r, "catalog", "push", str(second), "--catalog", "workplace", "--activate").output

    listing = run(r, "catalog", "list").output.splitlines()
    assert listing[1].split() == ["workplace", "2", "2"]

    shown = run(r, "catalog", "show", "workplace", "--version", "1", "--json")
    assert json.loads(shown.output) == {
        "tools": sorted(json.loads(EXAMPLE_CATALOG.read_text())["tools"], key=lambda t: t["name"])
    }

    diff = run(r, "catalog", "diff", "workplace", "1", "2").output.splitlines()
    assert diff == ["+ extra.tool", f"- {json.loads(EXAMPLE_CATALOG.read_text())['tools'][0]['name']}"]

    assert "active: workplace v1" in run(r, "catalog", "activate", "workplace", "1").output
    assert "rolled back: workplace v2" in run(r, "catalog", "rollback", "workplace").output
    assert run(r, "catalog", "audit", "other").output == "no writes recorded for other\n"
    audit = run(r, "catalog", "audit", "workplace").output.splitlines()
    assert [line.split()[4] for line in audit] == ["rollback", "activate", "activate", "push", "push", "push"]


def test_errors_print_field_violations_and_exit_non_zero(sqlite_registry: RunningRegistry, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(mcp_bytes([tool("ok"), tool("not ok")]))
    result = CliRunner().invoke(
        main,
        [
            "catalog",
            "push",
            str(bad),
            "--catalog",
            "cat",
            "--registry",
            sqlite_registry.address,
            "--token",
            sqlite_registry.tokens["alice"],
        ],
    )
    assert result.exit_code == 2
    assert "INVALID_ARGUMENT" in result.output
    assert "tools[1].name: 'not ok'" in result.output

    anonymous = run(sqlite_registry, "catalog", "push", str(EXAMPLE_CATALOG), "--catalog", "cat", token=None)
    assert anonymous.exit_code == 1 and "UNAUTHENTICATED" in anonymous.output

    missing = run(sqlite_registry, "catalog", "show", "nope")
    assert missing.exit_code == 1 and "NOT_FOUND" in missing.output

    stale = run(sqlite_registry, "catalog", "activate", "cat", "1", "--expect-current", "3")
    assert stale.exit_code == 1


def test_unreachable_registry_says_so() -> None:
    result = CliRunner().invoke(main, ["catalog", "list", "--registry", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert "UNAVAILABLE" in result.output and "tooltrie registry serve" in result.output


def test_compile_prints_the_stats(sqlite_registry: RunningRegistry) -> None:
    run(sqlite_registry, "catalog", "push", str(EXAMPLE_CATALOG), "--catalog", "workplace", "--activate")
    result = run(sqlite_registry, "catalog", "compile", "workplace", "--tokenizer", "qwen3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("workplace v1 for qwen3 (") and lines[0].endswith(", token mode")
    assert "nodes" in lines[1] and "root out-degree" in lines[1]
    assert "fits the 64 KiB constant bank" in lines[2]
    status = run(sqlite_registry, "catalog", "status", "workplace")
    assert status.output.splitlines() == ["workplace: active v1", "  no decoder has subscribed to it"]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [("foo", "unknown tokenizer spec 'foo'; accepted: qwen3"), ("gguf:/missing/model.gguf", "no GGUF file at")],
)
def test_compile_with_a_tokenizer_it_cannot_load_is_a_usage_error(
    sqlite_registry: RunningRegistry, spec: str, reason: str
) -> None:
    run(sqlite_registry, "catalog", "push", str(EXAMPLE_CATALOG), "--catalog", "workplace", "--activate")
    result = run(sqlite_registry, "catalog", "compile", "workplace", "--tokenizer", spec)
    assert result.exit_code == 2
    assert f"Error: Invalid value for --tokenizer: {reason}" in result.output
    assert "Traceback" not in result.output
