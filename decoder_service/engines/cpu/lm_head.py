"""Output heads: dense (every vocabulary row) and sparse (only the legal rows), bit-identical on shared rows.

Both compute logits in fixed blocks of ``BLOCK`` rows with the same matmul call on the same block shape, so a
row's dot product takes the same path whether it sits in the full table or among a handful of gathered rows;
a greedy argmax therefore decides identically under either head.
"""

from __future__ import annotations

import numpy as np

BLOCK = 64


class LMHead:
    """The output projection [vocab, hidden], stored as blocks of BLOCK rows (zero-padded at the end)."""

    def __init__(self, weight: np.ndarray) -> None:
        self.vocab_size, self.hidden_size = weight.shape
        padded = -self.vocab_size % BLOCK
        if padded:
            weight = np.concatenate([weight, np.zeros((padded, self.hidden_size), dtype=np.float32)])
        self.blocks = np.ascontiguousarray(weight, dtype=np.float32).reshape(-1, BLOCK, self.hidden_size)

    def dense(self, hidden: np.ndarray) -> np.ndarray:
        """Logits of every token id, shape [vocab]."""
        return (self.blocks @ hidden).reshape(-1)[: self.vocab_size]

    def sparse(self, hidden: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
        """Logits of ``token_ids`` only, in the order given; equal bit for bit to ``dense(hidden)[token_ids]``."""
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got {ids.min()}..{ids.max()}")
        rows = self.blocks.reshape(-1, self.hidden_size)[ids]
        padded = -len(ids) % BLOCK
        if padded or not len(ids):
            rows = np.concatenate([rows, np.zeros((padded or BLOCK, self.hidden_size), dtype=np.float32)])
        return (rows.reshape(-1, BLOCK, self.hidden_size) @ hidden).reshape(-1)[: len(ids)]
