"""The tokenizer interface every backend implements.

A backend knows the byte string of every token id (padding ids up to the embedding size are empty), encodes
text canonically (the ids the model's own tokenizer produces for that text alone), decodes ids, names its
special tokens, and has a stable fingerprint: a sha256 over everything that decides ids (vocabulary bytes,
merges or ranks, pre-tokenizer, normalizer, specials, embedding size). Two tokenizers with equal
fingerprints produce identical ids for every text, so compiled tries and tokenization caches are keyed by it.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from functools import cached_property


class Tokenizer(ABC):
    """One vocabulary with its canonical encoder. Subclasses set `name`, `vocab_size` and the defaults."""

    name: str
    #: Rows of the model's embedding table; ids at or above the tokenizer's own size are padding.
    vocab_size: int
    #: Text of the default separator token between names (a single token) and of the end-of-turn token.
    default_sep_text: str = "\n"
    default_stop_text: str = "<|im_end|>"

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Canonical ids of `text` encoded alone (added/special token texts inside it map to their ids)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts; backends override it with a faster batch path."""
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` (bytes joined, then decoded as UTF-8 with replacement)."""

    @property
    @abstractmethod
    def special_tokens(self) -> dict[str, int]:
        """Added/special token text -> id (e.g. `<|im_end|>` -> 151645)."""

    @abstractmethod
    def token_bytes(self) -> list[bytes]:
        """Byte string of every id in `range(vocab_size)`; special tokens give their text, padding ids b''."""

    @abstractmethod
    def _fingerprint_parts(self) -> Iterable[bytes]:
        """Everything besides the vocabulary bytes and specials that decides ids (rules, merges, regex)."""

    @cached_property
    def fingerprint(self) -> str:
        """Hex sha256 over the vocabulary bytes, the encode rules and the special tokens."""
        h = hashlib.sha256()
        h.update(f"tooltrie-tokenizer-v1:{type(self).__name__}:{self.vocab_size}\n".encode())
        for b in self.token_bytes():
            h.update(len(b).to_bytes(4, "little"))
            h.update(b)
        for text, token_id in sorted(self.special_tokens.items(), key=lambda kv: kv[1]):
            h.update(f"special {token_id} {text}\n".encode())
        for part in self._fingerprint_parts():
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
        return h.hexdigest()

    def single_token_id(self, text: str) -> int:
        """Id of `text` when it is exactly one token (a special token or a one-token text); else an error."""
        special = self.special_tokens.get(text)
        if special is not None:
            return special
        ids = self.encode(text)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is not a single token in {self.name} (it encodes to {ids}); pass a token id")
        return ids[0]

    @property
    def default_sep(self) -> int:
        """Separator token id between names (a newline token unless the backend says otherwise)."""
        return self.single_token_id(self.default_sep_text)

    @property
    def default_stop(self) -> int:
        """End-of-answer token id (the model's end-of-turn token)."""
        return self.single_token_id(self.default_stop_text)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} vocab_size={self.vocab_size}>"
