"""Host grammar runtime: one `GrammarState` per sequence, walking a `CompiledTrie`.

    state = GrammarState(trie, k=3)            # or allowed=[...] to narrow the catalog for this request
    while not state.done:
        legal = state.legal_tokens()           # sorted int32 token ids, control tokens included; read-only
        token = pick(legal)                    # e.g. argmax of the logits over `legal`, ties to the lower id
        pointer = state.advance(token)         # pointer id when SEP/STOP closes a name, else None
        if pointer is not None:
            emit(trie.names[pointer])

Rules (DESIGN.md section 3): the answer is `P (SEP P){k-1} STOP` over distinct names. At a terminal whose
pointer is live, SEP is legal while another pointer is owed after this one and STOP only when none is.
An edge is live when an unspent pointer (and, with an allowed set, an allowed one) lies in its `[lo, hi)`.
Errors are `GrammarError`s: `KTooLargeError` (k above the catalog or allowed set), `InvalidStateError`,
`EmptyMaskError` and `IllegalTokenError`; a decoder stops on them rather than emit a wrong answer.

Speed: per node the legal tokens with every pointer live are precomputed once per trie, lazily (three
variants for a terminal: SEP, STOP, or neither) and returned as read-only arrays without copying. The
no-repeat work happens once per emitted name, not per step: when a name is spent, the walk up the nodes that
hold it marks the edges that now have nothing live below (it stops at the first node still live), and a step at a node
with dead edges returns the precomputed set minus them (memoised per trie). So a step is a few list and
dict look-ups whatever the catalog size; `RuntimeTables` (built on the first state of a trie) holds the
Python-list copies of the arrays that make those look-ups cheap.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

import numpy as np

from tooltrie.grammar.errors import EmptyMaskError, GrammarError, IllegalTokenError, InvalidStateError, KTooLargeError
from tooltrie.grammar.trie import K_MAX, CompiledTrie

_NONE, _SEP, _STOP = 0, 1, 2  # which control token a terminal offers


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


class RuntimeTables:
    """Per-trie lookup tables as Python lists (fast scalar access) plus memoised legal-token arrays."""

    def __init__(self, trie: CompiledTrie) -> None:
        self.trie = trie
        n = trie.n_nodes
        self.n_nodes = n
        self.sep, self.stop = trie.sep_token, trie.stop_token
        self.edge_start = trie.node_edge_start.tolist()
        self.edge_token = trie.edge_token.tolist()
        self.edge_child = trie.edge_child.tolist()
        self.edge_lo = trie.edge_lo.tolist()
        self.edge_hi = trie.edge_hi.tolist()
        self.terminal = trie.node_terminal.tolist()
        real = trie.edge_child < n
        lo = np.zeros(n, dtype=np.int64)
        hi = np.full(n, trie.n_pointers, dtype=np.int64)
        lo[trie.edge_child[real]] = trie.edge_lo[real]
        hi[trie.edge_child[real]] = trie.edge_hi[real]
        self.node_lo, self.node_hi = lo.tolist(), hi.tolist()
        self.depth = trie.node_depth.tolist()
        self.parent = trie.node_parent.tolist()
        terminal_node = np.empty(trie.n_pointers, dtype=np.int64)
        has = trie.node_terminal[:n] >= 0
        terminal_node[trie.node_terminal[:n][has]] = np.nonzero(has)[0]
        self.terminal_node = terminal_node.tolist()
        self._node_lo, self._node_hi = lo, hi
        self._init_in_edges(trie)
        self._bases: dict[int, np.ndarray] = {}
        self._pruned: dict[tuple, np.ndarray] = {}
        self._paths: dict[int, list[int]] = {}
        self._chains: dict[int, list[int]] = {}

    def _init_in_edges(self, trie: CompiledTrie) -> None:
        """Incoming (source node, token) pairs of every real node, as CSR: one per node in a token trie,
        several in a character-level trie, where several tokenizations reach one character position."""
        n = trie.n_nodes
        real = np.nonzero(trie.edge_child < n)[0]
        src = np.repeat(np.arange(n + 2, dtype=np.int32), np.diff(trie.node_edge_start))[real]
        dst = trie.edge_child[real]
        order = np.argsort(dst, kind="stable")
        start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=start[1:])
        self.in_edge_start = start.tolist()
        self.in_edge_src = src[order].tolist()
        self.in_edge_token = trie.edge_token[real][order].tolist()
        self.is_tree = len(real) == n - 1

    def base(self, node: int, variant: int) -> np.ndarray:
        """Legal tokens at `node` with every pointer below it live; `variant` picks the control token."""
        key = 3 * node + variant
        arr = self._bases.get(key)
        if arr is None:
            a, b = self.edge_start[node], self.edge_start[node + 1]
            tokens = self.trie.edge_token[a:b]
            if self.terminal[node] < 0:
                arr = tokens  # a read-only view: an inner node's legal set is all its edges
            else:
                keep = np.ones(b - a, dtype=bool)
                for token, v in ((self.sep, _SEP), (self.stop, _STOP)):
                    if v != variant:
                        keep[bisect_left(self.edge_token, token, a, b) - a] = False
                arr = tokens[keep]
            arr = self._bases[key] = _frozen(arr)
        return arr

    def pruned(self, node: int, variant: int, dead: tuple[int, ...]) -> np.ndarray:
        """`base` without the tokens of dead edges."""
        key = (node, variant, dead)
        arr = self._pruned.get(key)
        if arr is None:
            base = self.base(node, variant)
            keep = np.ones(len(base), dtype=bool)
            keep[np.searchsorted(base, dead)] = False  # every dead token is an edge of this node
            arr = _frozen(base[keep])
            if len(self._pruned) < 1 << 16:  # bounded: a long-lived trie must not grow without limit
                self._pruned[key] = arr
        return arr

    def chain(self, pointer: int) -> list[int]:
        """Non-root nodes whose pointer range holds `pointer`, narrowest first: the nodes that can go dead
        when it is spent. In a tree that is the path up from its terminal; in a DAG, a scan (memoised)."""
        chain = self._chains.get(pointer)
        if chain is None:
            if self.is_tree:
                chain = self.path(pointer)[:0:-1]
            else:
                (nodes,) = np.nonzero((self._node_lo <= pointer) & (pointer < self._node_hi))
                nodes = nodes[nodes != 0]
                width = (self._node_hi - self._node_lo)[nodes]
                chain = nodes[np.argsort(width, kind="stable")].tolist()
            self._chains[pointer] = chain
        return chain

    def path(self, pointer: int) -> list[int]:
        """Nodes from the root to pointer's terminal (`path[d]` is at depth d)."""
        path = self._paths.get(pointer)
        if path is None:
            node, path = self.terminal_node[pointer], []
            while node != 0:
                path.append(node)
                node = self.parent[node]
            path.append(0)
            path.reverse()
            self._paths[pointer] = path
        return path


def runtime_tables(trie: CompiledTrie) -> RuntimeTables:
    """The trie's shared `RuntimeTables`, built on first use."""
    tables = trie._runtime_cache.get("tables")
    if tables is None:
        tables = trie._runtime_cache["tables"] = RuntimeTables(trie)
    return tables


class GrammarState:
    """The grammar state of one sequence: current node, spent pointers, pointers owed, allowed set."""

    __slots__ = (
        "_allowed_bases",
        "_allowed_list",
        "_dead",
        "_t",
        "allowed",
        "done",
        "emitted",
        "k",
        "node",
        "owed",
        "spent",
        "trie",
    )

    def __init__(self, trie: CompiledTrie, k: int, allowed: Iterable[int] | None = None) -> None:
        if not 1 <= k <= K_MAX:
            raise InvalidStateError(f"k={k} is out of range; accepted: 1 to {K_MAX}")
        self.trie = trie
        self._t = runtime_tables(trie)
        self.allowed: np.ndarray | None = None
        self._allowed_list: list[int] | None = None
        if allowed is not None:
            ids = np.unique(np.asarray(list(allowed), dtype=np.int64))
            if len(ids) and (ids[0] < 0 or ids[-1] >= trie.n_pointers):
                raise InvalidStateError(
                    f"allowed pointer ids must lie in [0, {trie.n_pointers}); got {ids[0]}..{ids[-1]}"
                )
            if k > len(ids):
                raise KTooLargeError(f"k={k} exceeds the {len(ids)} allowed tools; ask for at most {len(ids)}")
            self.allowed = _frozen(ids.astype(np.int32))
            self._allowed_list = ids.tolist()
        elif k > trie.n_pointers:
            raise KTooLargeError(
                f"k={k} exceeds the catalog's {trie.n_pointers} tools; ask for at most {trie.n_pointers}"
            )
        self._allowed_bases: dict[int, np.ndarray] = {}
        self.k = k
        self.node = 0
        self.owed = k
        self.spent: list[int] = []  # sorted
        self.emitted: list[int] = []  # in answer order
        self._dead: dict[int, tuple[int, ...]] = {}  # node -> sorted tokens of its edges with nothing live below
        self.done = False

    def copy(self) -> GrammarState:
        """An independent copy (same trie and allowed set; spent lists copied)."""
        other = object.__new__(type(self))
        for name in GrammarState.__slots__:
            setattr(other, name, getattr(self, name))
        other.spent, other.emitted, other._dead = list(self.spent), list(self.emitted), dict(self._dead)
        return other

    def forced_tail(self) -> list[int] | None:
        """The rest of the answer when the grammar leaves one legal token at every remaining step, else None.

        Such tokens need no logits (the log-softmax over one legal token is 0), and a token after which nothing is
        left to choose needs no forward pass: a decoder takes the whole tail at once.
        """
        tokens, ended = self.forced_run()
        return tokens if ended else None

    def forced_chain(self, limit: int) -> list[int]:
        """The next tokens the grammar forces (one legal token at each step), at most ``limit``, up to the end of
        the answer: a decoder takes them with the token just chosen and runs them through one forward pass."""
        return self.forced_run(limit)[0]

    def forced_run(self, limit: int | None = None) -> tuple[list[int], bool]:
        """The forced tokens from here (at most ``limit``; None: no bound), walked on a copy, and whether they end
        the answer: ``forced_tail`` and ``forced_chain`` from one walk."""
        if self.done:
            return [], False
        probe, tokens = self.copy(), []
        while not probe.done and (limit is None or len(tokens) < limit):
            legal = probe.legal_tokens()
            if len(legal) != 1:
                return tokens, False
            tokens.append(int(legal[0]))
            probe.advance(tokens[-1])
        return tokens, probe.done

    def _variant(self, pointer: int) -> int:
        if pointer < 0 or pointer in self.spent or not self._is_allowed(pointer):
            return _NONE
        return _SEP if self.owed > 1 else _STOP

    def _is_allowed(self, pointer: int) -> bool:
        al = self._allowed_list
        if al is None:
            return True
        i = bisect_left(al, pointer)
        return i < len(al) and al[i] == pointer

    def _live(self, lo: int, hi: int) -> bool:
        """Whether an allowed, unspent pointer lies in [lo, hi)."""
        sp = self.spent
        spent = bisect_left(sp, hi) - bisect_left(sp, lo)
        al = self._allowed_list
        if al is None:
            return spent < hi - lo
        return bisect_left(al, hi) - bisect_left(al, lo) > spent  # spent ids are always allowed

    def _allowed_base(self, node: int, variant: int) -> np.ndarray:
        key = 3 * node + variant
        arr = self._allowed_bases.get(key)
        if arr is None:
            t, trie = self._t, self.trie
            a, b = t.edge_start[node], t.edge_start[node + 1]
            allowed = self.allowed
            count = np.searchsorted(allowed, trie.edge_hi[a:b]) - np.searchsorted(allowed, trie.edge_lo[a:b])
            base = t.base(node, variant)
            arr = self._allowed_bases[key] = _frozen(base[np.isin(base, trie.edge_token[a:b][count > 0])])
        return arr

    def legal_tokens(self) -> np.ndarray:
        """Sorted int32 token ids legal now (read-only). Raises `EmptyMaskError` if none is."""
        if self.done:
            raise GrammarError("the sequence is done (STOP was taken); no token is legal")
        t, node = self._t, self.node
        variant = self._variant(t.terminal[node])
        legal = t.base(node, variant) if self._allowed_list is None else self._allowed_base(node, variant)
        dead = self._dead.get(node)
        if dead is not None:
            if self._allowed_list is None:
                legal = t.pruned(node, variant, dead)
            else:
                legal = _frozen(legal[~np.isin(legal, dead)])
        if len(legal) == 0:
            raise EmptyMaskError(
                f"no legal token at node {node} (spent {self.emitted}, owed {self.owed}); the grammar is exhausted"
            )
        return legal

    def advance(self, token: int) -> int | None:
        """Take `token`; returns the pointer id a SEP/STOP completes, else None. Raises `IllegalTokenError`."""
        if self.done:
            raise IllegalTokenError(f"token {token} after STOP: the sequence is done")
        t, node = self._t, self.node
        a, b = t.edge_start[node], t.edge_start[node + 1]
        e = bisect_left(t.edge_token, token, a, b)
        if e == b or t.edge_token[e] != token:
            raise IllegalTokenError(f"token {token} is not an edge of node {node}; legal now: {self._legal_hint()}")
        child = t.edge_child[e]
        if child < t.n_nodes:
            if not self._live(t.edge_lo[e], t.edge_hi[e]):
                raise IllegalTokenError(f"token {token} at node {node} leads only to spent or disallowed tools")
            self.node = child
            return None
        pointer = t.terminal[node]
        variant = self._variant(pointer)
        if (token == t.sep and variant != _SEP) or (token == t.stop and variant != _STOP):
            raise IllegalTokenError(
                f"control token {token} is illegal at the end of {self.trie.names[pointer]!r} "
                f"(owed {self.owed}, spent {self.emitted}); legal now: {self._legal_hint()}"
            )
        self._spend(pointer)
        self.node = 0
        self.done = token == t.stop
        return pointer

    def _spend(self, pointer: int) -> None:
        """Record `pointer` as spent and mark the edges that now have nothing live below.

        Walks the nodes that hold the pointer, narrowest first (in a token trie, up the path from its
        terminal); a node still live keeps every wider one live, so the walk stops there. Every incoming
        edge of a dead node is marked, which also covers character-level tries, where a node has several.
        This moves the no-repeat work from every step to once per emitted name.
        """
        insort(self.spent, pointer)
        self.emitted.append(pointer)
        self.owed -= 1
        t, dead = self._t, self._dead
        for node in t.chain(pointer):
            if self._live(t.node_lo[node], t.node_hi[node]):
                break
            for e in range(t.in_edge_start[node], t.in_edge_start[node + 1]):
                source = t.in_edge_src[e]
                dead[source] = tuple(sorted((*dead.get(source, ()), t.in_edge_token[e])))

    def _legal_hint(self) -> str:
        try:
            legal = self.legal_tokens()
        except GrammarError as exc:
            return f"none ({exc})"
        shown = legal[:16].tolist()
        return f"{shown}{' ...' if len(legal) > 16 else ''} ({len(legal)} tokens)"
