"""A brute-force model of the decoding contract, written from DESIGN.md section 3 without the trie.

It scans every name's token sequence at every step, so it is only for small catalogs in tests.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from tooltrie.grammar.runtime import GrammarState
from tooltrie.grammar.trie import CompiledTrie


def oracle_legal(
    seqs: Mapping[str, tuple[int, ...]],
    prefix: tuple[int, ...],
    spent: set[str],
    owed: int,
    allowed: set[str] | None,
    sep: int,
    stop: int,
) -> list[int]:
    """Tokens that keep the answer completable: a next token of an unspent allowed name extending
    `prefix`, or the control token if `prefix` is itself such a name (SEP while more are owed)."""
    legal = set()
    n = len(prefix)
    for name, seq in seqs.items():
        if name in spent or (allowed is not None and name not in allowed) or seq[:n] != prefix:
            continue
        if len(seq) > n:
            legal.add(seq[n])
        else:
            legal.add(sep if owed > 1 else stop)
    return sorted(legal)


def random_walk(
    trie: CompiledTrie,
    seqs: Mapping[str, tuple[int, ...]],
    k: int,
    rng: random.Random,
    allowed_names: Sequence[str] | None = None,
    check_dead_ends: bool = True,
) -> list[str]:
    """Walk choosing random legal tokens; at every step compare with the oracle and check that no legal
    token leads to an empty mask. Returns the names of the answer in order."""
    allowed = None if allowed_names is None else [trie.pointer_of[n] for n in allowed_names]
    allowed_set = None if allowed_names is None else set(allowed_names)
    state = GrammarState(trie, k, allowed=allowed)
    prefix: tuple[int, ...] = ()
    spent: set[str] = set()
    answer: list[str] = []
    while not state.done:
        legal = state.legal_tokens()
        expected = oracle_legal(seqs, prefix, spent, k - len(answer), allowed_set, trie.sep_token, trie.stop_token)
        assert legal.tolist() == expected, (prefix, answer)
        assert not (trie.sep_token in expected and trie.stop_token in expected)
        if check_dead_ends:
            for token in legal.tolist():
                probe = state.copy()
                probe.advance(token)
                assert probe.done or len(probe.legal_tokens()) > 0
        token = rng.choice(legal.tolist())
        pointer = state.advance(token)
        if token in (trie.sep_token, trie.stop_token):
            name = trie.names[pointer]
            assert seqs[name] == prefix
            answer.append(name)
            spent.add(name)
            prefix = ()
        else:
            assert pointer is None
            prefix += (token,)
    assert [trie.names[p] for p in state.emitted] == answer
    return answer
