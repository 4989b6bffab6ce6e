"""Shared model fixtures: a tiny synthetic Qwen3 checkpoint (written once per session) and the embedded SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoder_service.models.config import ModelConfig
from decoder_service.models.loader import load_model
from decoder_service.models.synth import write_synthetic_checkpoint
from decoder_service.models.weights import Weights

TINY_SEED = 7


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_checkpoint("tiny", TINY_SEED, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> tuple[ModelConfig, Weights]:
    return load_model(tiny_dir)


@pytest.fixture(scope="session")
def smollm2_model() -> tuple[ModelConfig, Weights]:
    return load_model(None)
