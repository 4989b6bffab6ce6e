"""Loads the model a decoder serves and picks its engine (CUDA when usable, else the CPU reference engine)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decoder_service.engines.base import Engine
from decoder_service.engines.catalog import PreparedCatalog, Tool
from decoder_service.engines.factory import make_engine
from decoder_service.engines.prompt import prepare_catalog
from decoder_service.models.config import ModelConfig
from decoder_service.models.fp8 import WEIGHT_FORMATS, quantize_weights
from decoder_service.models.loader import load_model, resolve_model_path
from decoder_service.models.tokenizer_source import chat_template, model_tokenizer
from decoder_service.models.weights import Weights
from tooltrie.grammar import CompiledTrie, TokenizationCache, Tokenizer

log = logging.getLogger(__name__)

ENGINES = ("auto", "cpu", "cuda")
LOAD_STAGES = ("weights", "tokenizer", "engine")


@dataclass(slots=True, eq=False)
class ModelRuntime:
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    template: str
    engine: Engine
    prompt_budget: int | None = None

    def prepare(self, catalog: str, version: int, tools: Sequence[Tool], trie_blob: bytes) -> PreparedCatalog:
        """A registry-compiled trie, checked against this model's tokenizer, with the catalog's prompt prefix."""
        trie = CompiledTrie.from_bytes(trie_blob, expected_fingerprint=self.tokenizer.fingerprint)
        if sorted(trie.names) != sorted(t.name for t in tools):
            raise ValueError(f"{catalog} v{version}: the trie's names differ from the catalog's tools")
        return self._prepare(catalog, version, tools, trie=trie)

    def prepare_local(
        self, catalog: str, tools: Sequence[Tool], cache: TokenizationCache | None = None
    ) -> PreparedCatalog:
        """Compiles the names here, for decoding without a registry."""
        return self._prepare(catalog, 0, tools, cache=cache)

    def _prepare(self, catalog: str, version: int, tools: Sequence[Tool], **compiled: Any) -> PreparedCatalog:
        return prepare_catalog(
            tools,
            self.tokenizer,
            self.template,
            context_length=self.config.max_position_embeddings,
            serving_context=self.engine.context,
            catalog_id=catalog,
            version=version,
            prompt_budget=self.prompt_budget,
            **compiled,
        )


def load_runtime(
    model: str | Path | None = None,
    engine: str = "auto",
    head: str = "sparse",
    prompt_budget: int | None = None,
    progress: Callable[[str], None] = lambda stage: None,
    template_file: Path | None = None,
    weight_format: str = "bf16",
    max_context: int | None = None,
) -> ModelRuntime:
    """The model at `model` (None: the embedded SmolLM2-135M-Instruct) on the chosen engine.

    `progress` is called as each of LOAD_STAGES begins, for a progress bar. `template_file`: a Jinja2 chat
    template to use instead of the model's own. `weight_format` 'fp8': the layer projections rounded to e4m3 rows
    with power-of-two scales at load (decoder_service/models/fp8.py), a model every engine then computes with; the
    CUDA engine reads them as e4m3 bytes. `max_context`: the positions a request may fill (prompt and answer; the
    CUDA engine reserves its KV cache for them); None: the model's trained context, capped at
    `decoder_service.engines.factory.CUDA_MAX_CONTEXT` on the CUDA engine. A catalog's prompt gets at most half of it.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; accepted: {', '.join(ENGINES)}")
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weight_format!r}; accepted: {', '.join(WEIGHT_FORMATS)}")
    path = resolve_model_path(model)
    started = time.perf_counter()
    progress(LOAD_STAGES[0])
    config, weights = load_model(path)
    if weight_format == "fp8":
        weights = quantize_weights(config, weights)
    progress(LOAD_STAGES[1])
    tokenizer = model_tokenizer(path)
    progress(LOAD_STAGES[2])
    log.info(
        "loaded %s (%s, %d layers, %s weights) in %.1fs",
        path.name,
        config.architecture,
        config.num_layers,
        weight_format,
        time.perf_counter() - started,
    )
    return ModelRuntime(
        path,
        config,
        tokenizer,
        template_file.read_text() if template_file else chat_template(path),
        _pick_engine(engine, config, weights, head, weight_format, max_context),
        prompt_budget,
    )


def _pick_engine(
    kind: str, config: ModelConfig, weights: Weights, head: str, weight_format: str, max_context: int | None
) -> Engine:
    """'auto' takes the CUDA engine when a GPU and the cubin are usable, else the CPU engine; one log line says why."""
    if kind in ("auto", "cuda"):
        reason = _cuda_unusable_reason()
        if reason is None:
            log.info("engine %s: using the CUDA engine (head %s)", kind, head)
            return make_engine("cuda", config, weights, head, weight_format=weight_format, max_context=max_context)
        if kind == "cuda":
            raise RuntimeError(f"engine cuda requested but {reason}")
        log.info("engine auto: %s; using the CPU engine", reason)
    return make_engine("cpu", config, weights, head, weight_format=weight_format, max_context=max_context)


def _cuda_unusable_reason() -> str | None:
    """None when the CUDA engine can run here, else why not (no bindings, no GPU, an older GPU, no cubin)."""
    try:
        from decoder_service.engines.cuda.driver import compute_capability, cuda_available
        from decoder_service.engines.cuda.engine import cubin_path
    except ImportError as exc:
        return f"the CUDA engine is not importable ({exc})"
    ok, detail = cuda_available()
    if not ok:
        return f"no usable GPU ({detail})"
    major, minor = compute_capability()
    if (major, minor) < (9, 0):
        return f"GPU {detail} has compute capability {major}.{minor}; the cubin is built for sm_90 (Hopper) or newer"
    if cubin_path() is None:
        return f"GPU {detail} found, but no cubin is built; run `tooltrie cuda build` (nvcc) or set TOOLTRIE_CUBIN"
    return None
