"""Decoding in-process, without a registry or a server: ``decode_local(intent, catalog_file, k)``."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path

from decoder_service.engines.base import DecodeRequest, Event
from decoder_service.engines.catalog import PreparedCatalog, read_catalog_file
from decoder_service.model_runtime import ModelRuntime, load_runtime


@cache
def local_runtime(
    model_path: str | None = None, head: str = "sparse", prompt_budget: int | None = None
) -> ModelRuntime:
    """The model at ``model_path`` (None: the embedded SmolLM2-135M-Instruct) on the CPU engine; loaded once."""
    return load_runtime(model_path, engine="cpu", head=head, prompt_budget=prompt_budget)


# (catalog file digest, runtime) -> the catalog prepared for that model: an edited file is prepared anew.
_prepared: dict[tuple[str, int], PreparedCatalog] = {}


def decode_local(
    intent: str,
    catalog_file: str | Path,
    k: int,
    model_path: str | Path | None = None,
    *,
    head: str = "sparse",
    prompt_budget: int | None = None,
) -> Iterator[Event]:
    """Yield each pointer of the answer as it completes, then a summary (see ``engines.base``)."""
    runtime = local_runtime(None if model_path is None else str(model_path), head, prompt_budget)
    tools, digest = read_catalog_file(catalog_file)
    key = (digest, id(runtime))
    if key not in _prepared:
        _prepared[key] = runtime.prepare_local(f"file:{digest}", tools)
    yield from runtime.engine.decode(DecodeRequest(intent=intent, k=k, catalog=_prepared[key]))
