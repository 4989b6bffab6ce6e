"""The interface every engine implements (CPU reference, CUDA serial, CUDA batched), defined once.

``Engine.decode(request)`` yields one ``PointerEvent`` per completed pointer, the moment the SEP or STOP
token that closes it is taken, then one ``SummaryEvent``. Every engine follows the same contract:

- Greedy: the next token is the argmax of the logits over the grammar's legal tokens only, ties to the lower
  token id. An empty mask, a non-finite logit or a token the grammar refuses stops the request with an error.
- A pointer's ``token_ids`` are the tokens of its name (the closing SEP/STOP excluded); its ``score`` is the
  sum, over those tokens, of ``logit - logsumexp(legal logits)`` at the step that chose the token (each term in
  fp32, the sum in float64, in token order).
- The catalog prompt prefix (everything before the user's intent) is the same for every request of a catalog
  version; engines prefill it once per ``PreparedCatalog.cache_key`` and reuse its KV.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from decoder_service.engines.catalog import PreparedCatalog

Head = Literal["sparse", "dense"]
HEADS: tuple[str, ...] = ("sparse", "dense")
#: The most tokens one forward pass takes: a chosen token and the tokens the grammar forces after it (a forced chain).
CHAIN_TOKENS = 4


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    intent: str
    k: int
    catalog: PreparedCatalog
    #: Optional narrowing: the pointer ids this request may name (None: the whole catalog).
    allowed: Sequence[int] | None = None
    #: Polled once per token: True stops decoding at once (the caller cancelled or its deadline passed).
    cancelled: Callable[[], bool] = field(default=lambda: False, compare=False)


@dataclass(frozen=True, slots=True)
class PointerEvent:
    index: int  # 0-based position in the answer
    pointer_id: int  # id in the catalog's compiled trie
    name: str
    token_ids: tuple[int, ...]
    score: float
    seconds: float  # wall time from the previous pointer (or the end of prefill) to this one
    steps: int  # tokens generated for it, the closing SEP/STOP included


@dataclass(frozen=True, slots=True)
class SummaryEvent:
    tokens_generated: int
    #: Forward passes of the decode loop (the prefill's not counted): one per generated token but the last and the
    #: forced tail (the tokens after which the grammar leaves one legal token at every step to the end), a forced
    #: chain (a chosen token and the tokens forced after it) sharing one.
    forward_passes: int
    prompt_tokens: int  # prefix + request suffix
    prefix_cached: bool  # whether the catalog prefix's KV was reused
    prefill_seconds: float
    decode_seconds: float
    catalog_version: int


Event = PointerEvent | SummaryEvent


class DecodeError(RuntimeError):
    """The model or the grammar left no valid continuation; the request fails instead of answering wrongly."""


class EngineFailed(DecodeError):
    """The engine can serve no request any more (its GPU context failed); the decoder stops taking requests."""


class EngineOutOfMemory(DecodeError):
    """The engine's device had no memory left for what this request needed; it may succeed later or elsewhere."""


class PromptTooLong(ValueError):
    """A request's prompt and its longest possible answer exceed the positions the engine holds."""

    def __init__(self, prefix_tokens: int, request_tokens: int, answer_tokens: int, context: int) -> None:
        self.prefix_tokens, self.request_tokens = prefix_tokens, request_tokens
        self.answer_tokens, self.context = answer_tokens, context
        excess = prefix_tokens + request_tokens + answer_tokens - context
        super().__init__(
            f"the prompt is {prefix_tokens + request_tokens} tokens ({prefix_tokens} of the catalog's prompt, "
            f"{request_tokens} of the request) and its answer may take {answer_tokens} more, {excess} over the "
            f"engine's context of {context} positions; shorten the intent by at least {excess} token"
            + ("s" if excess > 1 else "")
        )


def check_context(prefix_tokens: int, request_tokens: int, answer_tokens: int, context: int) -> None:
    """PromptTooLong unless the prompt and the longest answer fit ``context`` positions."""
    if prefix_tokens + request_tokens + answer_tokens > context:
        raise PromptTooLong(prefix_tokens, request_tokens, answer_tokens, context)


def longest_answer(trie_longest_path: int, k: int) -> int:
    """The most tokens an answer of k names can take: each name's tokens and the SEP or STOP after it."""
    return k * (trie_longest_path + 1)


class Engine(ABC):
    """Runs constrained decoding for one model. ``context``: the positions a request may take, its prompt and its
    longest possible answer together; a request past it is refused with PromptTooLong before any work.
    ``failure``: why the engine can serve no more requests, once it cannot (each then raises EngineFailed)."""

    name: str
    context: int
    failure: str | None = None

    @abstractmethod
    def decode(self, request: DecodeRequest) -> Iterator[Event]:
        """Yield each pointer as it completes, then a summary."""
