"""`hf:PATH` tokenizers: a tokenizer.json written from the SmolLM2 backend loads back identical."""

from __future__ import annotations

import json

import pytest

from tests.tooltrie.grammar.tokenizers.corpus import corpus
from tooltrie.grammar.errors import TokenizerError
from tooltrie.grammar.tokenizers.hf import HfTokenizer, byte_level_alphabet


def test_round_trip_through_tokenizer_json(smollm2, tmp_path):
    smollm2.backend.save(str(tmp_path / "tokenizer.json"))
    loaded = HfTokenizer.from_file(tmp_path / "tokenizer.json")
    texts = corpus(200, 300)
    assert loaded.encode_batch(texts) == smollm2.encode_batch(texts)
    assert loaded.token_bytes() == smollm2.token_bytes()
    assert loaded.fingerprint == smollm2.fingerprint
    assert loaded.default_stop == smollm2.default_stop


def test_folder_with_config_sets_embedding_rows(smollm2, tmp_path):
    smollm2.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 49_280}))
    loaded = HfTokenizer.from_file(tmp_path)
    assert loaded.vocab_size == 49_280
    assert loaded.token_bytes()[49_200] == b""
    assert loaded.fingerprint != smollm2.fingerprint


def test_missing_file(tmp_path):
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        HfTokenizer.from_file(tmp_path)


def test_byte_alphabet_is_a_bijection():
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["Ġ"] == ord(" ") and alphabet["Ċ"] == ord("\n")


def test_sentencepiece_style_pieces_map_to_bytes():
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import BPE

    backend = Backend(BPE({"▁a": 0, "<0x0A>": 1, "b": 2}, [], fuse_unk=False))
    backend.add_special_tokens(["</s>"])
    tok = HfTokenizer(backend, name="tiny", embedding_rows=8)
    assert tok.token_bytes() == [b" a", b"\n", b"b", b"</s>", b"", b"", b"", b""]
    assert tok.default_stop == 3
