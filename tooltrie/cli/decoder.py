"""`tooltrie decoder serve|status` and `tooltrie decode`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tooltrie.cli.common import (
    max_context_option,
    reports_decoder_rpc_errors,
    serve_until_signal,
    setup_logging,
    setup_or_exit,
    weights_option,
)
from tooltrie.client import resolve_token
from tooltrie.decoder_client import DecoderClient
from tooltrie.grpc_limits import DEFAULT_DECODER_ADDRESS, DEFAULT_REGISTRY_ADDRESS


@click.group()
def decoder() -> None:
    """Run and inspect decoders."""


@decoder.command()
@click.option("--registry", envvar="TOOLTRIE_REGISTRY", default=DEFAULT_REGISTRY_ADDRESS, show_default=True)
@click.option("--token", default=None, help="Token for the registry subscription [env TOOLTRIE_TOKEN].")
@click.option("--registry-tls-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--listen", default=DEFAULT_DECODER_ADDRESS, show_default=True, help="HOST:PORT; port 0 picks one.")
@click.option("--model", default=None, help="GGUF file or HF directory; default: the embedded SmolLM2-135M.")
@click.option("--engine", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--head", type=click.Choice(["sparse", "dense"]), default="sparse", show_default=True)
@weights_option
@max_context_option
@click.option(
    "--grammar-mode",
    type=click.Choice(["token", "char"]),
    default="token",
    show_default=True,
    help="char: subscribe to character tries, which accept any tokenization that spells a catalog name.",
)
@click.option("--node-id", default="", help="Identity reported to the registry; default HOST:PORT.")
@click.option("--max-active", type=int, default=1, show_default=True, help="Decodes running at once.")
@click.option("--max-queued", type=int, default=32, show_default=True, help="Decodes waiting; beyond: refused.")
@click.option("--metrics-listen", default=None, help="HOST:PORT for Prometheus /metrics.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--grace", type=float, default=10.0, show_default=True, help="Seconds running decodes get on SIGTERM.")
@click.option(
    "--tokens-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="NAME:TOKEN lines that Decode accepts [env TOOLTRIE_DECODER_TOKENS]; default: Decode is open.",
)
@click.option(
    "--chat-template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A Jinja2 chat template file instead of the model's own.",
)
def serve(
    registry: str,
    token: str | None,
    registry_tls_ca: Path | None,
    listen: str,
    model: str | None,
    engine: str,
    head: str,
    weight_format: str,
    max_context: int | None,
    grammar_mode: str,
    node_id: str,
    max_active: int,
    max_queued: int,
    metrics_listen: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    grace: float,
    tokens_file: Path | None,
    chat_template: Path | None,
) -> None:
    """Serve Decode with the grammars the registry pushes, until SIGTERM or Ctrl-C."""
    from decoder_service.model_runtime import load_runtime
    from decoder_service.server import DecoderConfig, DecoderServer

    setup_logging()
    runtime = setup_or_exit(
        lambda: load_runtime(
            model,
            engine=engine,
            head=head,
            template_file=chat_template,
            weight_format=weight_format,
            max_context=max_context,
        )
    )
    config = DecoderConfig(
        registry=registry,
        registry_token=resolve_token(token),
        registry_tls_ca=registry_tls_ca,
        listen=listen,
        node_id=node_id,
        tls_cert=tls_cert,
        tls_key=tls_key,
        max_active=max_active,
        max_queued=max_queued,
        metrics_listen=metrics_listen,
        tokens_file=tokens_file,
        char_mode=grammar_mode == "char",
    )
    server = setup_or_exit(lambda: DecoderServer(config, runtime))
    setup_or_exit(server.start)
    host = listen.rsplit(":", 1)[0]
    print(f"decoder listening on {host}:{server.port} (node {server.node_id}, registry {registry})", flush=True)

    serve_until_signal(server, grace)


@decoder.command()
@click.option("--decoder", "address", envvar="TOOLTRIE_DECODER", default=None, help="Decoder HOST:PORT.")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@reports_decoder_rpc_errors
def status(address: str | None, tls_ca: Path | None) -> None:
    """Show the decoder's engine, model and the grammars it holds."""
    with DecoderClient(address, tls_ca) as client:
        reply = client.status()
    connected = "connected" if reply.registry_connected else "NOT connected"
    click.echo(
        f"node {reply.node_id}: engine {reply.engine}, model {reply.model}, context {reply.context} positions, "
        f"registry {connected}"
    )
    click.echo(f"tokenizer {reply.tokenizer} ({reply.tokenizer_fingerprint[:16]})")
    if reply.engine_failure:
        click.echo(f"NOT SERVING: {reply.engine_failure}")
    for c in reply.catalogs:
        held = ", ".join(f"v{v}" for v in c.held_versions)
        click.echo(f"  {c.catalog}: active v{c.active_version} (held {held})")
    if not reply.catalogs:
        click.echo("  no grammars loaded yet")


@click.command()
@click.argument("intent")
@click.option("--catalog", required=True, help="A catalog registered with the registry.")
@click.option("-k", "k", type=int, default=1, show_default=True, help="How many distinct tools to name.")
@click.option("--version", type=int, default=0, help="Pin a catalog version the decoder holds.")
@click.option("--decoder", "address", envvar="TOOLTRIE_DECODER", default=None, help="Decoder HOST:PORT.")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per pointer, then a summary line.")
@reports_decoder_rpc_errors
def decode(
    intent: str, catalog: str, k: int, version: int, address: str | None, tls_ca: Path | None, as_json: bool
) -> None:
    """Ask a running decoder for k tools of CATALOG that serve INTENT; prints each as it arrives."""
    with DecoderClient(address, tls_ca) as client:
        for event in client.decode(catalog, intent, k, version):
            print_event(event, as_json)


def print_event(event: object, as_json: bool) -> None:
    kind = event.WhichOneof("event")  # type: ignore[attr-defined]
    if kind == "pointer":
        p = event.pointer  # type: ignore[attr-defined]
        if as_json:
            record = {
                "index": p.index,
                "tool": p.tool,
                "catalog_version": p.catalog_version,
                "score": p.score,
                "token_ids": list(p.token_ids),
                "seconds": p.seconds,
            }
            click.echo(json.dumps(record))
        else:
            click.echo(
                f"{p.index + 1}. {p.tool}  (v{p.catalog_version}, score {p.score:.3f}, {p.seconds * 1000:.0f} ms)"
            )
    elif kind == "summary":
        s = event.summary  # type: ignore[attr-defined]
        per_token = s.decode_seconds / max(s.tokens_generated, 1) * 1000
        if as_json:
            record = {
                "summary": True,
                "tokens_generated": s.tokens_generated,
                "forward_passes": s.forward_passes,
                "prefill_seconds": s.prefill_seconds,
                "decode_seconds": s.decode_seconds,
                "catalog_version": s.catalog_version,
                "engine": s.engine,
            }
            click.echo(json.dumps(record))
        else:
            click.echo(
                f"   {s.tokens_generated} tokens "
                f"({s.forward_passes} forward pass{'' if s.forward_passes == 1 else 'es'}), {per_token:.1f} ms/token, "
                f"prefill {s.prefill_seconds * 1000:.0f} ms"
                f"{' (prefix cached)' if s.prefix_cached else ''}, engine {s.engine}, catalog v{s.catalog_version}"
            )
