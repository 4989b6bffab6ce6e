"""The character (byte) trie of a catalog's names, the skeleton of character-level mode.

Names are UTF-8 encoded and sorted bytewise (a name before its extensions); sorted row i is pointer i. The
build is the token-trie compiler's, over bytes: rows padded into a matrix, nodes read off the longest
common prefixes of neighbouring rows, numbered in depth-first preorder with children in byte order. So the
pointers below any node are the contiguous range `[lo, hi)`, and the character trie's preorder is the
lexicographic order of the names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tooltrie.grammar.errors import CompileError


@dataclass(eq=False)
class CharTrie:
    """Byte trie of names. Node 0 is the root; `parent`, `byte`, `depth` are per node (root: 0, -1, 0)."""

    names: tuple[str, ...]  # pointer order (bytewise sorted)
    parent: np.ndarray
    byte: np.ndarray
    depth: np.ndarray
    #: Pointers below each node (the node's string is a prefix of exactly these names).
    lo: np.ndarray
    hi: np.ndarray
    #: Pointer ending at each node, or -1; and each pointer's node.
    terminal: np.ndarray
    terminal_node: np.ndarray
    #: Children of node v are `children[child_start[v]:child_start[v+1]]`, in byte order.
    child_start: np.ndarray
    children: np.ndarray

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    @property
    def out_degree(self) -> np.ndarray:
        return np.diff(self.child_start)


def check_names(names: Sequence[str]) -> list[bytes]:
    """UTF-8 bytes of the names; `CompileError` for an empty catalog, an empty name or a duplicate."""
    if len(names) == 0:
        raise CompileError("the catalog has no names; at least one is needed")
    encoded = [n.encode() for n in names]
    if not all(encoded):
        raise CompileError("the catalog holds an empty name; names must be at least one character")
    if len(set(encoded)) != len(encoded):
        seen: set[bytes] = set()
        dup = next(n for n in encoded if n in seen or seen.add(n))
        raise CompileError(f"name {dup.decode()!r} appears more than once; names must be unique")
    return encoded


def build_char_trie(names: Sequence[str]) -> CharTrie:
    """The byte trie of `names` (checked with `check_names`)."""
    rows_bytes = sorted(check_names(names))
    k = len(rows_bytes)
    length = np.fromiter(map(len, rows_bytes), dtype=np.int64, count=k)
    width = int(length.max())
    flat = np.frombuffer(b"".join(rows_bytes), dtype=np.uint8)
    cols = np.arange(width)
    on_path = cols < length[:, None]
    matrix = np.full((k, width), -1, dtype=np.int16)  # -1 padding: a name differs from its extensions
    matrix[on_path] = flat  # boolean fill is row-major, like `flat`

    lcp = np.zeros(k, dtype=np.int64)
    if k > 1:
        lcp[1:] = np.argmax(matrix[1:] != matrix[:-1], axis=1)  # rows are distinct, so a difference exists

    # Row i creates the nodes of its prefixes of lengths lcp[i]+1 .. len[i], in preorder.
    created = (cols >= lcp[:, None]) & on_path
    new_per_row = length - lcp
    first_new = np.cumsum(new_per_row) - new_per_row
    offset = (1 + first_new - lcp).astype(np.int32)
    node = np.where(created, offset[:, None] + cols.astype(np.int32), np.int32(-1))
    node = np.maximum.accumulate(node, axis=0)  # a shared prefix's node is the latest one made at that depth
    n_nodes = 1 + int(new_per_row.sum())

    rows, depth_cols = np.nonzero(created)  # row-major: nodes 1 .. n_nodes-1 in id order
    parent = np.empty(n_nodes, dtype=np.int32)
    parent[0] = 0
    parent[1:] = np.arange(n_nodes - 1, dtype=np.int32)  # the node made just before, in the same row...
    # ...except a row's first new node, whose parent is the shared prefix's node (or the root).
    parent[1 + first_new] = np.where(lcp > 0, node[np.arange(k), np.maximum(lcp - 1, 0)], 0)
    byte = np.empty(n_nodes, dtype=np.int32)
    byte[0] = -1
    byte[1:] = matrix[rows, depth_cols]
    depth = np.empty(n_nodes, dtype=np.int32)
    depth[0] = 0
    depth[1:] = depth_cols + 1

    below = np.bincount(node[on_path], minlength=n_nodes)  # names whose path passes through each node
    lo = np.zeros(n_nodes, dtype=np.int32)
    lo[1:] = rows
    hi = (lo + below).astype(np.int32)
    hi[0] = k
    pointers = np.arange(k, dtype=np.int32)
    terminal_node = node[pointers, length - 1].astype(np.int32)
    terminal = np.full(n_nodes, -1, dtype=np.int32)
    terminal[terminal_node] = pointers

    # Children in byte (= id) order. A node's first child may be the next node of its own row (id v+1); every
    # other child is some row's first new node. So only the k row starts need sorting, not all nodes.
    row_first = (1 + first_new).astype(np.int32)
    row_parent = parent[row_first]
    own_row = np.ones(n_nodes, dtype=bool)
    own_row[row_first] = False
    own_row[0] = False  # nodes whose parent is the node just before them, in the same row
    has_own = np.zeros(n_nodes, dtype=np.int64)
    has_own[np.nonzero(own_row)[0] - 1] = 1
    child_start = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(has_own + np.bincount(row_parent, minlength=n_nodes), out=child_start[1:])
    children = np.empty(n_nodes - 1, dtype=np.int32)
    own = np.nonzero(own_row)[0]
    children[child_start[own - 1]] = own
    by_parent = np.argsort(row_parent, kind="stable")
    sorted_parent = row_parent[by_parent]
    group_start = np.searchsorted(sorted_parent, sorted_parent)  # first index of each node's parent group
    rank = np.arange(k) - group_start
    children[child_start[sorted_parent] + has_own[sorted_parent] + rank] = row_first[by_parent]
    return CharTrie(
        names=tuple(b.decode() for b in rows_bytes),  # UTF-8 round-trips every str that encodes
        parent=parent,
        byte=byte,
        depth=depth,
        lo=lo,
        hi=hi,
        terminal=terminal,
        terminal_node=terminal_node,
        child_start=child_start,
        children=children,
    )
