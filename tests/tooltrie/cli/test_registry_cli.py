"""`tooltrie registry migrate`, as an operator runs it before starting registries with --no-migrate."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tests.support.registry import start_registry
from tests.tooltrie.cli.test_up import free_port
from tooltrie.cli.main import main


def test_migrate_brings_a_new_database_to_the_latest_schema_and_again_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    for _ in range(2):
        result = CliRunner().invoke(main, ["registry", "migrate", "--db", url])
        assert result.exit_code == 0, result.output
        assert result.output == f"schema at the latest migration: {url}\n"
    assert (tmp_path / "registry.db").stat().st_size > 0


def test_migrate_against_an_unreachable_server_says_so_in_one_line() -> None:
    """No server listens on the port: exit 1, one line naming the database (password hidden) and the reason."""
    url = f"postgresql://tooltrie:secret@127.0.0.1:{free_port()}/registry"
    result = CliRunner().invoke(main, ["registry", "migrate", "--db", url])
    assert result.exit_code == 1
    [line] = result.output.splitlines()
    assert line.startswith("Error: cannot migrate postgresql+psycopg://tooltrie:***@127.0.0.1:")
    assert "Connection refused" in line and "secret" not in line


def test_serve_on_a_port_in_use_says_so_instead_of_sharing_it(tmp_path: Path) -> None:
    """A second registry on the first one's port exits 1 with the address, where it would otherwise have taken a
    share of the first one's calls with a database of its own."""
    first = start_registry(f"sqlite:///{tmp_path / 'first.db'}", tmp_path)
    try:
        result = CliRunner().invoke(
            main, ["registry", "serve", "--listen", first.address, "--db", f"sqlite:///{tmp_path / 'second.db'}"]
        )
        assert result.exit_code == 1
        assert f"Error: cannot listen on {first.address}: it is in use" in result.output
    finally:
        first.server.stop(grace=1)
