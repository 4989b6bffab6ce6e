"""The per-tokenizer vocabulary matcher of character-level mode: a byte trie of every content token.

    matcher = MatcherCache().get(tokenizer)     # built once per tokenizer fingerprint
    child = matcher.step(states, next_bytes)    # vectorised transitions, -1 where no token continues

Content tokens are every id with a non-empty byte string that is not a special/added token (`<|im_end|>`
and friends are control tokens, never name text). Their byte strings form a trie whose nodes are numbered
breadth first: level by level, and within a level by (parent, byte). That order makes the transition keys
`parent * 256 + byte` globally sorted without a sort, and puts the shallow nodes, which most look-ups hit,
first: transitions out of the first `dense_parents` nodes are a dense table, deeper ones a binary search.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from tooltrie.grammar.tokenizers.base import Tokenizer

# Dense rows, breadth first: the root, every one- and two-byte token prefix (about 5,500 in Qwen3) and the
# first three-byte ones, at most 16,641 x 256 int32 (17 MB); they answer most of a compile's look-ups.
_DENSE_PARENTS_MAX = 1 + 256 + 16384


@dataclass(eq=False)
class VocabularyMatcher:
    """Byte trie of a tokenizer's content tokens (module docstring). Node 0 is the root."""

    fingerprint: str
    vocab_size: int
    #: Sorted transition keys `parent * 256 + byte` and the child node of each.
    keys: np.ndarray
    children: np.ndarray
    #: Token id ending at each node, or -1; the lowest id where several tokens share one byte string.
    node_token: np.ndarray
    #: The other ids of shared byte strings (e.g. byte-fallback tokens): sorted nodes, one entry per extra id.
    dup_node: np.ndarray
    dup_token: np.ndarray
    #: Children of nodes `0 .. dense_parents-1` as a `[dense_parents, 256]` table (-1: none).
    dense: np.ndarray
    #: Ids of the special/added tokens, which never spell name text.
    control_tokens: frozenset[int]

    @property
    def n_nodes(self) -> int:
        return len(self.node_token)

    @property
    def dense_parents(self) -> int:
        return self.dense.shape[0]

    def step(self, states: np.ndarray, next_bytes: np.ndarray) -> np.ndarray:
        """The node reached from each of `states` by the matching byte of `next_bytes`, or -1."""
        flat = self.dense.reshape(-1)
        if len(states) == 0 or int(states.max()) < self.dense_parents:  # the common case: one gather
            return flat[states * 256 + next_bytes]
        out = np.empty(len(states), dtype=np.int32)
        shallow = states < self.dense_parents
        out[shallow] = flat[states[shallow] * 256 + next_bytes[shallow]]
        deep = ~shallow
        if deep.any():
            key = states[deep].astype(np.int64) * 256 + next_bytes[deep]
            at = np.searchsorted(self.keys, key)
            at[at == len(self.keys)] = 0  # past the end: cannot match, and the compare below rejects it
            out[deep] = np.where(self.keys[at] == key, self.children[at], -1)
        return out

    def duplicates(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For token-ending `states`: (index into `states`, other token id) of every extra id sharing the bytes."""
        if len(self.dup_node) == 0 or len(states) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
        lo = np.searchsorted(self.dup_node, states, side="left")
        count = np.searchsorted(self.dup_node, states, side="right") - lo
        which = np.repeat(np.arange(len(states)), count)
        at = np.repeat(lo - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
        return which, self.dup_token[at]

    def token_of(self, data: bytes) -> int:
        """Token id whose bytes are exactly `data`, or -1 (for tests and tools)."""
        node = 0
        for b in data:
            node = int(self.step(np.array([node], dtype=np.int32), np.array([b], dtype=np.int32))[0])
            if node < 0:
                return -1
        return int(self.node_token[node])


def content_tokens(tokenizer: Tokenizer) -> tuple[list[int], list[bytes], frozenset[int]]:
    """Ids and byte strings of the tokens that may spell name text, and the control (special) ids."""
    control = frozenset(tokenizer.special_tokens.values())
    ids, data = [], []
    for i, b in enumerate(tokenizer.token_bytes()):
        if b and i not in control:
            ids.append(i)
            data.append(b)
    return ids, data, control


def build(tokenizer: Tokenizer) -> VocabularyMatcher:
    """The matcher of `tokenizer`, level by level (each level one `np.unique` over the tokens that long)."""
    ids, data, control = content_tokens(tokenizer)
    lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
    flat = np.frombuffer(b"".join(data), dtype=np.uint8).astype(np.int64)
    offsets = np.cumsum(lengths) - lengths
    token_ids = np.asarray(ids, dtype=np.int64)

    node_of = np.zeros(len(data), dtype=np.int64)  # each token's node at the current level (root at level 0)
    key_parts, child_parts, token_parts = [], [], []
    next_id = 1
    order = np.argsort(-lengths, kind="stable")  # tokens still alive at level L are a prefix of this order
    alive_counts = np.searchsorted(-lengths[order], -np.arange(1, int(lengths.max()) + 1), side="right")
    for level, alive in enumerate(alive_counts.tolist(), start=1):
        rows = order[:alive]
        key = node_of[rows] * 256 + flat[offsets[rows] + level - 1]
        level_keys, inverse = np.unique(key, return_inverse=True)
        node_of[rows] = next_id + inverse
        key_parts.append(level_keys)
        child_parts.append(np.arange(next_id, next_id + len(level_keys), dtype=np.int64))
        ends = rows[lengths[rows] == level]
        token_parts.append((node_of[ends], token_ids[ends]))
        next_id += len(level_keys)

    end_node = np.concatenate([nodes for nodes, _ in token_parts])
    end_token = np.concatenate([toks for _, toks in token_parts])
    by_node = np.lexsort((end_token, end_node))
    end_node, end_token = end_node[by_node], end_token[by_node]
    primary = np.ones(len(end_node), dtype=bool)
    primary[1:] = end_node[1:] != end_node[:-1]
    node_token = np.full(next_id, -1, dtype=np.int32)
    node_token[end_node[primary]] = end_token[primary]
    keys = np.concatenate(key_parts)
    children = np.concatenate(child_parts).astype(np.int32)
    dense_parents = min(_DENSE_PARENTS_MAX, next_id)
    dense = np.full((dense_parents, 256), -1, dtype=np.int32)
    in_dense = keys < dense_parents * 256
    dense.reshape(-1)[keys[in_dense]] = children[in_dense]
    return VocabularyMatcher(
        fingerprint=tokenizer.fingerprint,
        vocab_size=tokenizer.vocab_size,
        keys=keys,
        children=children,
        node_token=node_token,
        dup_node=end_node[~primary].astype(np.int32),
        dup_token=end_token[~primary].astype(np.int32),
        dense=dense,
        control_tokens=control,
    )


class MatcherCache:
    """Vocabulary matchers by tokenizer fingerprint, built on first use (thread-safe; a few tokenizers at most)."""

    def __init__(self) -> None:
        self._matchers: dict[str, VocabularyMatcher] = {}
        self._lock = threading.Lock()

    def get(self, tokenizer: Tokenizer) -> VocabularyMatcher:
        fp = tokenizer.fingerprint
        matcher = self._matchers.get(fp)
        if matcher is None:
            with self._lock:
                matcher = self._matchers.get(fp)
                if matcher is None:
                    matcher = self._matchers[fp] = build(tokenizer)
        return matcher

    def __contains__(self, tokenizer: Tokenizer) -> bool:
        return tokenizer.fingerprint in self._matchers

    def __len__(self) -> int:
        return len(self._matchers)
