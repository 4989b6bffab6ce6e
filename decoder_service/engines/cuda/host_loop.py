"""Unconstrained greedy decoding driven from the host: prefill, then one launch list per token, reading
each argmax back to decide whether to stop. The dense head scores the whole vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from decoder_service.engines.cuda.forward import CudaModel


@dataclass(slots=True)
class GreedyResult:
    tokens: list[int]  # generated ids, the stop token included when one was hit
    logits: list[np.ndarray] = field(default_factory=list)  # per generated token, when asked for


def greedy_decode(
    model: CudaModel,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_tokens: Sequence[int] = (),
    keep_logits: bool = False,
) -> GreedyResult:
    """Greedy continuation of ``prompt`` (ties to the lower id) on a fresh sequence."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    model.reset()
    model.prefill(prompt)
    stops = set(stop_tokens)
    result = GreedyResult(tokens=[])
    while True:
        if keep_logits:
            result.logits.append(model.read_logits())
        token = model.read_token()
        result.tokens.append(token)
        if token in stops or len(result.tokens) >= max_new_tokens:
            return result
        model.decode()  # input is the argmax already in device memory
