"""`tooltrie registry serve|migrate`."""

from __future__ import annotations

from pathlib import Path

import click
from sqlalchemy.engine import make_url

from tooltrie.cli.common import serve_until_signal, setup_logging, setup_or_exit
from tooltrie.grpc_limits import DEFAULT_REGISTRY_ADDRESS
from tooltrie.paths import default_registry_db_url


@click.group()
def registry() -> None:
    """Run and maintain the catalog registry."""


@registry.command()
@click.option("--db", "db_url", envvar="TOOLTRIE_REGISTRY_DB", default=None, help="Database URL; default SQLite.")
@click.option("--listen", default=DEFAULT_REGISTRY_ADDRESS, show_default=True, help="HOST:PORT; port 0 picks one.")
@click.option("--tokens-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--no-migrate", is_flag=True, help="Wait for `tooltrie registry migrate` instead of migrating on start.")
@click.option("--max-tools", type=int, default=100_000, show_default=True, help="Most tools in one catalog version.")
@click.option("--grace", type=float, default=10.0, show_default=True, help="Seconds running calls get on SIGTERM.")
def serve(
    db_url: str | None,
    listen: str,
    tokens_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    no_migrate: bool,
    max_tools: int,
    grace: float,
) -> None:
    """Serve the registry until SIGTERM or Ctrl-C (SQLite in the data dir unless --db is given)."""
    from registry_service.server import RegistryConfig, RegistryServer
    from registry_service.validation import CatalogLimits

    setup_logging()
    config = RegistryConfig(
        db_url=db_url or default_registry_db_url(),
        listen=listen,
        tokens_file=tokens_file,
        tls_cert=tls_cert,
        tls_key=tls_key,
        migrate=not no_migrate,
        limits=CatalogLimits(max_tools=max_tools),
    )
    server = setup_or_exit(lambda: RegistryServer(config))
    server.start()
    host = listen.rsplit(":", 1)[0]
    shown_db = make_url(server.database.url).render_as_string(hide_password=True)
    # Scripts and tests read this line to find the port when --listen ends in :0.
    print(f"registry listening on {host}:{server.port} (db {shown_db})", flush=True)

    serve_until_signal(server, grace)


@registry.command()
@click.option("--db", "db_url", envvar="TOOLTRIE_REGISTRY_DB", default=None, help="Database URL; default SQLite.")
def migrate(db_url: str | None) -> None:
    """Bring the database schema to the latest migration."""
    from sqlalchemy.exc import OperationalError

    from registry_service.db.database import Database

    database = Database(db_url or default_registry_db_url())
    shown_db = make_url(database.url).render_as_string(hide_password=True)
    try:
        database.migrate()
    except OperationalError as exc:  # unreachable server, refused login: one line, not a traceback
        raise click.ClickException(f"cannot migrate {shown_db}: {str(exc.orig).strip().splitlines()[0]}") from exc
    click.echo(f"schema at the latest migration: {shown_db}")
