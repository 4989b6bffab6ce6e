"""Qwen vocabularies against an independent encoder: `tokenizers` BPE built by transformers' tiktoken
conversion from the same rank file, with the NFC normaliser and the added tokens of the real tokenizer."""

from __future__ import annotations

import unicodedata

import pytest
from tokenizers import AddedToken, normalizers
from transformers.convert_slow_tokenizer import TikTokenConverter

from tests.tooltrie.grammar.tokenizers.corpus import corpus
from tooltrie.grammar.tokenizers.qwen import QWEN3, QWEN36, QwenTokenizer, qwen_resource_path


def _reference(tok: QwenTokenizer):
    spec = tok.spec
    backend = TikTokenConverter(vocab_file=str(qwen_resource_path(spec.resource)), pattern=spec.pattern).converted()
    backend.normalizer = normalizers.NFC()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in spec.added_tokens])
    return backend


@pytest.fixture(scope="module")
def qwen3_reference(qwen3):
    return _reference(qwen3)


@pytest.fixture(scope="module")
def qwen36_reference(qwen36):
    return _reference(qwen36)


@pytest.mark.parametrize("which", ["qwen3", "qwen36"])
def test_ids_match_independent_bpe(which, request):
    tok = request.getfixturevalue(which)
    ref = request.getfixturevalue(f"{which}_reference")
    texts = corpus(specials=("<|im_end|>", "<think>", "</tool_call>", "<|endoftext|>"))
    assert len(texts) >= 1000
    ours = tok.encode_batch(texts)
    theirs = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    mismatches = [(t, a, b) for t, a, b in zip(texts, ours, theirs, strict=True) if a != b]
    assert mismatches == []
    assert [tok.encode(t) for t in texts[:200]] == ours[:200]


@pytest.mark.parametrize("which", ["qwen3", "qwen36"])
def test_added_tokens_are_at_reference_ids(which, request):
    tok = request.getfixturevalue(which)
    ref = request.getfixturevalue(f"{which}_reference")
    for text, token_id in tok.special_tokens.items():
        assert ref.token_to_id(text) == token_id
        assert tok.encode(text) == [token_id]


def test_qwen3_known_ids(qwen3):
    # Qwen3's tokenizer_config.json added_tokens_decoder and config.json.
    assert qwen3.vocab_size == 151_936
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657}
    expected |= {"</tool_call>": 151658, "<tool_response>": 151665, "<think>": 151667, "</think>": 151668}
    assert {k: qwen3.special_tokens[k] for k in expected} == expected
    assert len(qwen3.special_tokens) == 26
    assert qwen3.default_stop == 151645
    assert qwen3.decode([qwen3.default_sep]) == "\n"


def test_qwen36_ids(qwen36):
    assert qwen36.vocab_size == 248_077
    assert qwen36.special_tokens["<|endoftext|>"] == 248_044
    assert qwen36.special_tokens["<|im_end|>"] == 248_046
    assert max(qwen36.special_tokens.values()) == 248_076
    assert qwen36.decode([qwen36.default_stop]) == "<|im_end|>"


@pytest.mark.parametrize("which", ["qwen3", "qwen36"])
def test_token_bytes_and_decode(which, request):
    tok = request.getfixturevalue(which)
    table = tok.token_bytes()
    assert len(table) == tok.vocab_size
    n_real = tok.spec.n_ranks + len(tok.spec.added_tokens)
    assert all(b == b"" for b in table[n_real:])  # padding rows up to the embedding size
    assert all(table[:n_real])
    for text in corpus(50, 50):
        ids = tok.encode(text)
        assert b"".join(table[i] for i in ids) == unicodedata.normalize("NFC", text).encode()
        assert tok.decode(ids) == unicodedata.normalize("NFC", text)


def test_fingerprints_are_stable_and_distinct(qwen3, qwen36):
    assert QwenTokenizer(QWEN3).fingerprint == qwen3.fingerprint
    assert qwen3.fingerprint != qwen36.fingerprint
    assert QWEN36.embedding_rows == 248_077
