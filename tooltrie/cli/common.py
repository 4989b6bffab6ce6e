"""Options and error reporting shared by the CLI's commands."""

from __future__ import annotations

import functools
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Protocol, TypeVar

import click
import grpc

from tooltrie.client import RegistryClient, error_details

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


# --weights of the commands that load a model (decoder serve, up): the weight format the engines compute with.
weights_option = click.option(
    "--weights",
    "weight_format",
    type=click.Choice(["bf16", "fp8"]),
    envvar="TOOLTRIE_WEIGHTS",
    default="bf16",
    show_default=True,
    help="fp8: layer projections rounded to e4m3 rows with power-of-two scales at load [env TOOLTRIE_WEIGHTS].",
)

# --max-context of the same commands: the positions a request may fill.
max_context_option = click.option(
    "--max-context",
    type=click.IntRange(min=1),
    envvar="TOOLTRIE_MAX_CONTEXT",
    default=None,
    help="Positions a request may fill, prompt and answer; a catalog's prompt gets at most half. The CUDA engine "
    "reserves its KV cache for them [env TOOLTRIE_MAX_CONTEXT; default: the model's trained context, at most 16384 "
    "on the CUDA engine].",
)


def registry_options(command: F) -> F:
    """--registry, --token and --tls-ca, turned into a `client` argument."""

    @click.option(
        "--registry",
        envvar="TOOLTRIE_REGISTRY",
        default=None,
        help="Registry address HOST:PORT [env TOOLTRIE_REGISTRY; default 127.0.0.1:50151].",
    )
    @click.option("--token", default=None, help="Bearer token for writes [env TOOLTRIE_TOKEN; default: local admin].")
    @click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
    @functools.wraps(command)
    def wrapper(registry: str | None, token: str | None, tls_ca: Path | None, **kwargs: Any) -> Any:
        with RegistryClient(registry, token=token, tls_ca=tls_ca) as client:
            return command(client=client, **kwargs)

    return wrapper  # type: ignore[return-value]


def _rpc_error_reporter(service: str, start: str) -> Callable[[F], F]:
    """A decorator that prints a failed call's status, message and field violations, and exits non-zero; where no
    connection was made, it says how to start ``service``."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return command(*args, **kwargs)
            except grpc.RpcError as error:
                code = error.code()  # type: ignore[attr-defined]
                details = error.details() or ""  # type: ignore[attr-defined]
                click.echo(f"error: {code.name}: {details}", err=True)
                for violation in error_details(error):
                    click.echo(f"  {violation.field}: {violation.description}", err=True)
                # Not for an UNAVAILABLE the service itself sent (a decoder whose GPU failed): it is running.
                if code == grpc.StatusCode.UNAVAILABLE and _not_connected(details):
                    click.echo(f"  is the {service} running? start one with {start}", err=True)
                raise SystemExit(2 if code == grpc.StatusCode.INVALID_ARGUMENT else 1) from None

        return wrapper  # type: ignore[return-value]

    return decorate


def _not_connected(details: str) -> bool:
    """Whether gRPC's own message says the channel reached no server."""
    lowered = details.lower()
    return any(s in lowered for s in ("failed to connect", "connection refused", "dns resolution failed"))


reports_rpc_errors = _rpc_error_reporter("registry", "`tooltrie registry serve`")
reports_decoder_rpc_errors = _rpc_error_reporter("decoder", "`tooltrie decoder serve` (or `tooltrie up`)")


def setup_or_exit(step: Callable[[], T]) -> T:
    """``step()``, one part of a command's start (loading the model, building or starting a server): what cannot
    serve (a missing model file, a context past the model's, no usable GPU for --engine cuda, too little device
    memory, an address that cannot be listened on, a TLS file that is missing or not PEM) prints one line and exits
    1, not a traceback."""
    try:
        return step()
    except (ValueError, RuntimeError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Alembic narrates every migration step at INFO; the registry logs the outcome itself.
    logging.getLogger("alembic").setLevel(logging.WARNING)


class Stoppable(Protocol):
    def stop(self, grace: float | None = ...) -> None: ...

    def wait(self) -> None: ...


def serve_until_signal(server: Stoppable, grace: float) -> NoReturn:
    """Blocks until SIGTERM or Ctrl-C, then stops `server` with `grace` seconds for running calls, and exits 0."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("tooltrie").info("%s: shutting down, %.0fs grace", signal.Signals(signum).name, grace)
        server.stop(grace)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.wait()
    sys.exit(0)
