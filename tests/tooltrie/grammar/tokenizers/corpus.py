"""A seeded corpus of test strings: tool names, unicode, whitespace, digits, punctuation, special tokens."""

from __future__ import annotations

import random
import unicodedata

_WORDS = ["get", "list", "create", "delete", "user", "users", "by", "id", "order", "Invoice", "HTTP", "v2", "json"]
_SEPS = ["_", ".", "-", "", "__", "/"]
_UNICODE = [
    "héllo",
    "wörld",
    "naïve",
    "Ångström",
    "日本語",
    "東京",
    "中文分词",
    "한국어",
    "Привет",
    "مرحبا",
    "שלום",
    "ελληνικά",
    "हिन्दी",
    "ไทย",
    "🙂",
    "🚀🔥",
    "👩‍💻",
    "e\u0301",
    "A\u030a",
    "\u00a0",
    "\u200b",
    "ﬁ",
    "①②",
    "½",
]
_SPACES = [" ", "  ", "\t", "\n", "\n\n", "\r\n", " \n ", "   \t", "\u3000", ""]
_PUNCT = ["'s", "'ll", "'T", "DON'T", "(", ")", "{}", "[]", '"', ",", ";", "::", "->", "=>", "...", "!?", "#", "$%"]
_DIGITS = ["0", "7", "42", "123", "2024", "3.14159", "1,000", "0x1F", "v1.2.3", "100000"]


def tool_names(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [rng.choice(_WORDS) for _ in range(rng.randint(1, 4))]
        name = rng.choice(_SEPS).join(parts)
        if rng.random() < 0.3:
            name += str(rng.randrange(1000))
        out.append(name)
    return out


def mixed_strings(n: int, seed: int = 1, specials: tuple[str, ...] = ()) -> list[str]:
    rng = random.Random(seed)
    pools = [_WORDS, _UNICODE, _SPACES, _PUNCT, _DIGITS, tool_names(50, seed)] + ([list(specials)] if specials else [])
    out = []
    for _ in range(n):
        pieces = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 8))]
        joiners = [rng.choice(_SPACES) for _ in pieces]
        text = "".join(p + j for p, j in zip(pieces, joiners, strict=True))
        if rng.random() < 0.1:
            text = unicodedata.normalize("NFD", text)
        out.append(text)
    return out


def corpus(n_names: int = 500, n_mixed: int = 700, specials: tuple[str, ...] = ()) -> list[str]:
    """At least `n_names + n_mixed` strings, fixed edge cases first."""
    fixed = ["", " ", "a", "get_user", "get_user_by_id", " leading", "trailing ", "  two  spaces  ", "\n", "x\r\ny"]
    return fixed + tool_names(n_names) + mixed_strings(n_mixed, specials=specials)
