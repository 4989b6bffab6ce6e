"""``tooltrie decode-local``: decode an intent against a catalog file on the CPU engine, printing each pointer."""

from __future__ import annotations

import json
from pathlib import Path

import click

from decoder_service.engines.base import HEADS, PointerEvent, SummaryEvent
from decoder_service.engines.local import decode_local as run_decode_local
from tooltrie.grammar.trie import K_MAX


@click.command("decode-local")
@click.argument("intent")
@click.option(
    "--catalog",
    "catalog_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="An MCP tools/list JSON file.",
)
@click.option("-k", "k", type=click.IntRange(1, K_MAX), default=3, show_default=True, help="Tools to name.")
@click.option(
    "--model",
    "model_path",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A .gguf file or a Hugging Face directory (default: the embedded SmolLM2-135M-Instruct).",
)
@click.option("--head", type=click.Choice(HEADS), default="sparse", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line per pointer, then a summary line.")
def decode_local(intent: str, catalog_file: Path, k: int, model_path: Path | None, head: str, as_json: bool) -> None:
    """Name K tools of CATALOG for INTENT, each printed the moment its last token is decoded."""
    try:
        for event in run_decode_local(intent, catalog_file, k, model_path, head=head):
            click.echo(_json(event) if as_json else _text(event))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


def _text(event: PointerEvent | SummaryEvent) -> str:
    if isinstance(event, PointerEvent):
        per_token = 1000 * event.seconds / max(event.steps, 1)
        return f"{event.index + 1}. {event.name}  (score {event.score:.3f}, {per_token:.1f} ms/token)"
    cached = "cached prefix" if event.prefix_cached else "prefix prefilled"
    return (
        f"-- {event.tokens_generated} tokens "
        f"({event.forward_passes} forward pass{'' if event.forward_passes == 1 else 'es'}); "
        f"prefill {event.prefill_seconds * 1000:.0f} ms of {event.prompt_tokens} prompt tokens ({cached}); "
        f"decode {event.decode_seconds * 1000:.0f} ms"
    )


def _json(event: PointerEvent | SummaryEvent) -> str:
    if isinstance(event, PointerEvent):
        return json.dumps(
            {
                "index": event.index,
                "tool": event.name,
                "pointer_id": event.pointer_id,
                "token_ids": list(event.token_ids),
                "score": event.score,
                "seconds": event.seconds,
                "ms_per_token": 1000 * event.seconds / max(event.steps, 1),
            }
        )
    return json.dumps(
        {
            "summary": {
                "tokens_generated": event.tokens_generated,
                "forward_passes": event.forward_passes,
                "prompt_tokens": event.prompt_tokens,
                "prefix_cached": event.prefix_cached,
                "prefill_seconds": event.prefill_seconds,
                "decode_seconds": event.decode_seconds,
                "catalog_version": event.catalog_version,
            }
        }
    )
