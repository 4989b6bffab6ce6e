"""Character-level mode: the character trie, the vocabulary matcher, the compiled edges against a brute-force
model over name prefixes, compile errors, the serialised form, and k = 1..3 walks against an oracle."""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tooltrie.grammar import CompiledTrie, CompileError, GrammarState
from tooltrie.grammar.charlevel import compile_charlevel
from tooltrie.grammar.charlevel_names import build_char_trie
from tooltrie.grammar.charlevel_vocab import MatcherCache
from tooltrie.grammar.tokenizers.base import Tokenizer

# Letters that share tokens a lot, separators, digits, multi-byte characters (no newline: it is SEP).
_ALPHABET = "aab_.-xyz0189éü日本🙂 "
_names = st.text(alphabet=_ALPHABET, min_size=1, max_size=12)


@st.composite
def catalogs(draw, max_size: int = 30):
    names = draw(st.lists(_names, min_size=1, max_size=max_size, unique=True))
    extra = [n[: draw(st.integers(1, len(n)))] for n in names[: draw(st.integers(0, len(names)))]]
    extra += [n + draw(_names) for n in names[: draw(st.integers(0, 5))]]
    return list(dict.fromkeys(names + extra))


_tables: dict[str, dict[bytes, list[int]]] = {}


def content_table(tok) -> dict[bytes, list[int]]:
    """bytes -> ids of the tokens that may spell name text (not special, not empty), built independently."""
    table = _tables.get(tok.fingerprint)
    if table is None:
        special = set(tok.special_tokens.values())
        table = {}
        for i, b in enumerate(tok.token_bytes()):
            if b and i not in special:
                table.setdefault(b, []).append(i)
        _tables[tok.fingerprint] = table
    return table


def expected_graph(names: list[str], table: dict[bytes, int]) -> dict[bytes, dict[int, bytes]]:
    """Brute force over texts: from b"", every content token that keeps the text a prefix of some name, kept
    where a whole name can still be spelled afterwards. Text -> {token: text after it}."""
    encoded = [n.encode() for n in names]
    prefixes = {n[:i] for n in encoded for i in range(len(n) + 1)}
    step: dict[bytes, dict[int, bytes]] = {}
    queue = deque([b""])
    while queue:
        text = queue.popleft()
        if text in step:
            continue
        step[text] = {}
        for name in encoded:
            if name.startswith(text):
                for j in range(len(text) + 1, len(name) + 1):
                    for token in table.get(name[len(text) : j], ()):
                        step[text][token] = name[:j]
                        queue.append(name[:j])
    live = {t for t in step if t in set(encoded)}
    changed = True
    while changed:  # a text is live when some token leads to a live text
        changed = False
        for text, out in step.items():
            if text not in live and any(nxt in live for nxt in out.values()):
                live.add(text)
                changed = True
    assert prefixes >= set(step)
    return {t: {tok: n for tok, n in out.items() if n in live} for t, out in step.items() if t in live}


def node_texts(trie: CompiledTrie, vocab: list[bytes]) -> dict[int, bytes]:
    """Text of every node, by breadth-first search over the edges; asserts every path to a node spells the same."""
    texts, queue = {0: b""}, deque([0])
    while queue:
        node = queue.popleft()
        s = trie.edges_of(node)
        for token, child in zip(trie.edge_token[s].tolist(), trie.edge_child[s].tolist(), strict=True):
            if child >= trie.n_nodes:
                continue
            text = texts[node] + vocab[token]
            if child in texts:
                assert texts[child] == text, (node, token, child)
            else:
                texts[child] = text
                queue.append(child)
    assert len(texts) == trie.n_nodes, "every node is reachable from the root"
    return texts


def check_against_brute_force(names: list[str], tok) -> CompiledTrie:
    trie = compile_charlevel(names, tok)
    vocab, table = tok.token_bytes(), content_table(tok)
    assert sorted(trie.names) == sorted(names)
    assert [n.encode() for n in trie.names] == sorted(n.encode() for n in names)
    texts = node_texts(trie, vocab)
    encoded = [n.encode() for n in trie.names]
    expected = expected_graph(names, table)
    assert sorted(texts.values()) == sorted(expected), "nodes are the texts reachable at token boundaries"
    for node, text in texts.items():
        s = trie.edges_of(node)
        tokens = trie.edge_token[s].tolist()
        assert tokens == sorted(tokens)
        got = {}
        for token, child, lo, hi in zip(
            tokens, trie.edge_child[s].tolist(), trie.edge_lo[s].tolist(), trie.edge_hi[s].tolist(), strict=True
        ):
            if child >= trie.n_nodes:
                assert text in encoded and token in (trie.sep_token, trie.stop_token)
                assert (lo, hi) == (encoded.index(text), encoded.index(text) + 1)
                continue
            got[token] = texts[child]
            below = [p for p, n in enumerate(encoded) if n.startswith(texts[child])]
            assert (lo, hi) == (below[0], below[-1] + 1), "the pointers below an edge form its [lo, hi)"
        assert got == expected[text], text
        terminal = int(trie.node_terminal[node])
        assert (terminal >= 0) == (text in encoded)
        if terminal >= 0:
            assert trie.names[terminal].encode() == text
    return trie


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=catalogs())
def test_edges_equal_brute_force_qwen3(qwen3, names):
    check_against_brute_force(names, qwen3)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=catalogs())
def test_edges_equal_brute_force_smollm2(smollm2, names):
    check_against_brute_force(names, smollm2)


@settings(max_examples=40, deadline=None)
@given(names=catalogs())
def test_char_trie_nodes_and_ranges(names):
    chars = build_char_trie(names)
    encoded = [n.encode() for n in chars.names]
    assert encoded == sorted(n.encode() for n in names)
    text = [b""] * chars.n_nodes
    for v in range(1, chars.n_nodes):
        assert chars.parent[v] < v, "preorder: a parent comes before its children"
        text[v] = text[chars.parent[v]] + bytes([chars.byte[v]])
        assert chars.depth[v] == len(text[v])
    assert len(set(text)) == chars.n_nodes
    assert set(text) == {n[:i] for n in encoded for i in range(len(n) + 1)}
    for v in range(chars.n_nodes):
        below = [p for p, n in enumerate(encoded) if n.startswith(text[v])]
        assert (chars.lo[v], chars.hi[v]) == (below[0], below[-1] + 1)
        kids = chars.children[chars.child_start[v] : chars.child_start[v + 1]].tolist()
        assert [text[c] for c in kids] == sorted(t for t in text if len(t) == len(text[v]) + 1 and t[:-1] == text[v])
    for p, n in enumerate(encoded):
        assert text[chars.terminal_node[p]] == n and chars.terminal[chars.terminal_node[p]] == p


def test_matcher_holds_every_content_token_and_no_special(qwen3):
    matcher = MatcherCache().get(qwen3)
    vocab, special = qwen3.token_bytes(), set(qwen3.special_tokens.values())
    rng = random.Random(0)
    for token in rng.sample(range(len(vocab)), 3000):
        if vocab[token] and token not in special:
            assert matcher.token_of(vocab[token]) == token
    for token in special:
        assert matcher.token_of(vocab[token]) != token
    assert matcher.token_of(b"<|im_end|>") == -1
    table = content_table(qwen3)
    assert int((matcher.node_token >= 0).sum()) == len(table)
    assert len(matcher.dup_node) == sum(len(ids) - 1 for ids in table.values())


def test_matcher_cache_builds_once_per_fingerprint(qwen3, smollm2):
    cache = MatcherCache()
    assert qwen3 not in cache
    a = cache.get(qwen3)
    assert cache.get(qwen3) is a and qwen3 in cache
    assert cache.get(smollm2) is not a and len(cache) == 2
    trie = compile_charlevel(["get_user"], qwen3, matcher_cache=cache)
    assert len(cache) == 2 and trie.tokenizer_fingerprint == qwen3.fingerprint


def test_tokens_pass_through_terminals_but_never_into_the_separator(qwen3):
    trie = compile_charlevel(["in", "input"], qwen3)
    vocab, table = qwen3.token_bytes(), content_table(qwen3)
    root = set(trie.edge_token[trie.edges_of(0)].tolist())
    assert {table[b"in"][0], table[b"input"][0]} <= root, "a token may end at or pass through a terminal"
    for token in root:
        assert b"\n" not in vocab[token], "a token swallowing the separator is not an edge"
    texts = node_texts(trie, vocab)
    end = next(v for v, t in texts.items() if t == b"input")
    assert set(trie.edge_token[trie.edges_of(end)].tolist()) == {trie.sep_token, trie.stop_token}
    inner = next(v for v, t in texts.items() if t == b"in")
    assert {trie.sep_token, trie.stop_token} < set(trie.edge_token[trie.edges_of(inner)].tolist())


@pytest.mark.parametrize(
    ("names", "kwargs", "match"),
    [
        ([], {}, "no names"),
        (["a", ""], {}, "empty name"),
        (["a", "b", "a"], {}, "more than once"),
        (["two\nlines"], {}, "sep"),
        (["a"], {"sep": 5, "stop": 5}, "same token"),
        (["a"], {"stop": 10**7}, "outside the vocabulary"),
    ],
)
def test_compile_errors_say_what_and_how(qwen3, names, kwargs, match):
    with pytest.raises(CompileError, match=match):
        compile_charlevel(names, qwen3, **kwargs)


def test_a_byte_no_token_spells_is_refused(smollm2):
    covered = set()
    for i, b in enumerate(smollm2.token_bytes()):
        if b and i not in set(smollm2.special_tokens.values()):
            covered.update(b)
    missing = sorted(set(range(0x80, 0x100)) - covered)
    lead = next((b for b in missing if 0xF1 <= b <= 0xF3), None)  # a 4-byte UTF-8 lead byte no token holds
    if lead is None:
        pytest.skip("every UTF-8 lead byte is in some SmolLM2 token")
    name = bytes([lead, 0x80, 0x80, 0x80]).decode()
    with pytest.raises(CompileError, match="cannot be spelled"):
        compile_charlevel(["ok", "bad" + name], smollm2)


class TinyTokenizer(Tokenizer):
    """A hand-made vocabulary with gaps: some bytes are no one-byte token, so some positions are unreachable
    and some are dead ends (the pruning that byte-level BPE vocabularies never need)."""

    name = "tiny"

    def __init__(self, vocab: list[bytes]) -> None:
        self._vocab = [b"\n", b"<|im_end|>", *vocab]
        self.vocab_size = len(self._vocab)

    def encode(self, text: str) -> list[int]:  # greedy longest match; enough for sep/stop look-ups
        data, out = text.encode(), []
        while data:
            best = max(
                (i for i, b in enumerate(self._vocab) if b and data.startswith(b)), key=lambda i: len(self._vocab[i])
            )
            out.append(best)
            data = data[len(self._vocab[best]) :]
        return out

    def decode(self, ids) -> str:
        return b"".join(self._vocab[i] for i in ids).decode(errors="replace")

    @property
    def special_tokens(self) -> dict[str, int]:
        return {"<|im_end|>": 1}

    def token_bytes(self) -> list[bytes]:
        return list(self._vocab)

    def _fingerprint_parts(self):
        return [b"tiny"]


def test_positions_no_token_sequence_reaches_or_leaves_are_pruned():
    # "c" and "z" alone are no tokens: "abc" is reached through "abc" or "a" + "bc"; "xyz" only through "xyz"
    # ("x" and "xy" are dead ends: nothing spells the rest); "xz" cannot be spelled at all.
    tok = TinyTokenizer([b"a", b"b", b"ab", b"abc", b"bc", b"x", b"y", b"xyz", b"q"])
    with pytest.raises(CompileError, match="cannot be spelled"):
        compile_charlevel(["abc", "xz"], tok)
    trie = check_against_brute_force(["abc", "ab", "abcq", "xyz"], tok)
    texts = set(node_texts(trie, tok.token_bytes()).values())
    assert {b"", b"a", b"ab", b"abc", b"abcq", b"xyz"} == texts


def test_tokens_sharing_bytes_are_all_edges():
    # Ids 3 and 5 are both "a" (as byte-fallback vocabularies have); both are legal wherever "a" is.
    tok = TinyTokenizer([b"b", b"a", b"ab", b"a", b"b"])
    assert tok.token_bytes()[3] == tok.token_bytes()[5] == b"a"
    trie = check_against_brute_force(["ab", "ba", "aab"], tok)
    assert {3, 5} <= set(trie.edge_token[trie.edges_of(0)].tolist())


def test_serialised_form_round_trips(qwen3):
    trie = compile_charlevel(["get", "get_user", "日本", "🙂"], qwen3)
    back = CompiledTrie.from_bytes(trie.to_bytes(), expected_fingerprint=qwen3.fingerprint)
    for field in ("node_edge_start", "node_terminal", "edge_token", "edge_child", "edge_lo", "edge_hi"):
        assert np.array_equal(getattr(back, field), getattr(trie, field)), field
    assert back.names == trie.names


def oracle_legal(names: list[bytes], table, text: bytes, spent: set[bytes], owed: int, sep: int, stop: int):
    """Legal tokens from the contract alone: text of an unspent name continues, or the name ends here."""
    legal = set()
    for name in names:
        if name in spent or not name.startswith(text):
            continue
        rest = name[len(text) :]
        if not rest:
            legal.add(sep if owed > 1 else stop)
        for j in range(1, len(rest) + 1):
            legal.update(table.get(rest[:j], ()))
    return sorted(legal)


def dag_walk(trie: CompiledTrie, tok, k: int, rng: random.Random) -> list[str]:
    """A random k-walk checked against `oracle_legal` at every step, with no legal token a dead end."""
    vocab, table = tok.token_bytes(), content_table(tok)
    names = [n.encode() for n in trie.names]
    state, text, spent, answer = GrammarState(trie, k), b"", set(), []
    while not state.done:
        legal = state.legal_tokens().tolist()
        assert legal == oracle_legal(names, table, text, spent, k - len(answer), trie.sep_token, trie.stop_token)
        for token in legal:
            probe = state.copy()
            probe.advance(token)
            assert probe.done or len(probe.legal_tokens()) > 0
        token = rng.choice(legal)
        pointer = state.advance(token)
        if token in (trie.sep_token, trie.stop_token):
            assert names[pointer] == text
            answer.append(trie.names[pointer])
            spent.add(text)
            text = b""
        else:
            assert pointer is None
            text += vocab[token]
    assert [trie.names[p] for p in state.emitted] == answer
    return answer


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=catalogs(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_walks_spell_k_distinct_names(qwen3, names, seed, data):
    trie = compile_charlevel(names, qwen3)
    k = data.draw(st.integers(1, min(3, len(names))))
    answer = dag_walk(trie, qwen3, k, random.Random(seed))
    assert len(answer) == k and len(set(answer)) == k and set(answer) <= set(names)


def test_spent_name_is_closed_on_every_tokenization(qwen3):
    """After "abc" is spent, no path into it stays open: the root's "abc" token and "a" -> "bc" included."""
    trie = compile_charlevel(["ab", "abc"], qwen3)
    table = content_table(qwen3)
    state = GrammarState(trie, 2)
    for token in (table[b"abc"][0], trie.sep_token):
        state.advance(token)
    assert table[b"abc"][0] not in state.legal_tokens().tolist()
    assert state.copy().advance(table[b"ab"][0]) is None
    state.advance(table[b"a"][0])
    assert table[b"bc"][0] not in state.legal_tokens().tolist()
    state.advance(table[b"b"][0])
    assert state.legal_tokens().tolist() == [trie.stop_token]
