"""The CPU engine: constrained greedy decoding over the numpy transformer, with a prefix KV cache per catalog."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from decoder_service.engines.base import (
    CHAIN_TOKENS,
    HEADS,
    DecodeError,
    DecodeRequest,
    Engine,
    Event,
    PointerEvent,
    SummaryEvent,
    check_context,
    longest_answer,
)
from decoder_service.engines.cpu.kv_cache import KVCache
from decoder_service.engines.cpu.model import CpuTransformer
from decoder_service.engines.cpu.sampler import greedy_pick
from decoder_service.engines.env import forced_chains_default, forced_tail_default
from decoder_service.engines.prompt import request_suffix_ids
from tooltrie.grammar.errors import GrammarError
from tooltrie.grammar.runtime import GrammarState


class CpuEngine(Engine):
    """Serial decoding in numpy fp32. ``head``: 'sparse' (legal rows only) or 'dense' (all rows, then gather).
    ``forced_tail``: once the grammar leaves one legal token at every remaining step, take them all without
    forward passes (the same answer and scores; ``SummaryEvent.forward_passes`` counts what ran). Default
    $TOOLTRIE_FORCED_TAIL, else on. ``forced_chains``: the tokens the grammar forces after a chosen one (up to
    CHAIN_TOKENS in all) are taken at once and run through the model as one prefill of several tokens, as the CUDA
    engine does; the hidden states are the prefill's, which may round differently from single-token steps (the same
    decisions but at fp32 near-ties). Default $TOOLTRIE_FORCED_CHAINS, else on."""

    name = "cpu"

    def __init__(
        self,
        model: CpuTransformer,
        head: str = "sparse",
        prefix_cache_entries: int = 4,
        forced_tail: bool | None = None,
        forced_chains: bool | None = None,
        max_context: int | None = None,
    ) -> None:
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; accepted: {', '.join(HEADS)}")
        self.model = model
        # the positions a request may fill: the model's trained context, or fewer where asked
        self.context = model.config.max_position_embeddings if max_context is None else max_context
        self.head = head
        self.forced_tail = forced_tail_default() if forced_tail is None else forced_tail
        self.forced_chains = forced_chains_default() if forced_chains is None else forced_chains
        self._prefixes: OrderedDict[str, KVCache] = OrderedDict()
        self._prefix_entries = prefix_cache_entries

    @property
    def chain_tokens(self) -> int:
        """The most tokens one forward pass takes."""
        return CHAIN_TOKENS if self.forced_chains else 1

    def legal_logits(self, hidden: np.ndarray, legal: np.ndarray) -> np.ndarray:
        if self.head == "sparse":
            return self.model.logits_for(hidden, legal)
        return self.model.logits(hidden)[legal]

    def decode(self, request: DecodeRequest) -> Iterator[Event]:
        catalog, trie = request.catalog, request.catalog.trie
        state = GrammarState(trie, request.k, allowed=request.allowed)  # KTooLargeError etc. are ValueErrors
        suffix = request_suffix_ids(catalog, request.intent, request.k)
        answer = longest_answer(trie.longest_path, request.k)
        check_context(len(catalog.prefix_ids), len(suffix), answer, self.context)
        t0 = time.perf_counter()
        prefix, cached = self._prefix(catalog.cache_key, catalog.prefix_ids)
        cache = prefix.fork(len(suffix) + answer)
        hidden = self.model.prefill(suffix, cache)
        prefill_seconds = time.perf_counter() - t0

        generated, forwards, tokens, score, step_start = 0, 0, [], 0.0, time.perf_counter()
        decode_start = step_start
        queued: list[int] = []  # tokens the grammar forces, taken without logits (their log-softmax is 0)
        fed: list[int] = []  # tokens taken since the last forward pass, which the next one runs
        while not state.done:
            if request.cancelled():
                return  # no summary: the caller is gone
            try:
                if queued:
                    token, logprob = queued.pop(0), 0.0
                else:
                    legal = state.legal_tokens()
                    token, logprob = greedy_pick(legal, self.legal_logits(hidden, legal))
                pointer = state.advance(token)
            except (GrammarError, ValueError) as exc:
                raise DecodeError(f"decoding stopped after {generated} tokens: {exc}") from exc
            generated += 1
            fed.append(token)
            if pointer is None:
                tokens.append(token)
                score += logprob
            else:  # published before the next forward pass, as soon as it is known
                now = time.perf_counter()
                yield PointerEvent(
                    index=len(state.emitted) - 1,
                    pointer_id=pointer,
                    name=trie.names[pointer],
                    token_ids=tuple(tokens),
                    score=score,
                    seconds=now - step_start,
                    steps=len(tokens) + 1,
                )
                tokens, score, step_start = [], 0.0, now
            if state.done or queued:
                continue
            if len(fed) == 1:  # a chosen token: what the grammar forces next joins it, or ends the answer
                forced, ends = state.forced_run()
                queued = forced if ends and self.forced_tail else forced[: self.chain_tokens - 1]
                if queued:
                    continue
            hidden = self.model.decode(fed[0], cache) if len(fed) == 1 else self.model.prefill(fed, cache)
            forwards += 1
            fed = []
        yield SummaryEvent(
            tokens_generated=generated,
            forward_passes=forwards,
            prompt_tokens=len(catalog.prefix_ids) + len(suffix),
            prefix_cached=cached,
            prefill_seconds=prefill_seconds,
            decode_seconds=time.perf_counter() - decode_start,
            catalog_version=catalog.version,
        )

    def _prefix(self, key: str, prefix_ids: tuple[int, ...]) -> tuple[KVCache, bool]:
        """The catalog prefix's KV, prefilled on first use and kept for the most recent catalogs."""
        cache = self._prefixes.get(key)
        if cache is not None:
            self._prefixes.move_to_end(key)
            return cache, True
        cache = self.model.new_cache(len(prefix_ids))
        if prefix_ids:
            self.model.prefill(list(prefix_ids), cache)
        self._prefixes[key] = cache
        while len(self._prefixes) > self._prefix_entries:
            self._prefixes.popitem(last=False)
        return cache, False
