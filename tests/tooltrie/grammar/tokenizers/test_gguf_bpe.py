"""The SmolLM2 GGUF tokenizer against transformers loading the same GGUF.

transformers builds the vocabulary, merges and specials independently, but ignores `tokenizer.ggml.pre`
= `smollm` and keeps GPT-2's plain byte-level pre-tokenizer. SmolLM2's own tokenizer.json (and llama.cpp)
split digits one by one first, which changes how whitespace before a digit groups ("\t0" vs " \t" + "0").
So the reference gets SmolLM2's real pre-tokenizer for the full comparison, and the unmodified transformers
tokenizer is compared on digit-free strings, where the two pre-tokenizers agree.
"""

from __future__ import annotations

import copy

import pytest
from tokenizers import pre_tokenizers

from tests.tooltrie.grammar.tokenizers.corpus import corpus
from tooltrie.embedded import smollm2_gguf_path
from tooltrie.grammar.errors import TokenizerError
from tooltrie.grammar.tokenizers.gguf_bpe import load_gguf_tokenizer


@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    path = smollm2_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


TEXTS = corpus(specials=("<|im_end|>", "<|im_start|>", "<file_sep>"))


def _mismatches(ours, backend, texts):
    theirs = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return [(t, a, b) for t, a, b in zip(texts, ours, theirs, strict=True) if a != b]


def test_ids_match_transformers_with_smollm2_pre_tokenizer(smollm2, reference):
    assert len(TEXTS) >= 1000
    backend = copy.deepcopy(reference.backend_tokenizer)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    assert _mismatches(smollm2.encode_batch(TEXTS), backend, TEXTS) == []


def test_ids_match_unmodified_transformers_without_digits(smollm2, reference):
    texts = [t for t in TEXTS if not any(c.isnumeric() for c in t)]
    assert len(texts) >= 500
    assert _mismatches(smollm2.encode_batch(texts), reference.backend_tokenizer, texts) == []


def test_vocabulary_and_specials(smollm2, reference):
    assert smollm2.vocab_size == 49_152
    assert smollm2.special_tokens["<|im_end|>"] == 2
    assert smollm2.default_stop == reference.convert_tokens_to_ids("<|im_end|>")
    assert smollm2.decode([smollm2.default_sep]) == "\n"
    table = smollm2.token_bytes()
    for token_id in (100, 1000, 20_000, 49_151):
        assert table[token_id].decode("utf-8", errors="replace") == reference.decode([token_id])


def test_decode_round_trip(smollm2):
    for text in corpus(100, 100):
        assert smollm2.decode(smollm2.encode(text)) == text


def test_not_a_gguf(tmp_path):
    with pytest.raises(TokenizerError, match="no GGUF file"):
        load_gguf_tokenizer(tmp_path / "missing.gguf")
