"""A tokenizer survives its transferable form: same fingerprint, same ids; a forged one is refused."""

from __future__ import annotations

import dataclasses

import pytest

from tooltrie.grammar import TokenizerError
from tooltrie.grammar.tokenizers import Tokenizer
from tooltrie.grammar.tokenizers.blob import from_blob, to_blob

TEXTS = ["github.create_issue", "slack.send_message", " héllo wörld 12345", "<|im_end|>\n"]


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_round_trip(name: str, request: pytest.FixtureRequest) -> None:
    tokenizer: Tokenizer = request.getfixturevalue(name)
    rebuilt = from_blob(to_blob(tokenizer))
    assert rebuilt.fingerprint == tokenizer.fingerprint
    assert rebuilt.vocab_size == tokenizer.vocab_size
    assert (rebuilt.default_sep, rebuilt.default_stop) == (tokenizer.default_sep, tokenizer.default_stop)
    for text in TEXTS:
        assert rebuilt.encode(text) == tokenizer.encode(text)


def test_forged_or_damaged_blobs_are_refused(smollm2: Tokenizer) -> None:
    blob = to_blob(smollm2)
    with pytest.raises(TokenizerError, match="fingerprint"):
        from_blob(dataclasses.replace(blob, fingerprint="0" * 64))
    with pytest.raises(TokenizerError, match="does not parse"):
        from_blob(dataclasses.replace(blob, data=blob.data[: len(blob.data) // 2]))
    with pytest.raises(TokenizerError, match="unknown tokenizer kind"):
        from_blob(dataclasses.replace(blob, kind="sentencepiece"))
    with pytest.raises(TokenizerError, match="unknown Qwen vocabulary"):
        from_blob(dataclasses.replace(blob, kind="qwen", data=b"qwen9"))
