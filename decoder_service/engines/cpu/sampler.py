"""Greedy choice over the legal tokens and the log-softmax score of the choice, as every engine computes them."""

from __future__ import annotations

import numpy as np


def greedy_pick(legal: np.ndarray, logits: np.ndarray) -> tuple[int, float]:
    """(token, log-softmax of its logit over ``logits``): argmax, ties to the lower id (``legal`` is sorted).

    Raises ValueError on an empty mask or a non-finite logit: the decoder stops rather than guess.
    """
    if len(legal) == 0:
        raise ValueError("the grammar left no legal token")
    if not np.isfinite(logits).all():
        bad = int(legal[int(np.argmin(np.isfinite(logits)))])
        raise ValueError(f"the model produced a non-finite logit for legal token {bad}")
    best = int(np.argmax(logits))  # first maximum: the lowest token id among ties
    top = logits[best]
    log_z = top + np.log(np.sum(np.exp(logits - top), dtype=np.float32))
    return int(legal[best]), float(top - log_z)
