from __future__ import annotations

import pytest

from tooltrie.grammar.errors import TokenizerError
from tooltrie.grammar.tokenizers import load_tokenizer


def test_specs_share_one_instance(qwen3, smollm2):
    assert load_tokenizer("qwen3") is qwen3
    assert load_tokenizer("smollm2") is smollm2


def test_gguf_and_hf_specs_pass_the_path(monkeypatch, tmp_path):
    from tooltrie.grammar.tokenizers import gguf_bpe, hf

    seen = []
    monkeypatch.setattr(gguf_bpe, "load_gguf_tokenizer", lambda path: seen.append(("gguf", path)))
    monkeypatch.setattr(hf.HfTokenizer, "from_file", staticmethod(lambda path: seen.append(("hf", path))))
    uncached = load_tokenizer.__wrapped__  # keep the stubs' results out of the shared cache
    uncached(f"gguf:{tmp_path}/a.gguf")
    uncached(f"hf:{tmp_path}/tokenizer.json")
    assert seen == [("gguf", f"{tmp_path}/a.gguf"), ("hf", f"{tmp_path}/tokenizer.json")]


def test_unknown_spec():
    with pytest.raises(TokenizerError, match="accepted: qwen3"):
        load_tokenizer("llama9")


def test_bad_paths(tmp_path):
    with pytest.raises(TokenizerError):
        load_tokenizer(f"gguf:{tmp_path / 'x.gguf'}")
    with pytest.raises(TokenizerError):
        load_tokenizer(f"hf:{tmp_path}")
