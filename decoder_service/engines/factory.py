"""Build an engine by name, so tests and services list engines in one place."""

from __future__ import annotations

from decoder_service.engines.base import Engine
from decoder_service.models.config import ModelConfig
from decoder_service.models.fp8 import WEIGHT_FORMATS
from decoder_service.models.weights import Weights

#: Engines usable on every machine; the CUDA engine is added where a GPU is (see the engine test fixtures).
ENGINE_NAMES = ("cpu",)
KNOWN_ENGINES = ("cpu", "cuda")


# KV positions the CUDA engine reserves unless told otherwise (bf16 cache; Qwen3-1.7B: 1.75 GiB): covers the default
# prompt budget of models up to 64k context.
CUDA_MAX_CONTEXT = 16_384


def engine_context(name: str, config: ModelConfig, max_context: int | None) -> int:
    """The positions (prompt and answer) an engine of ``name`` serves: ``max_context`` where given, else the model's
    trained context, capped at CUDA_MAX_CONTEXT on the CUDA engine, whose KV cache reserves every position."""
    trained = config.max_position_embeddings
    if max_context is None:
        return min(trained, CUDA_MAX_CONTEXT) if name == "cuda" else trained
    if max_context < 1:
        raise ValueError(f"max context {max_context} positions: at least 1 is needed")
    if max_context > trained:
        raise ValueError(f"max context {max_context:,} positions exceeds the {trained:,} the model was trained for")
    return max_context


def make_engine(
    name: str,
    config: ModelConfig,
    weights: Weights,
    head: str = "sparse",
    forced_tail: bool | None = None,
    forced_chains: bool | None = None,
    weight_format: str = "bf16",
    max_context: int | None = None,
) -> Engine:
    """``forced_tail``, ``forced_chains`` None: the engines' defaults ($TOOLTRIE_FORCED_TAIL and
    $TOOLTRIE_FORCED_CHAINS, else on). ``weight_format`` 'fp8': ``weights`` are quantized already
    (``decoder_service.models.fp8.quantize_weights``); the CUDA engine then also reads them as e4m3 bytes, the CPU
    engine computes with them as they are. ``max_context``: see `engine_context`."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weight_format!r}; accepted: {', '.join(WEIGHT_FORMATS)}")
    if name not in KNOWN_ENGINES:
        raise ValueError(f"unknown engine {name!r}; available: {', '.join(KNOWN_ENGINES)}")
    context = engine_context(name, config, max_context)
    if name == "cpu":
        from decoder_service.engines.cpu.engine import CpuEngine
        from decoder_service.engines.cpu.model import CpuTransformer

        return CpuEngine(
            CpuTransformer(config, weights),
            head=head,
            forced_tail=forced_tail,
            forced_chains=forced_chains,
            max_context=context,
        )
    from decoder_service.engines.cuda.engine import CudaEngine

    return CudaEngine(
        config,
        weights,
        head=head,
        max_context=context,
        forced_tail=forced_tail,
        forced_chains=forced_chains,
        weight_format=weight_format,
    )
