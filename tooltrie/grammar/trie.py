"""The compiled token trie: compressed sparse rows over token ids, and its device byte layout.

Arrays (numpy, int32, little-endian when written):

- Nodes `0 .. n_nodes-1` are the real nodes in depth-first preorder (node 0 is the root; children in
  ascending token order). Two sentinel nodes follow: `sep_node = n_nodes` and `stop_node = n_nodes + 1`,
  the children of the SEP and STOP control edges. Sentinels have no edges; after SEP the walk goes back
  to the root, after STOP it is done.
- `node_edge_start[n_nodes + 3]`: the edges of node v are `node_edge_start[v] : node_edge_start[v+1]`.
- `node_terminal[n_nodes + 2]`: the pointer id that ends at node v, or -1.
- `edge_token[n_edges]`, `edge_child[n_edges]`: within a node, edges are sorted by ascending token id.
  A terminal node has two control edges (token SEP -> `sep_node`, token STOP -> `stop_node`) sorted in
  with its other edges; names never contain the SEP or STOP token (the compiler refuses them).
- `edge_lo[n_edges]`, `edge_hi[n_edges]`: the pointer ids below the edge form `[lo, hi)`. Pointers are
  numbered in depth-first order (a terminal before its children), which is the lexicographic order of
  the names' token sequences; a control edge of the terminal of pointer p has `[p, p+1)`.
- `names[n_pointers]`: the catalog names in pointer order (`names[p]` is pointer p's name).

Device image (`CompiledTrie.device_image()`; what a CUDA engine uploads, to `__constant__` when it fits
64 KiB, else to global memory). All fields little-endian; every array starts at a 16-byte-aligned offset:

| offset | dtype / shape | field |
| --- | --- | --- |
| 0 | uint32[8] | header (below) |
| 32 | int32[n_nodes + 3] | node_edge_start (sentinels included; padded with zeros to 16 bytes) |
| A = 32 + align16(4 (n_nodes + 3)) | int32[n_nodes + 2] | node_terminal (padded to 16 bytes) |
| B = A + align16(4 (n_nodes + 2)) | int32[n_edges, 4] | edges, one 16-byte record each: (token, child, lo, hi) |

Header words: magic `0x54525454` ("TTRT"), layout version (1), n_nodes (real nodes), n_edges,
n_pointers, sep_token, stop_token, max_out_degree. Total `B + 16 n_edges` bytes.
The record layout lets one 128-bit load read an edge. `sep_node` and
`stop_node` are `n_nodes` and `n_nodes + 1`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

K_MAX = 16
CONSTANT_BANK_BYTES = 64 * 1024
DEVICE_MAGIC = 0x54525454
DEVICE_LAYOUT_VERSION = 1
_HEADER = struct.Struct("<8I")


def _align16(n: int) -> int:
    return (n + 15) & ~15


@dataclass(frozen=True, slots=True)
class TrieStats:
    """Sizes of a compiled trie; `device_bytes` is the size of the device image."""

    n_names: int
    n_nodes: int
    n_edges: int
    max_out_degree: int
    root_out_degree: int
    depth: int
    device_bytes: int
    fits_constant_bank: bool

    def as_dict(self) -> dict[str, int | bool]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(eq=False)
class CompiledTrie:
    """A catalog compiled for one tokenizer (see the module docstring for the arrays)."""

    node_edge_start: np.ndarray
    node_terminal: np.ndarray
    edge_token: np.ndarray
    edge_child: np.ndarray
    edge_lo: np.ndarray
    edge_hi: np.ndarray
    names: tuple[str, ...]
    sep_token: int
    stop_token: int
    tokenizer_fingerprint: str
    _runtime_cache: dict = field(default_factory=dict, repr=False)

    @property
    def n_nodes(self) -> int:
        """Real nodes (sentinels excluded)."""
        return len(self.node_terminal) - 2

    @property
    def n_edges(self) -> int:
        return len(self.edge_token)

    @property
    def n_pointers(self) -> int:
        return len(self.names)

    @property
    def sep_node(self) -> int:
        return self.n_nodes

    @property
    def stop_node(self) -> int:
        return self.n_nodes + 1

    @cached_property
    def pointer_of(self) -> dict[str, int]:
        """Name -> pointer id."""
        return {name: p for p, name in enumerate(self.names)}

    def edges_of(self, node: int) -> slice:
        return slice(int(self.node_edge_start[node]), int(self.node_edge_start[node + 1]))

    @cached_property
    def stats(self) -> TrieStats:
        degrees = np.diff(self.node_edge_start)
        device_bytes = self.device_bytes()
        return TrieStats(
            n_names=self.n_pointers,
            n_nodes=self.n_nodes,
            n_edges=self.n_edges,
            max_out_degree=int(degrees.max(initial=0)),
            root_out_degree=int(degrees[0]) if len(degrees) else 0,
            depth=self._depth(),
            device_bytes=device_bytes,
            fits_constant_bank=device_bytes <= CONSTANT_BANK_BYTES,
        )

    def _depth(self) -> int:
        return self.longest_path

    @cached_property
    def longest_path(self) -> int:
        """Most tokens on any path from the root: a bound on the tokens of one name in the answer.

        In a token trie that is the deepest node; in a character-level trie (a DAG) the longest path can run
        through other parents than `node_parent`, so edges are relaxed until no distance grows."""
        real = self.edge_child < self.n_nodes
        src = np.repeat(np.arange(self.n_nodes + 2, dtype=np.int32), np.diff(self.node_edge_start))[real]
        dst = self.edge_child[real]
        dist = np.zeros(self.n_nodes, dtype=np.int32)
        while True:
            grown = dist.copy()
            np.maximum.at(grown, dst, dist[src] + 1)
            if np.array_equal(grown, dist):
                return int(dist.max(initial=0))
            dist = grown

    @cached_property
    def node_parent(self) -> np.ndarray:
        """Parent of every real node (the root is its own parent)."""
        parents = np.repeat(np.arange(self.n_nodes + 2, dtype=np.int32), np.diff(self.node_edge_start))
        real = self.edge_child < self.n_nodes
        out = np.zeros(self.n_nodes, dtype=np.int32)
        out[self.edge_child[real]] = parents[real]
        return out

    @cached_property
    def node_in_token(self) -> np.ndarray:
        """Token of the edge into every real node (-1 for the root)."""
        real = self.edge_child < self.n_nodes
        out = np.full(self.n_nodes, -1, dtype=np.int32)
        out[self.edge_child[real]] = self.edge_token[real]
        return out

    @cached_property
    def node_depth(self) -> np.ndarray:
        """Tokens from the root to every real node, by pointer jumping (one pass per level)."""
        parent = self.node_parent
        depth = np.zeros(self.n_nodes, dtype=np.int32)
        cur = np.arange(self.n_nodes, dtype=np.int32)
        live = cur != 0
        while live.any():
            depth[live] += 1
            cur[live] = parent[cur[live]]
            live = cur != 0
        return depth

    def device_bytes(self) -> int:
        return (
            _HEADER.size
            + _align16(4 * len(self.node_edge_start))
            + _align16(4 * len(self.node_terminal))
            + 16 * self.n_edges
        )

    def device_image(self) -> bytes:
        """The little-endian image a CUDA engine uploads (layout in the module docstring)."""
        degrees = np.diff(self.node_edge_start)
        header = _HEADER.pack(
            DEVICE_MAGIC,
            DEVICE_LAYOUT_VERSION,
            self.n_nodes,
            self.n_edges,
            self.n_pointers,
            self.sep_token,
            self.stop_token,
            int(degrees.max(initial=0)),
        )
        edges = np.stack([self.edge_token, self.edge_child, self.edge_lo, self.edge_hi], axis=1)
        parts = [header]
        for arr in (self.node_edge_start, self.node_terminal):
            raw = arr.astype("<i4").tobytes()
            parts.append(raw + b"\0" * (_align16(len(raw)) - len(raw)))
        parts.append(np.ascontiguousarray(edges, dtype="<i4").tobytes())
        image = b"".join(parts)
        assert len(image) == self.device_bytes()
        return image

    def to_bytes(self) -> bytes:
        """The versioned, checksummed blob of `tooltrie.grammar.serialize`."""
        from tooltrie.grammar.serialize import dump_trie

        return dump_trie(self)

    @classmethod
    def from_bytes(cls, blob: bytes, *, expected_fingerprint: str | None = None) -> CompiledTrie:
        """Load a blob written by `to_bytes`; verifies the checksum and, if given, the tokenizer fingerprint."""
        from tooltrie.grammar.serialize import load_trie

        return load_trie(blob, expected_fingerprint=expected_fingerprint)

    def token_sequence(self, pointer: int) -> list[int]:
        """The token ids that spell pointer `pointer` (walks the edges; for tests and tools, not hot paths)."""
        node, tokens = 0, []
        while int(self.node_terminal[node]) != pointer:
            s = self.edges_of(node)
            real = self.edge_child[s] < self.n_nodes
            inside = real & (self.edge_lo[s] <= pointer) & (pointer < self.edge_hi[s])
            (idx,) = np.nonzero(inside)
            e = s.start + int(idx[0])
            tokens.append(int(self.edge_token[e]))
            node = int(self.edge_child[e])
        return tokens
