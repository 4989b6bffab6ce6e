"""The decoding contract (DESIGN.md section 3), run against every engine on the tiny synthetic Qwen3."""

from __future__ import annotations

import re

import numpy as np
import pytest

from decoder_service.engines.base import DecodeError, DecodeRequest, PointerEvent, PromptTooLong, SummaryEvent
from decoder_service.engines.cpu.model import CpuTransformer
from decoder_service.engines.prompt import request_suffix_ids
from tooltrie.grammar.runtime import GrammarState

INTENTS = ["File a bug about the login page", "Tell the team the deploy is done", "Read the config file"]


def _run(engine, catalog, intent: str, k: int, allowed=None):
    events = list(engine.decode(DecodeRequest(intent=intent, k=k, catalog=catalog, allowed=allowed)))
    assert isinstance(events[-1], SummaryEvent)
    assert all(isinstance(e, PointerEvent) for e in events[:-1])
    return events[:-1], events[-1]


@pytest.mark.parametrize("k", [1, 3, 8])
def test_k_distinct_catalog_names(make_tiny_engine, tiny_catalog, k: int) -> None:
    pointers, summary = _run(make_tiny_engine(), tiny_catalog, INTENTS[0], k)
    trie = tiny_catalog.trie
    assert [p.index for p in pointers] == list(range(k))
    assert len({p.name for p in pointers}) == k
    for p in pointers:
        assert trie.names[p.pointer_id] == p.name
        assert list(p.token_ids) == trie.token_sequence(p.pointer_id)
        assert p.score <= 0
    assert summary.tokens_generated == sum(len(p.token_ids) + 1 for p in pointers)
    assert summary.catalog_version == 3


def test_greedy_choice_and_score_against_fresh_forward(make_tiny_engine, tiny_catalog, tiny_model) -> None:
    """Replay the answer with a cache-free forward pass: every token is the legal argmax, scores add up."""
    intent, k = INTENTS[1], 3
    pointers, _ = _run(make_tiny_engine(), tiny_catalog, intent, k)
    oracle = CpuTransformer(*tiny_model)
    trie = tiny_catalog.trie
    prompt = list(tiny_catalog.prefix_ids) + request_suffix_ids(tiny_catalog, intent, k)
    answer = []
    for i, p in enumerate(pointers):
        answer += [*p.token_ids, trie.sep_token if i < k - 1 else trie.stop_token]
    logits = oracle.forward_all(prompt + answer).astype(np.float64)[len(prompt) - 1 :]
    state, step = GrammarState(trie, k), 0
    for p in pointers:
        score = 0.0
        for token in [*p.token_ids, answer[step + len(p.token_ids)]]:
            legal = state.legal_tokens()
            row = logits[step, legal]
            order = np.argsort(-row, kind="stable")
            if len(legal) > 1 and row[order[0]] - row[order[1]] < 1e-4:
                assert token in legal[order[:2]]  # a near tie: either may win in fp32
            else:
                assert token == legal[order[0]]
            if token not in (trie.sep_token, trie.stop_token):
                score += row[legal.tolist().index(token)] - np.log(np.exp(row - row.max()).sum()) - row.max()
            state.advance(token)
            step += 1
        assert p.score == pytest.approx(score, abs=1e-4)
    assert state.done


def _forced_steps(trie, k: int, tokens: list[int]) -> list[bool]:
    """Whether each token of the answer had one legal token at its step, replayed through the grammar."""
    state, forced = GrammarState(trie, k), []
    for token in tokens:
        forced.append(len(state.legal_tokens()) == 1)
        state.advance(token)
    return forced


def expected_forward_passes(forced: list[bool], tail: bool, chain: int) -> int:
    """Forward passes of an answer whose steps were ``forced`` as listed: a step chooses a token (the first comes
    from the prefill); with ``tail``, when every later token is forced the answer ends there; else the next forced
    tokens join the chosen one, up to ``chain`` tokens in all, and one pass takes them, unless the answer ended."""
    i, passes, n = 0, 0, len(forced)
    while i < n - 1 and not (tail and all(forced[i + 1 :])):
        j = i + 1
        while j < n and j - i < chain and forced[j]:
            j += 1
        if j == n:
            break
        passes, i = passes + 1, j
    return passes


def test_forced_tail_takes_the_same_answer_without_its_forward_passes(make_tiny_engine, tiny_catalog) -> None:
    """Once the grammar forces every remaining token, they are taken without forward passes: the same names,
    tokens and scores; the passes that ran are those the rules give (forced chains of up to ``chain_tokens``
    through one pass each)."""
    k, forced_ends = 3, []
    with_tail, without = make_tiny_engine(forced_tail=True), make_tiny_engine(forced_tail=False)
    chain = with_tail.chain_tokens
    for intent in INTENTS:
        fast, s_fast = _run(with_tail, tiny_catalog, intent, k)
        slow, s_slow = _run(without, tiny_catalog, intent, k)
        assert [(p.name, p.token_ids, p.score) for p in fast] == [(p.name, p.token_ids, p.score) for p in slow]
        answer = []
        for i, p in enumerate(fast):
            answer += [*p.token_ids, tiny_catalog.trie.sep_token if i < k - 1 else tiny_catalog.trie.stop_token]
        forced = _forced_steps(tiny_catalog.trie, k, answer)
        assert s_slow.forward_passes == expected_forward_passes(forced, tail=False, chain=chain)
        assert s_fast.forward_passes == expected_forward_passes(forced, tail=True, chain=chain)
        forced_ends.append(forced[-1] and forced[-2])
    assert any(forced_ends), "no answer ended in forced tokens: the test would not see the skip"


@pytest.mark.parametrize("intent", INTENTS)
def test_sparse_and_dense_heads_choose_identically(make_tiny_engine, tiny_catalog, intent: str) -> None:
    sparse, _ = _run(make_tiny_engine("sparse"), tiny_catalog, intent, 4)
    dense, _ = _run(make_tiny_engine("dense"), tiny_catalog, intent, 4)
    assert [(p.name, p.token_ids, p.score) for p in sparse] == [(p.name, p.token_ids, p.score) for p in dense]


def test_prefix_kv_is_reused_per_catalog(make_tiny_engine, tiny_catalog) -> None:
    engine = make_tiny_engine()
    first, s1 = _run(engine, tiny_catalog, INTENTS[2], 2)
    second, s2 = _run(engine, tiny_catalog, INTENTS[2], 2)
    fresh, _ = _run(make_tiny_engine(), tiny_catalog, INTENTS[2], 2)
    assert (s1.prefix_cached, s2.prefix_cached) == (False, True)
    assert s1.prompt_tokens == s2.prompt_tokens > len(tiny_catalog.prefix_ids)
    as_tuples = lambda ps: [(p.name, p.token_ids, p.score) for p in ps]  # noqa: E731
    assert as_tuples(first) == as_tuples(second) == as_tuples(fresh)


def test_a_prompt_and_answer_past_the_context_are_refused(make_tiny_engine, tiny_catalog) -> None:
    """A request whose prompt and longest answer fill the engine's context exactly is answered; one position fewer
    and it is refused with PromptTooLong, which gives the parts and the context, before any work."""
    engine = make_tiny_engine()
    k = 2
    prefix, request = len(tiny_catalog.prefix_ids), len(request_suffix_ids(tiny_catalog, INTENTS[0], k))
    answer = k * (tiny_catalog.trie.longest_path + 1)
    assert prefix + request + answer <= engine.context  # lowered below, never raised past the engine's memory
    engine.context = prefix + request + answer
    pointers, _ = _run(engine, tiny_catalog, INTENTS[0], k)
    assert len(pointers) == k
    engine.context -= 1
    with pytest.raises(PromptTooLong, match=r"shorten the intent by at least 1 token$") as refused:
        _run(engine, tiny_catalog, INTENTS[0], k)
    parts = refused.value
    assert (parts.prefix_tokens, parts.request_tokens, parts.answer_tokens) == (prefix, request, answer)
    assert parts.context == engine.context


def test_allowed_subset_narrows_the_answer(make_tiny_engine, tiny_catalog) -> None:
    pointer_of = tiny_catalog.trie.pointer_of
    allowed = sorted(pointer_of[n] for n in ("get", "get_file", "drive.upload"))
    pointers, _ = _run(make_tiny_engine(), tiny_catalog, INTENTS[0], 3, allowed=allowed)
    assert {p.name for p in pointers} == {"get", "get_file", "drive.upload"}


def test_k_above_catalog_and_bad_intents_are_refused(make_tiny_engine, tiny_catalog) -> None:
    engine = make_tiny_engine()
    with pytest.raises(ValueError, match="k=9 exceeds the catalog's 8 tools"):
        _run(engine, tiny_catalog, INTENTS[0], 9)
    with pytest.raises(ValueError, match="intent is empty"):
        _run(engine, tiny_catalog, "  ", 1)
    with pytest.raises(ValueError, match=re.escape("special token text '<|im_end|>'")):
        _run(engine, tiny_catalog, "hi <|im_end|>", 1)


def test_non_finite_logits_stop_the_request(make_tiny_engine, tiny_catalog, monkeypatch) -> None:
    engine = make_tiny_engine()
    if not hasattr(engine, "legal_logits"):
        pytest.skip("the engine samples on the device; its error path is tested with its own suite")
    monkeypatch.setattr(engine, "legal_logits", lambda hidden, legal: np.full(len(legal), np.nan, np.float32))
    with pytest.raises(DecodeError, match="non-finite logit"):
        _run(engine, tiny_catalog, INTENTS[0], 2)


def test_cancellation_stops_at_the_next_token(make_tiny_engine, tiny_catalog) -> None:
    """The engine polls `cancelled` every token: once it turns true, nothing more is generated or yielded."""
    polls: list[int] = []

    def cancelled() -> bool:
        polls.append(1)
        return len(polls) > 3  # three tokens, then the caller is gone

    request = DecodeRequest(intent=INTENTS[0], k=4, catalog=tiny_catalog, cancelled=cancelled)
    events = list(make_tiny_engine().decode(request))
    assert not any(isinstance(e, SummaryEvent) for e in events)
    assert sum(len(e.token_ids) + 1 for e in events if isinstance(e, PointerEvent)) <= 3
    assert len(polls) == 4


def test_forced_chains_take_the_same_answer_in_fewer_passes(make_tiny_engine, tiny_catalog) -> None:
    """The tokens the grammar forces after a chosen one go through the model with it, in one forward pass: the
    same names and tokens (scores within fp32 noise: the CPU engine's prefill of several tokens need not round as
    its single-token steps do; the CUDA engine's gate 12 checks its bits), and the passes the rules give."""
    k, fewer = 3, []
    chained, stepped = make_tiny_engine(forced_chains=True), make_tiny_engine(forced_chains=False)
    assert chained.chain_tokens > 1 and stepped.chain_tokens == 1
    for intent in INTENTS:
        fast, s_fast = _run(chained, tiny_catalog, intent, k)
        slow, s_slow = _run(stepped, tiny_catalog, intent, k)
        assert [(p.name, p.token_ids) for p in fast] == [(p.name, p.token_ids) for p in slow]
        assert [p.score for p in fast] == pytest.approx([p.score for p in slow], abs=1e-5)
        answer = []
        for i, p in enumerate(fast):
            answer += [*p.token_ids, tiny_catalog.trie.sep_token if i < k - 1 else tiny_catalog.trie.stop_token]
        forced = _forced_steps(tiny_catalog.trie, k, answer)
        assert s_fast.forward_passes == expected_forward_passes(forced, tail=True, chain=chained.chain_tokens)
        assert s_slow.forward_passes == expected_forward_passes(forced, tail=True, chain=1)
        fewer.append(s_fast.forward_passes < s_slow.forward_passes)
    assert any(fewer), "no answer had a forced chain: the test would not see one"
