"""Build an engine by name, so tests and services list engines in one place."""

from __future__ import annotations

from decoder_service.engines.base import Engine
from decoder_service.models.config import ModelConfig
from decoder_service.models.fp8 import WEIGHT_FORMATS
from decoder_service.models.weights import Weights

#: Engines usable on every machine; the CUDA engine is added where a GPU is (see the engine test fixtures).
ENGINE_NAMES = ("cpu",)
KNOWN_ENGINES = ("cpu", "cuda")


# KV positions the CUDA engine reserves (bf16 cache; Qwen3-1.7B: 1.75 GiB): covers the default prompt budget of models
# up to 64k context.
CUDA_MAX_CONTEXT = 16_384


def make_engine(
    name: str,
    config: ModelConfig,
    weights: Weights,
    head: str = "sparse",
    forced_tail: bool | None = None,
    forced_chains: bool | None = None,
    weight_format: str = "bf16",
) -> Engine:
    """``forced_tail``, ``forced_chains`` None: the engines' defaults ($TOOLTRIE_FORCED_TAIL and
    $TOOLTRIE_FORCED_CHAINS, else on). ``weight_format`` 'fp8': ``weights`` are quantized already
    (``decoder_service.models.fp8.quantize_weights``); the CUDA engine then also reads them as e4m3 bytes, the CPU
    engine computes with them as they are."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weight_format!r}; accepted: {', '.join(WEIGHT_FORMATS)}")
    if name == "cpu":
        from decoder_service.engines.cpu.engine import CpuEngine
        from decoder_service.engines.cpu.model import CpuTransformer

        return CpuEngine(
            CpuTransformer(config, weights), head=head, forced_tail=forced_tail, forced_chains=forced_chains
        )
    if name == "cuda":
        from decoder_service.engines.cuda.engine import CudaEngine

        return CudaEngine(
            config,
            weights,
            head=head,
            max_context=min(config.max_position_embeddings, CUDA_MAX_CONTEXT),
            forced_tail=forced_tail,
            forced_chains=forced_chains,
            weight_format=weight_format,
        )
    raise ValueError(f"unknown engine {name!r}; available: {', '.join(KNOWN_ENGINES)}")
