"""Character-level mode: compile names so that ANY tokenization spelling a catalog name is legal.

    cache = MatcherCache()                                  # keep it: one vocabulary matcher per tokenizer
    trie = compile_charlevel(names, tokenizer, matcher_cache=cache)
    state = GrammarState(trie, k=1)                         # the token-trie runtime, unchanged

The output is a `CompiledTrie` (layout in `tooltrie.grammar.trie`), so the runtime, the serialised form
and the engines serve it as they serve the canonical token trie. What differs is what a node means.

Algorithm
1. Character trie (`charlevel_names`): the byte trie of the names, preorder ids, names sorted bytewise
   (pointer i is sorted name i), so the pointers below any character node are a range `[lo, hi)`.
2. Vocabulary matcher (`charlevel_vocab`, cached per tokenizer fingerprint): the byte trie of every
   content token (special/added tokens excluded: they are control tokens, never name text).
3. Product walk (the role an Aho-Corasick pass plays: one sweep finds every vocabulary token inside the
   names, at every position). A token t is a valid continuation at character node u when t's bytes walk
   the character trie from u without falling off; it leads to the node v where they end. Every such
   (u, t, v) is found at once, for every u, by walking both tries in lockstep, level-synchronously in
   numpy: the frontier holds triples (start u, character node c, vocabulary node w) meaning "the bytes
   from u down to c spell the token prefix w"; level 1 is every character edge; a level extends every
   triple by every child byte of c that w also has, and a triple whose w ends a token emits (u, t, c).
   The work is the number of (character node, token prefix ending there) matches: output-sensitive, at
   most the trie size times the longest token, never trie size times vocabulary (the vocabulary itself
   is touched once per tokenizer, when the cached matcher is built). A token cannot run past a name's
   end (there is no character child there), so a token swallowing the separator is never an edge; a
   token may pass through a terminal into a longer name (the walk does not stop at terminals).
4. Nodes of the result are the character nodes reachable from the root at token boundaries and from
   which a name can still be completed (both by one pass per depth; when every byte on the trie is a
   one-byte token, as with byte-level BPE vocabularies, both hold everywhere and the passes are skipped).
   They keep their character preorder (node 0 is the root); node ids are renumbered densely.
5. Edges: per node, the valid tokens sorted by id, each with its target and the target's pointer range
   `[lo, hi)` (the names below the target character node: no-repeat works on names, not token paths);
   terminals get the SEP and STOP control edges with `[p, p+1)` as in the token trie.

The result is a DAG, not a tree: several token paths reach the same character node. `CompiledTrie`'s
arrays express that unchanged, and so does every per-edge `[lo, hi)` test (the ranges of all edges into
a node are equal). `GrammarState` serves it unchanged: when a name is spent it marks every incoming edge of
each node that went dead, so no tokenization of a spent name stays open.

Cost (K = 10,000 synthetic names, Qwen3): about 60,000 character nodes, 250,000 product matches and
210,000 edges; `bench/charlevel.py` has the measured times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tooltrie.grammar.charlevel_names import CharTrie, build_char_trie
from tooltrie.grammar.charlevel_vocab import MatcherCache, VocabularyMatcher
from tooltrie.grammar.errors import CompileError
from tooltrie.grammar.tokenizers.base import Tokenizer
from tooltrie.grammar.trie import CompiledTrie

_default_cache = MatcherCache()


def valid_edges(chars: CharTrie, matcher: VocabularyMatcher) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (start node, token, end node) whose token bytes spell the path start -> end (step 3)."""
    degree = chars.out_degree
    # Level 1 needs no expansion: every character edge parent -> v, read with the byte of v.
    node = np.arange(1, chars.n_nodes, dtype=np.int32)
    start = chars.parent[1:]
    state = matcher.dense[0][chars.byte[1:]]
    out_s, out_t, out_c = [], [], []
    while True:
        ok = state >= 0
        if not ok.all():
            start, node, state = start[ok], node[ok], state[ok]
        token = matcher.node_token[state]
        ends = token >= 0
        out_s.append(start[ends])
        out_t.append(token[ends])
        out_c.append(node[ends])
        which, extra = matcher.duplicates(state[ends])  # other ids with the same bytes (rare; byte fallback)
        if len(extra):
            out_s.append(start[ends][which])
            out_t.append(extra)
            out_c.append(node[ends][which])
        deg = degree[node]
        total = int(deg.sum())
        if total == 0:
            break
        # The next level: every (start, node, state) triple extended by every character child of node
        # (np.repeat carries the triple once per child; cheaper than gathering through an index array).
        first = np.cumsum(deg) - deg
        child = chars.children[np.repeat(chars.child_start[node] - first, deg) + np.arange(total)]
        start, node = np.repeat(start, deg), child
        state = matcher.step(np.repeat(state, deg), chars.byte[child])
    return np.concatenate(out_s), np.concatenate(out_t), np.concatenate(out_c)


def _one_byte_everywhere(chars: CharTrie, matcher: VocabularyMatcher) -> bool:
    """Whether every character edge's byte is a one-byte token (then every node is reachable and live)."""
    root = matcher.dense[0]
    one_byte = (root >= 0) & (matcher.node_token[root] >= 0)
    return bool(one_byte[chars.byte[1:]].all())


def _live_nodes(chars: CharTrie, e_s: np.ndarray, e_c: np.ndarray) -> np.ndarray:
    """Nodes reachable from the root at token boundaries from which a terminal is reachable (step 4)."""
    n = chars.n_nodes
    depth_s, depth_c = chars.depth[e_s], chars.depth[e_c]
    by_src = np.argsort(depth_s, kind="stable")
    src_bounds = np.searchsorted(depth_s[by_src], np.arange(int(chars.depth.max()) + 2))
    reach = np.zeros(n, dtype=bool)
    reach[0] = True
    for d in range(len(src_bounds) - 1):  # edges go strictly deeper, so one pass per depth settles it
        es = by_src[src_bounds[d] : src_bounds[d + 1]]
        reach[e_c[es[reach[e_s[es]]]]] = True
    by_dst = np.argsort(depth_c, kind="stable")
    dst_bounds = np.searchsorted(depth_c[by_dst], np.arange(int(chars.depth.max()) + 2))
    live = chars.terminal >= 0
    for d in range(len(dst_bounds) - 2, 0, -1):
        es = by_dst[dst_bounds[d] : dst_bounds[d + 1]]
        live[e_s[es[live[e_c[es]]]]] = True
    return reach & live


def build_charlevel(
    chars: CharTrie, matcher: VocabularyMatcher, tokenizer: Tokenizer, sep: int, stop: int
) -> CompiledTrie:
    """Steps 3-5 of the module docstring for an already built character trie."""
    e_s, e_t, e_c = valid_edges(chars, matcher)
    if _one_byte_everywhere(chars, matcher):
        keep = np.ones(chars.n_nodes, dtype=bool)
    else:
        keep = _live_nodes(chars, e_s, e_c)
        dead = ~keep[chars.terminal_node]
        if dead.any():
            name = chars.names[int(np.argmax(dead))]
            raise CompileError(
                f"name {name!r} cannot be spelled with the content tokens of {tokenizer.name} (no sequence of them "
                "spells it, e.g. a byte of it is in no token); rename the tool or use a vocabulary covering every byte"
            )
        live_edge = keep[e_s] & keep[e_c]
        e_s, e_t, e_c = e_s[live_edge], e_t[live_edge], e_c[live_edge]
    control = (e_t == sep) | (e_t == stop)
    if control.any():
        bad = int(np.argmax(control))
        name = chars.names[int(chars.lo[e_c[bad]])]
        raise CompileError(
            f"name {name!r} contains the text of the sep ({sep}) or stop ({stop}) token; rename the tool or "
            "choose other control tokens"
        )

    n_nodes = int(keep.sum())
    if n_nodes == chars.n_nodes:
        new_s, new_c, term = e_s, e_c, chars.terminal_node
    else:  # renumber densely, keeping the character preorder
        new_id = (np.cumsum(keep) - 1).astype(np.int32)
        new_s, new_c, term = new_id[e_s], new_id[e_c], new_id[chars.terminal_node]
    sep_node, stop_node = n_nodes, n_nodes + 1
    k = len(chars.names)
    pointers = np.arange(k, dtype=np.int32)
    src = np.concatenate([new_s, term, term])
    token = np.concatenate([e_t, np.full(k, sep, dtype=np.int32), np.full(k, stop, dtype=np.int32)])
    child = np.concatenate([new_c, np.full(k, sep_node, dtype=np.int32), np.full(k, stop_node, dtype=np.int32)])
    lo = np.concatenate([chars.lo[e_c], pointers, pointers])
    hi = np.concatenate([chars.hi[e_c], pointers + 1, pointers + 1])
    # Stable sort: each product level emits its edges grouped by start node, runs that timsort merges fast.
    order = np.argsort(src.astype(np.int64) * (tokenizer.vocab_size + 1) + token, kind="stable")

    node_edge_start = np.zeros(n_nodes + 3, dtype=np.int32)
    np.cumsum(np.bincount(src, minlength=n_nodes + 2), out=node_edge_start[1:])
    node_terminal = np.full(n_nodes + 2, -1, dtype=np.int32)
    node_terminal[term] = pointers
    return CompiledTrie(
        node_edge_start=node_edge_start,
        node_terminal=node_terminal,
        edge_token=token[order].astype(np.int32),
        edge_child=child[order].astype(np.int32),
        edge_lo=lo[order].astype(np.int32),
        edge_hi=hi[order].astype(np.int32),
        names=chars.names,
        sep_token=int(sep),
        stop_token=int(stop),
        tokenizer_fingerprint=tokenizer.fingerprint,
    )


def compile_charlevel(
    names: Sequence[str],
    tokenizer: Tokenizer,
    *,
    sep: int | None = None,
    stop: int | None = None,
    matcher_cache: MatcherCache | None = None,
) -> CompiledTrie:
    """Compile tool names into a character-level trie for `tokenizer` (algorithm in the module docstring).

    `sep`/`stop` default to the tokenizer's separator and end-of-turn tokens. `matcher_cache` keeps the
    vocabulary matcher between compiles (a module-wide cache is used when omitted). Pointer ids follow the
    names' bytewise order: `trie.names[p]` is pointer p's name. Raises `CompileError` for an empty catalog,
    an empty or duplicate name, a name containing the sep/stop token's text, or a name some byte of which
    no content token can spell.
    """
    names = list(names)
    sep = tokenizer.default_sep if sep is None else int(sep)
    stop = tokenizer.default_stop if stop is None else int(stop)
    for what, tok in (("sep", sep), ("stop", stop)):
        if not 0 <= tok < tokenizer.vocab_size:
            raise CompileError(f"{what} token {tok} is outside the vocabulary [0, {tokenizer.vocab_size})")
    if sep == stop:
        raise CompileError(f"sep and stop are the same token ({sep}); they must differ")
    chars = build_char_trie(names)
    matcher = (matcher_cache if matcher_cache is not None else _default_cache).get(tokenizer)
    return build_charlevel(chars, matcher, tokenizer, sep, stop)
