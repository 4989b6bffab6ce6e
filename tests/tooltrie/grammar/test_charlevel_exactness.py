"""Character-level masks against XGrammar's, state by state, for `root ::= "name1" | "name2" | ...` (k = 1).

The reference is `xgrammar.GrammarMatcher.fill_next_token_bitmask` over the same vocabulary bytes. Control
tokens: special/added tokens are never name text, so they are handed to XGrammar as empty strings (its
own marker for special tokens), and our STOP is XGrammar's only stop token, legal where its grammar may
end. With that mapping the two masks must be equal: no other exception is accepted.

Walks: the canonical tokenization of each sampled name, random non-canonical tokenizations of it (any
legal token that is a prefix of the rest of the name), and free random walks (any legal token). CI runs
the sampled subset below; `python bench/charlevel.py --exactness` sweeps every name of every catalog.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from tests.support.xgrammar_reference import Reference
from tooltrie.grammar import GrammarState, Tokenizer
from tooltrie.grammar.charlevel import compile_charlevel
from tooltrie.grammar.trie import CompiledTrie

xgr = pytest.importorskip("xgrammar")

# Accepted disagreements with XGrammar, each with its reason; none occurs in the catalogs below (Qwen3 and
# SmolLM2 spell every byte of a valid UTF-8 name with a one-byte token, or refuse the name at compile time).
ACCEPTED_EXCEPTIONS: dict[str, str] = {
    "dead-end positions": "a vocabulary lacking a one-byte token for some byte can reach a position inside a "
    "name from which no token sequence completes it; XGrammar's byte-level mask offers the token into it, "
    "we prune it, since the runtime must never offer a token that leads to an empty mask",
}

SERVICES = ["crm", "billing", "github", "slack", "jira", "calendar", "drive", "mail", "search", "maps", "shop"]
VERBS = ["get", "list", "create", "update", "delete", "search", "send", "fetch", "archive", "sync", "export"]
OBJECTS = [
    "user",
    "users",
    "contact",
    "invoice",
    "invoice_line",
    "order",
    "refund",
    "ticket",
    "comment",
    "issue",
    "pull_request",
    "branch",
    "message",
    "channel",
    "event",
    "file",
    "folder",
    "report",
    "webhook",
    "role",
]


def synthetic_catalog(k: int, seed: int = 0) -> list[str]:
    """`service.verb_object` names; services get `_v2`, `_v3`... suffixes once the combinations run out."""
    rng, names, version = random.Random(seed), set(), 1
    while len(names) < k:
        services = SERVICES if version == 1 else [f"{s}_v{version}" for s in SERVICES]
        combos = [f"{s}.{v}_{o}" for s in services for v in VERBS for o in OBJECTS]
        rng.shuffle(combos)
        names.update(combos[: k - len(names)])
        version += 1
    return sorted(names)


def hex_catalog(k: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return sorted({f"{rng.getrandbits(128):032x}" for _ in range(k)})


def tricky_catalog() -> list[str]:
    """Unicode, names that are prefixes of others (down to one byte), and one-byte continuations."""
    base = [
        "get",
        "get_user",
        "get_users",
        "get_user_by_id",
        "a",
        "ab",
        "abc",
        "abcd",
        "x.y",
        "x.y.z",
        "café",
        "café_au_lait",
        "日本",
        "日本語",
        "日本語_search",
        "🙂",
        "🙂🙂",
        "naïve-ß",
        "Ωmega",
        "ｆｕｌｌ",
        "emoji_🎉_party",
        "Ünïcödé.tool",
        "tab\tname",
        "space name",
        "a-b-c",
        "0",
        "00",
        "007",
    ]
    return sorted(set(base))


@dataclass
class Tally:
    states: int = 0
    walks: int = 0
    mismatches: list[str] = field(default_factory=list)


Chooser = Callable[[np.ndarray, bytes], int]


def walk(trie: CompiledTrie, ref: Reference, vocab: list[bytes], choose: Chooser, tally: Tally, label: str) -> None:
    """Compare masks at every state of one k = 1 walk; `choose(legal, text so far)` picks the next token."""
    ref.matcher.reset()
    state, text = GrammarState(trie, 1), b""
    tally.walks += 1
    while True:
        ours, theirs = state.legal_tokens(), ref.mask()
        tally.states += 1
        if not np.array_equal(ours, theirs):
            extra = np.setdiff1d(ours, theirs)[:8].tolist()
            missing = np.setdiff1d(theirs, ours)[:8].tolist()
            tally.mismatches.append(f"{label} after {text!r}: ours only {extra}, XGrammar only {missing}")
            return
        token = choose(ours, text)
        if token == trie.stop_token:
            state.advance(token)
            assert state.done and ref.matcher.accept_token(token)
            return
        assert state.advance(token) is None
        assert ref.matcher.accept_token(token), f"XGrammar refused {token} after {text!r}"
        text += vocab[token]


def canonical(tok: Tokenizer, name: str, stop: int) -> Chooser:
    tokens = [*tok.encode(name), stop]
    return lambda legal, text: tokens.pop(0)


def random_spelling(vocab: list[bytes], name: str, stop: int, rng: random.Random) -> Chooser:
    """Any legal token that is a prefix of the rest of `name` (mostly non-canonical tokenizations)."""
    target = name.encode()

    def choose(legal: np.ndarray, text: bytes) -> int:
        rest = target[len(text) :]
        if not rest:
            return stop
        return rng.choice([t for t in legal.tolist() if t != stop and vocab[t] and rest.startswith(vocab[t])])

    return choose


def free_walk(rng: random.Random) -> Chooser:
    return lambda legal, text: int(legal[rng.randrange(len(legal))])


def compare(
    names: Sequence[str],
    tok: Tokenizer,
    sample: int | None,
    seed: int = 0,
    ref: Reference | None = None,
    free_walks: int = 10,
) -> Tally:
    """Walk `sample` names (all when None) canonically and randomly, plus free walks; return the tally."""
    trie = compile_charlevel(names, tok)
    ref = ref or Reference(names, tok, trie.stop_token)
    vocab = list(tok.token_bytes())
    rng, tally = random.Random(seed), Tally()
    chosen = list(names) if sample is None or sample >= len(names) else rng.sample(list(names), sample)
    for name in chosen:
        walk(trie, ref, vocab, canonical(tok, name, trie.stop_token), tally, f"canonical {name!r}")
        walk(trie, ref, vocab, random_spelling(vocab, name, trie.stop_token, rng), tally, f"random {name!r}")
    for i in range(free_walks):
        walk(trie, ref, vocab, free_walk(rng), tally, f"free walk {i}")
    return tally


def _assert_exact(tally: Tally) -> None:
    assert tally.states > 0
    assert not tally.mismatches, "\n".join(tally.mismatches[:10])


@pytest.fixture(scope="module", params=["qwen3", "smollm2"])
def vocab(request) -> Tokenizer:
    return request.getfixturevalue(request.param.replace(".", ""))


def test_small_synthetic_every_name(vocab):
    _assert_exact(compare(synthetic_catalog(42), vocab, sample=None))


def test_tricky_names_every_name(vocab):
    _assert_exact(compare(tricky_catalog(), vocab, sample=None, free_walks=40))


def test_synthetic_1000_sampled(vocab):
    _assert_exact(compare(synthetic_catalog(1000), vocab, sample=25, seed=1))


def test_hex_1000_sampled(vocab):
    _assert_exact(compare(hex_catalog(1000), vocab, sample=20, seed=2))


def test_synthetic_10000_sampled(qwen3):
    # XGrammar takes seconds to compile 10,000 names, so CI runs this size on one vocabulary only.
    _assert_exact(compare(synthetic_catalog(10_000), qwen3, sample=10, seed=3, free_walks=5))
