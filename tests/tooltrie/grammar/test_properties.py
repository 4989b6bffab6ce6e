"""Property tests of compiler + runtime against the brute-force oracle, on the real Qwen3 vocabulary."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tooltrie.grammar.oracle import random_walk
from tooltrie.grammar import GrammarState, KTooLargeError, compile_catalog
from tooltrie.grammar.trie import K_MAX

# Letters that share tokens a lot, separators, digits, multi-byte characters (no newline: it is SEP).
_ALPHABET = "aab_.-xyz0189éü日本🙂 "
_names = st.text(alphabet=_ALPHABET, min_size=1, max_size=12)


@st.composite
def catalogs(draw):
    names = draw(st.lists(_names, min_size=1, max_size=40, unique=True))
    # Names that are prefixes of others, and extensions of others.
    extra = [n[: draw(st.integers(1, len(n)))] for n in names[: draw(st.integers(0, len(names)))]]
    extra += [n + draw(_names) for n in names[: draw(st.integers(0, 5))]]
    return list(dict.fromkeys(names + extra))


def _seqs(tok, names):
    return {n: tuple(tok.encode(n)) for n in names}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=catalogs(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_walks_spell_k_distinct_names(qwen3, names, seed, data):
    trie = compile_catalog(names, qwen3)
    seqs = _seqs(qwen3, names)
    k = data.draw(st.integers(1, min(K_MAX, len(names))))
    answer = random_walk(trie, seqs, k, random.Random(seed))
    assert len(answer) == k and len(set(answer)) == k and set(answer) <= set(names)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=catalogs(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_walks_with_an_allowed_set(qwen3, names, seed, data):
    trie = compile_catalog(names, qwen3)
    allowed = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    k = data.draw(st.integers(1, min(K_MAX, len(allowed))))
    answer = random_walk(trie, _seqs(qwen3, names), k, random.Random(seed), allowed_names=allowed)
    assert set(answer) <= set(allowed) and len(set(answer)) == k


@settings(max_examples=30, deadline=None)
@given(names=catalogs())
def test_every_name_is_reachable_and_k_is_bounded(qwen3, names):
    trie = compile_catalog(names, qwen3)
    for name in names:
        state = GrammarState(trie, 1)
        for token in qwen3.encode(name):
            assert state.advance(token) is None
        assert trie.names[state.advance(qwen3.default_stop)] == name
        assert state.done
    if len(names) < K_MAX:
        with pytest.raises(KTooLargeError):
            GrammarState(trie, len(names) + 1)


@pytest.mark.parametrize("seed", range(3))
def test_large_catalog_walks(qwen3, seed):
    rng = random.Random(seed)
    verbs, objects = ["get", "list", "create", "delete", "update"], ["user", "users", "order", "file", "event"]
    names = {
        f"svc{rng.randrange(60)}.{rng.choice(verbs)}_{rng.choice(objects)}{rng.randrange(30)}" for _ in range(2600)
    }
    names = sorted(names)[:2000]
    names += [n[: rng.randint(3, len(n))] for n in rng.sample(names, 100)]  # prefixes of other names
    names = list(dict.fromkeys(names))
    trie = compile_catalog(names, qwen3)
    seqs = _seqs(qwen3, names)
    for k in (1, 7, K_MAX):
        answer = random_walk(trie, seqs, k, rng, check_dead_ends=False)
        assert len(set(answer)) == k
    allowed = rng.sample(names, 50)
    assert set(random_walk(trie, seqs, 10, rng, allowed_names=allowed, check_dead_ends=False)) <= set(allowed)
