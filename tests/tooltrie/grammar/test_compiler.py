"""Compiler structure checked against quantities computed directly from the names' token sequences."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tooltrie.grammar import CompileError, TokenizationCache, compile_catalog
from tooltrie.grammar.trie import CONSTANT_BANK_BYTES


def _catalog(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    verbs, objects = ["get", "list", "create", "delete"], ["user", "users", "order", "invoice", "ticket"]
    names = {f"{rng.choice(['crm', 'billing', 'hr'])}.{rng.choice(verbs)}_{rng.choice(objects)}" for _ in range(n)}
    names |= {f"svc{rng.randrange(50)}.{rng.choice(verbs)}_{rng.choice(objects)}_{rng.randrange(99)}" for _ in range(n)}
    return sorted(names)[:n]


@pytest.fixture(scope="module")
def catalog_and_trie(qwen3):
    names = [*_catalog(300), "get_user", "get_user_by_id", "get"]
    return names, compile_catalog(names, qwen3)


def test_pointers_spell_names_in_lexicographic_token_order(qwen3, catalog_and_trie):
    names, trie = catalog_and_trie
    seqs = {n: qwen3.encode(n) for n in names}
    assert sorted(trie.names) == sorted(names)
    assert [seqs[n] for n in trie.names] == sorted(seqs.values())
    for p in range(trie.n_pointers):
        assert trie.token_sequence(p) == seqs[trie.names[p]]


def test_node_and_edge_counts_match_distinct_prefixes(qwen3, catalog_and_trie):
    names, trie = catalog_and_trie
    prefixes = {tuple(qwen3.encode(n))[:d] for n in names for d in range(1, len(qwen3.encode(n)) + 1)}
    assert trie.n_nodes == 1 + len(prefixes)
    assert trie.n_edges == len(prefixes) + 2 * len(names)
    s = trie.stats
    assert s.depth == max(len(qwen3.encode(n)) for n in names)
    assert s.root_out_degree == len({qwen3.encode(n)[0] for n in names})
    assert s.max_out_degree == int(np.diff(trie.node_edge_start).max())
    assert s.device_bytes == len(trie.device_image())


def _prefix_of_node(trie, node):
    path = []
    while node != 0:
        path.append(int(trie.node_in_token[node]))
        node = int(trie.node_parent[node])
    return tuple(reversed(path))


def test_edge_ranges_against_prefix_scan(qwen3, catalog_and_trie):
    _, trie = catalog_and_trie
    seqs = [tuple(qwen3.encode(n)) for n in trie.names]
    real = np.nonzero(trie.edge_child < trie.n_nodes)[0]
    for e in real.tolist():
        prefix = _prefix_of_node(trie, int(trie.edge_child[e]))
        below = [p for p, seq in enumerate(seqs) if seq[: len(prefix)] == prefix]
        assert below == list(range(int(trie.edge_lo[e]), int(trie.edge_hi[e])))


def test_terminals_and_control_edges(qwen3, catalog_and_trie):
    _, trie = catalog_and_trie
    terminal_nodes = np.nonzero(trie.node_terminal >= 0)[0]
    assert sorted(trie.node_terminal[terminal_nodes].tolist()) == list(range(trie.n_pointers))
    sep_edges = trie.edge_token == trie.sep_token
    assert (trie.edge_child[sep_edges] == trie.sep_node).all()
    assert (trie.edge_child[trie.edge_token == trie.stop_token] == trie.stop_node).all()
    assert sep_edges.sum() == trie.n_pointers
    # The prefix name is a terminal that also has children.
    node = trie.node_terminal.tolist().index(trie.pointer_of["get_user"])
    assert trie.node_edge_start[node + 1] - trie.node_edge_start[node] > 2


@pytest.mark.parametrize("order", [["get_user", "get_user_by_id"], ["get_user_by_id", "get_user"]])
def test_prefix_names_in_both_orders(qwen3, order):
    trie = compile_catalog(order, qwen3)
    assert trie.names == ("get_user", "get_user_by_id")
    assert trie.token_sequence(0) == qwen3.encode("get_user")


def test_errors(qwen3):
    with pytest.raises(CompileError, match="no names"):
        compile_catalog([], qwen3)
    with pytest.raises(CompileError, match="more than once"):
        compile_catalog(["a", "b", "a"], qwen3)
    with pytest.raises(CompileError, match="tokenizes to nothing"):
        compile_catalog(["a", ""], qwen3)
    with pytest.raises(CompileError, match="tokenize identically"):
        compile_catalog(["caf\u00e9", "cafe\u0301"], qwen3)
    with pytest.raises(CompileError, match="sep"):
        compile_catalog(["two\nlines"], qwen3)
    with pytest.raises(CompileError, match="must differ"):
        compile_catalog(["a"], qwen3, sep=11, stop=11)
    with pytest.raises(CompileError, match="outside the vocabulary"):
        compile_catalog(["a"], qwen3, stop=qwen3.vocab_size)


def test_custom_control_tokens(qwen3):
    comma = qwen3.single_token_id(",")
    trie = compile_catalog(["a", "b"], qwen3, sep=comma, stop=qwen3.special_tokens["<|endoftext|>"])
    assert trie.sep_token == comma and trie.stop_token == 151643


def test_constant_bank_flag(qwen3):
    small = compile_catalog(_catalog(42), qwen3)
    assert small.stats.fits_constant_bank and small.stats.device_bytes <= CONSTANT_BANK_BYTES
    big = compile_catalog(_catalog(3000), qwen3)
    assert not big.stats.fits_constant_bank


class _CountingTokenizer:
    """Wraps a tokenizer and counts the names it is asked to encode."""

    def __init__(self, inner):
        self._inner, self.encoded = inner, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode_batch(self, texts):
        self.encoded += len(texts)
        return self._inner.encode_batch(texts)


def test_cache_encodes_only_new_names(qwen3):
    tok = _CountingTokenizer(qwen3)
    cache = TokenizationCache()
    v1 = _catalog(200)
    compile_catalog(v1, tok, cache=cache)
    assert tok.encoded == 200
    v2 = [*v1[10:], "brand_new_tool"]
    warm = compile_catalog(v2, tok, cache=cache)
    assert tok.encoded == 201
    cold = compile_catalog(v2, qwen3)
    assert warm.names == cold.names
    assert all((getattr(warm, f) == getattr(cold, f)).all() for f in ("edge_token", "edge_child", "edge_lo", "edge_hi"))


def test_cache_is_per_fingerprint(qwen3, smollm2):
    cache = TokenizationCache()
    a = compile_catalog(["get_user"], qwen3, cache=cache)
    b = compile_catalog(["get_user"], smollm2, cache=cache)
    assert a.token_sequence(0) == qwen3.encode("get_user")
    assert b.token_sequence(0) == smollm2.encode("get_user")
    assert a.tokenizer_fingerprint != b.tokenizer_fingerprint


def test_cache_copy_is_independent(qwen3):
    cache = TokenizationCache()
    cache.encode(qwen3, ["a", "b"])
    other = cache.copy()
    other.encode(qwen3, ["c"])
    assert (len(cache), len(other)) == (2, 3)
