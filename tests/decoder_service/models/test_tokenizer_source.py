from __future__ import annotations

from pathlib import Path

import pytest

from decoder_service.models.loader import embedded_model_path, load_model
from decoder_service.models.tokenizer_source import chat_template, tokenizer_spec


def test_embedded_model_uses_the_shared_smollm2_tokenizer() -> None:
    assert tokenizer_spec(None) == "smollm2"
    assert tokenizer_spec(embedded_model_path()) == "smollm2"
    assert "<|im_start|>" in chat_template(None)


def test_directory_specs(tmp_path: Path, tiny_dir: Path) -> None:
    assert tokenizer_spec(tiny_dir) == "qwen3"
    (tmp_path / "tokenizer.json").write_text("{}")
    assert tokenizer_spec(tmp_path) == f"hf:{tmp_path}"
    with pytest.raises(ValueError, match="carries no chat template"):
        chat_template(tmp_path)


def test_unknown_model_path(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"neither a \.gguf file nor a directory"):
        load_model(tmp_path / "weights.bin")
    with pytest.raises(FileNotFoundError, match=r"holds neither tooltrie_tokenizer\.json nor tokenizer\.json"):
        tokenizer_spec(tmp_path)
