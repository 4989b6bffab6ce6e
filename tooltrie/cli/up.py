"""`tooltrie up`: the whole product on embedded defaults, in one process.

A registry (SQLite in the data dir), a decoder (the embedded SmolLM2-135M-Instruct; the CUDA engine when a
GPU can serve, else the CPU engine) subscribed to it, the example catalog pushed and activated, and a few
example decodes streamed to the terminal. Then both keep serving until Ctrl-C (or exit with --once).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import click
from tqdm import tqdm

from tooltrie.cli.catalog import describe_version
from tooltrie.cli.common import (
    max_context_option,
    reports_rpc_errors,
    setup_logging,
    setup_or_exit,
    weights_option,
)
from tooltrie.cli.decoder import print_event
from tooltrie.client import RegistryClient, resolve_token
from tooltrie.decoder_client import DecoderClient
from tooltrie.paths import data_dir, default_registry_db_url

EXAMPLE_CATALOG = Path(__file__).resolve().parents[2] / "examples" / "catalogs" / "workplace.json"
EXAMPLE_INTENTS = (
    ("open an issue in acme/web about the login page crashing on Safari", 1),
    ("find a time next week when Ana and Raj are free and book a 30 minute meeting", 2),
    ("post the release notes in the #releases channel and email them to the customers", 2),
)


@click.command()
@click.option("--registry-listen", default="127.0.0.1:50151", show_default=True, help="Registry HOST:PORT.")
@click.option("--decoder-listen", default="127.0.0.1:50152", show_default=True, help="Decoder HOST:PORT.")
@click.option("--model", default=None, help="GGUF file or HF directory; default: the embedded SmolLM2-135M.")
@click.option("--engine", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@weights_option
@max_context_option
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
def up(
    registry_listen: str,
    decoder_listen: str,
    model: str | None,
    engine: str,
    weight_format: str,
    max_context: int | None,
    catalog_file: Path,
    catalog_name: str,
    once: bool,
) -> None:
    """Run registry + decoder, push the example catalog and decode a few example intents."""
    from decoder_service.model_runtime import LOAD_STAGES, load_runtime
    from decoder_service.server import DecoderConfig, DecoderServer
    from registry_service.server import RegistryConfig, RegistryServer

    setup_logging()
    registry = setup_or_exit(
        lambda: RegistryServer(RegistryConfig(db_url=default_registry_db_url(), listen=registry_listen))
    )
    registry.start()
    registry_address = f"{registry_listen.rsplit(':', 1)[0]}:{registry.port}"
    click.echo(f"registry listening on {registry_address} (data in {data_dir()})")
    servers: list[RegistryServer | DecoderServer] = [registry]
    try:
        with tqdm(total=len(LOAD_STAGES), desc="loading model", unit="stage") as bar:
            runtime = setup_or_exit(
                lambda: load_runtime(
                    model,
                    engine=engine,
                    weight_format=weight_format,
                    max_context=max_context,
                    progress=lambda stage: (
                        bar.set_postfix_str(stage),
                        bar.update(0 if stage == LOAD_STAGES[0] else 1),
                    ),
                )
            )
            bar.update(bar.total - bar.n)
        decoder_config = DecoderConfig(
            registry=registry_address, registry_token=resolve_token(None), listen=decoder_listen
        )
        decoder = setup_or_exit(lambda: DecoderServer(decoder_config, runtime))
        setup_or_exit(decoder.start)
        servers.append(decoder)
        decoder_address = f"{decoder_listen.rsplit(':', 1)[0]}:{decoder.port}"
        click.echo(
            f"decoder listening on {decoder_address} (engine {runtime.engine.name}, model {runtime.path.name}, "
            f"context {runtime.engine.context} positions)"
        )

        with RegistryClient(registry_address) as client:
            client.channel_ready(timeout=60)
            # The push compiles for every registered tokenizer: let the decoder register its own first.
            wait_until(
                lambda: registry.servicer.grammars.known(runtime.tokenizer.fingerprint), "the decoder's tokenizer"
            )
            with tqdm(total=1, desc="compiling catalog", unit="catalog") as bar:
                pushed = client.push(catalog_name, catalog_file.read_bytes(), activate=True)
                bar.update(1)
        verb = "pushed" if pushed.created else "already there"
        click.echo(f"{verb}: {describe_version(pushed.version)}")
        for result in pushed.compiled:
            st = result.stats
            outcome = (
                f"{st.nodes} trie nodes, {st.bytes} bytes, {st.compile_seconds * 1000:.1f} ms"
                if result.ok
                else f"FAILED: {result.error}"
            )
            click.echo(f"  compiled for {result.tokenizer_name}: {outcome}")
        version = pushed.version.number
        wait_until(lambda: decoder.store.active().get(catalog_name) == version, f"{catalog_name} v{version} loaded")

        with DecoderClient(decoder_address) as client:
            for intent, k in EXAMPLE_INTENTS:
                click.echo(f"\n> {intent}  (k={k})")
                started = time.perf_counter()
                for event in client.decode(catalog_name, intent, k):
                    print_event(event, as_json=False)
                click.echo(f"   answered in {time.perf_counter() - started:.2f} s")
        if not once:
            click.echo(
                f'\nserving; try: tooltrie decode "send the report to finance" --catalog {catalog_name} -k 2 '
                f"--decoder {decoder_address}\nCtrl-C to stop"
            )
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            stop.wait()
    finally:
        for server in reversed(servers):
            server.stop(grace=5)


class StageBar:
    """A progress bar over named stages: each begin() completes the stage before it."""

    def __init__(self, description: str, stages: tuple[str, ...]) -> None:
        self._bar = tqdm(total=len(stages), desc=description, unit="stage")
        self._started = False

    def begin(self, stage: str) -> None:
        if self._started:
            self._bar.update(1)
        self._started = True
        self._bar.set_postfix_str(stage)

    def __enter__(self) -> StageBar:
        return self

    def __exit__(self, *_: object) -> None:
        self._bar.update(self._bar.total - self._bar.n)
        self._bar.close()


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out after {seconds:.0f}s waiting for {what}")
        time.sleep(0.02)
