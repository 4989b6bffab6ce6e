"""A registry and decoders in one process for the service benchmarks (real gRPC over loopback)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from decoder_service.model_runtime import ModelRuntime, load_runtime
from decoder_service.models.synth import write_synthetic_checkpoint


def bench_runtime(model: str, scratch: Path) -> ModelRuntime:
    """`tiny` (a seeded synthetic Qwen3 with the real Qwen3 vocabulary), `embedded` (SmolLM2-135M), or a path."""
    if model == "tiny":
        return load_runtime(write_synthetic_checkpoint("tiny", 7, scratch / "tiny"), engine="cpu")
    return load_runtime(None if model == "embedded" else model, engine="cpu")


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="tooltrie-bench-")
