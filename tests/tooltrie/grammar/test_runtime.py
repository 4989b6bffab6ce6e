"""Runtime rules on hand-made cases (the oracle-based properties are in test_properties.py)."""

from __future__ import annotations

import pytest

from tooltrie.grammar import (
    EmptyMaskError,
    GrammarError,
    GrammarState,
    IllegalTokenError,
    InvalidStateError,
    KTooLargeError,
    compile_catalog,
)


@pytest.fixture(scope="module")
def trie(qwen3):
    return compile_catalog(["get_user", "get_user_by_id", "list_users"], qwen3)


def _spell(state, tok, name):
    for t in tok.encode(name):
        assert state.advance(t) is None


@pytest.mark.parametrize("first", ["get_user", "get_user_by_id"])
def test_prefix_name_then_its_extension(qwen3, first):
    trie = compile_catalog(["get_user_by_id", "get_user"], qwen3)
    other = "get_user_by_id" if first == "get_user" else "get_user"
    state = GrammarState(trie, 2)
    _spell(state, qwen3, first)
    assert trie.names[state.advance(qwen3.default_sep)] == first
    _spell(state, qwen3, "get_user")
    legal = state.legal_tokens().tolist()
    if first == "get_user":  # finished terminal: control edges gone, subtree still open
        assert qwen3.default_stop not in legal and qwen3.default_sep not in legal
        assert legal == [qwen3.encode("get_user_by_id")[2]]
    else:  # the prefix is the last owed name: STOP only, and the spent extension is dead
        assert legal == [qwen3.default_stop]
    if other != "get_user":
        _spell(state, qwen3, other[len("get_user") :])
    assert trie.names[state.advance(qwen3.default_stop)] == other
    assert state.done and [trie.names[p] for p in state.emitted] == [first, other]


def test_sep_and_stop_never_coexist(qwen3, trie):
    state = GrammarState(trie, 2)
    _spell(state, qwen3, "get_user")
    assert qwen3.default_sep in state.legal_tokens() and qwen3.default_stop not in state.legal_tokens()
    with pytest.raises(IllegalTokenError, match="control token"):
        state.copy().advance(qwen3.default_stop)
    state.advance(qwen3.default_sep)
    _spell(state, qwen3, "list_users")
    assert state.legal_tokens().tolist() == [qwen3.default_stop]
    with pytest.raises(IllegalTokenError):
        state.copy().advance(qwen3.default_sep)


def test_spent_names_are_not_offered_again(qwen3, trie):
    state = GrammarState(trie, 3)
    _spell(state, qwen3, "list_users")
    state.advance(qwen3.default_sep)
    assert qwen3.encode("list_users")[0] not in state.legal_tokens()
    with pytest.raises(IllegalTokenError, match="spent"):
        state.copy().advance(qwen3.encode("list_users")[0])


def test_off_edge_token_and_after_done(qwen3, trie):
    state = GrammarState(trie, 1)
    with pytest.raises(IllegalTokenError, match="not an edge"):
        state.advance(qwen3.encode("zzz")[0])
    _spell(state, qwen3, "list_users")
    state.advance(qwen3.default_stop)
    with pytest.raises(GrammarError, match="done"):
        state.legal_tokens()
    with pytest.raises(IllegalTokenError):
        state.advance(qwen3.default_stop)


def test_k_bounds(trie):
    with pytest.raises(KTooLargeError, match="at most 3"):
        GrammarState(trie, 4)
    with pytest.raises(InvalidStateError):
        GrammarState(trie, 0)
    with pytest.raises(InvalidStateError):
        GrammarState(trie, 17)
    with pytest.raises(KTooLargeError, match="2 allowed"):
        GrammarState(trie, 3, allowed=[0, 2])
    with pytest.raises(InvalidStateError, match="allowed pointer ids"):
        GrammarState(trie, 1, allowed=[5])


def test_allowed_set_narrows(qwen3, trie):
    state = GrammarState(trie, 1, allowed=[trie.pointer_of["get_user_by_id"]])
    assert state.legal_tokens().tolist() == [qwen3.encode("get_user")[0]]
    _spell(state, qwen3, "get_user")
    assert qwen3.default_stop not in state.legal_tokens()  # get_user is not allowed
    _spell(state, qwen3, "_by_id")
    assert trie.names[state.advance(qwen3.default_stop)] == "get_user_by_id"


def test_empty_mask_is_loud(trie):
    state = GrammarState(trie, 3)
    for pointer in range(3):  # corrupt the state: everything spent although one is still owed
        state._spend(pointer)
    state.owed = 1
    with pytest.raises(EmptyMaskError):
        state.legal_tokens()


def test_legal_tokens_are_read_only(trie):
    legal = GrammarState(trie, 1).legal_tokens()
    assert legal.dtype.name == "int32" and not legal.flags.writeable


def test_forced_tail_is_the_rest_of_the_answer_only_when_every_step_is_forced(qwen3, trie):
    state = GrammarState(trie, 1)
    assert state.forced_tail() is None  # the root offers several first tokens
    first = qwen3.encode("list_users")[0]
    state.advance(first)
    tail = state.forced_tail()
    assert tail == [*qwen3.encode("list_users")[1:], qwen3.default_stop]
    assert state.node != 0 and not state.done  # the probe walked a copy
    for token in tail:
        assert state.legal_tokens().tolist() == [token]
        state.advance(token)
    assert state.done and state.forced_tail() is None


def test_forced_tail_stops_at_a_choice_and_follows_a_forced_root(qwen3, trie):
    state = GrammarState(trie, 2)
    _spell(state, qwen3, "list_users")
    assert state.forced_tail() is None  # SEP, then a free choice between the get_ names
    pointer_of = trie.pointer_of
    narrowed = GrammarState(trie, 2, allowed=[pointer_of["list_users"], pointer_of["get_user_by_id"]])
    _spell(narrowed, qwen3, "list_users")
    # two allowed names and k = 2: after the first, the second is the only one left, its first token included
    assert narrowed.forced_tail() == [
        qwen3.default_sep,
        *qwen3.encode("get_user_by_id"),
        qwen3.default_stop,
    ]


def test_forced_chain_is_the_forced_tokens_up_to_a_limit_or_a_choice(qwen3, trie):
    state = GrammarState(trie, 2)
    assert state.forced_chain(4) == []  # the root offers several first tokens
    spelled = qwen3.encode("list_users")
    state.advance(spelled[0])
    # SEP, then the root's only live edge and the get_ names' shared tokens, then STOP or "_by_id"
    rest = [*spelled[1:], qwen3.default_sep, *qwen3.encode("get_user")]
    assert state.forced_chain(len(rest) + 5) == rest
    assert state.forced_chain(1) == rest[:1]
    assert state.forced_tail() is None and state.node != 0  # walks on a copy
