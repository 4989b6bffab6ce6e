"""Tries built from explicit token sequences (no tokenizer needed: the GPU machine has none of ours), including
a deliberately broken one whose root has no live edge."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tooltrie.grammar.compiler import build_trie
from tooltrie.grammar.trie import CompiledTrie


@dataclass(frozen=True)
class _Vocab:
    """What ``build_trie`` reads of a tokenizer."""

    vocab_size: int
    fingerprint: str = "synthetic"


def trie_from_sequences(seqs: Sequence[Sequence[int]], vocab_size: int, sep: int, stop: int) -> CompiledTrie:
    names = ["tool_" + "_".join(map(str, s)) for s in seqs]
    return build_trie([list(s) for s in seqs], names, _Vocab(vocab_size), sep, stop)  # type: ignore[arg-type]


def random_catalog(
    rng: np.random.Generator,
    n_names: int,
    vocab_size: int,
    sep: int,
    stop: int,
    first_tokens: int = 12,
    max_len: int = 5,
) -> CompiledTrie:
    """Names sharing first tokens (so nodes branch), some a prefix of another, none using SEP or STOP."""
    pool = np.setdiff1d(np.arange(100, vocab_size), [sep, stop])
    firsts = rng.choice(pool, first_tokens, replace=False)
    seqs: set[tuple[int, ...]] = set()
    while len(seqs) < n_names:
        length = int(rng.integers(1, max_len + 1))
        seq = (int(rng.choice(firsts)), *(int(t) for t in rng.choice(pool, length - 1)))
        seqs.add(seq)
        if len(seqs) < n_names and length > 1 and rng.random() < 0.2:
            seqs.add(seq[:-1])  # a name that is a prefix of another
    return trie_from_sequences(sorted(seqs), vocab_size, sep, stop)


def wide_catalog(n_names: int, vocab_size: int, sep: int, stop: int) -> CompiledTrie:
    """A root with ``n_names`` edges (one token per name): wider than the sparse head's 256 slots when large."""
    return trie_from_sequences([[100 + 3 * i] for i in range(n_names)], vocab_size, sep, stop)


def empty_mask_trie(sep: int = 1, stop: int = 2) -> CompiledTrie:
    """One name, with the root's only edge given an empty pointer range: no token is ever legal."""
    trie = trie_from_sequences([[20, 21]], 1000, sep, stop)
    trie.edge_hi[0] = trie.edge_lo[0]
    return trie
