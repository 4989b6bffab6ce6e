"""Tokenizers of the Hugging Face `tokenizers` library (a `tokenizer.json`, or one built in memory)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders

from tooltrie.grammar.errors import TokenizerError
from tooltrie.grammar.tokenizers.base import Tokenizer


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable spelling of the 256 bytes, inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in spelling.items()}


def _piece_bytes(piece: str, byte_level: dict[str, int] | None) -> bytes:
    if byte_level is not None:
        try:
            return bytes(byte_level[c] for c in piece)
        except KeyError:
            return piece.encode()  # not in the byte alphabet: an added token spelled as text
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # sentencepiece byte fallback
        return bytes([int(piece[3:5], 16)])
    return piece.replace("▁", " ").encode()


class HfTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer`; byte-level and sentencepiece-style vocabularies both map to bytes."""

    def __init__(
        self,
        backend: HfBackend,
        *,
        name: str,
        embedding_rows: int | None = None,
        stop_text: str | None = None,
        sep_text: str = "\n",
    ) -> None:
        self._backend = backend
        self.name = name
        own = backend.get_vocab_size(with_added_tokens=True)
        if embedding_rows is not None and embedding_rows < own:
            raise TokenizerError(f"{name}: embedding_rows={embedding_rows} is below the tokenizer's {own} ids")
        self.vocab_size = embedding_rows or own
        self._special = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
        self.default_sep_text = sep_text
        if stop_text is None:
            stop_text = next(
                (s for s in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>") if s in self._special), ""
            )
        self.default_stop_text = stop_text

    @classmethod
    def from_file(cls, path: str | Path, *, embedding_rows: int | None = None) -> HfTokenizer:
        """Load `tokenizer.json` (or a folder holding it; its `config.json` gives the embedding rows)."""
        path = Path(path)
        folder = path if path.is_dir() else path.parent
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise TokenizerError(f"no tokenizer.json at {file}; pass hf:PATH to a tokenizer.json or its folder")
        config = folder / "config.json"
        if embedding_rows is None and config.is_file():
            embedding_rows = json.loads(config.read_text()).get("vocab_size")
        return cls(HfBackend.from_file(str(file)), name=f"hf:{file}", embedding_rows=embedding_rows)

    @property
    def backend(self) -> HfBackend:
        return self._backend

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        table = self._all_bytes
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    @cached_property
    def _all_bytes(self) -> list[bytes]:
        byte_level = byte_level_alphabet() if isinstance(self._backend.decoder, decoders.ByteLevel) else None
        table = [b""] * self.vocab_size
        for piece, i in self._backend.get_vocab(with_added_tokens=False).items():
            table[i] = _piece_bytes(piece, byte_level)
        for text, i in self._special.items():
            table[i] = text.encode()
        return table

    def token_bytes(self) -> list[bytes]:
        return list(self._all_bytes)

    def _fingerprint_parts(self) -> Iterable[bytes]:
        yield b"hf-tokenizers"
        yield self._backend.to_str().encode()
