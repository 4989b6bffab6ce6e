"""`tooltrie up`: the whole product on embedded defaults, in one process."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from tooltrie.cli.catalog import describe_version
from tooltrie.cli.common import reports_rpc_errors, setup_logging
from tooltrie.client import RegistryClient
from tooltrie.paths import data_dir, default_registry_db_url

EXAMPLE_CATALOG = Path(__file__).resolve().parents[2] / "examples" / "catalogs" / "workplace.json"


@click.command()
@click.option("--registry-listen", default="127.0.0.1:50151", show_default=True, help="Registry HOST:PORT.")
@click.option(
    "--catalog-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=EXAMPLE_CATALOG,
    show_default=True,
    help="MCP tools/list JSON to push.",
)
@click.option("--catalog", "catalog_name", default="workplace", show_default=True)
@click.option("--once", is_flag=True, help="Exit after the examples instead of serving until interrupted.")
@reports_rpc_errors
def up(registry_listen: str, catalog_file: Path, catalog_name: str, once: bool) -> None:
    """Start the registry (SQLite in the data dir), push and activate the example catalog, and show it."""
    from registry_service.server import RegistryConfig, RegistryServer

    setup_logging()
    server = RegistryServer(RegistryConfig(db_url=default_registry_db_url(), listen=registry_listen))
    server.start()
    address = f"{registry_listen.rsplit(':', 1)[0]}:{server.port}"
    click.echo(f"registry listening on {address} (data in {data_dir()})")
    try:
        with RegistryClient(address) as client:
            client.channel_ready(timeout=30)
            pushed = client.push(catalog_name, catalog_file.read_bytes(), activate=True)
            verb = "pushed" if pushed.created else "already there"
            click.echo(f"{verb}: {describe_version(pushed.version)}")
            click.echo("catalogs:")
            for entry in client.catalogs():
                click.echo(f"  {entry.name}: active v{entry.active_version}, latest v{entry.latest_version}")
            tools = client.get(catalog_name, names_only=True).tools
            click.echo(f"{catalog_name} v{pushed.version.number}: {', '.join(t.name for t in tools)}")
        if not once:
            click.echo("serving; Ctrl-C to stop")
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            stop.wait()
    finally:
        server.stop(grace=5)
