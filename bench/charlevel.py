"""Character-level mode: compile time, size and per-step legal-token cost, side by side with XGrammar and
llguidance on the same catalogs and vocabularies; `--exactness` sweeps the mask comparison with XGrammar.

Catalogs (seeded, as in bench/compile.py): synthetic `service.verb_object` names (K = 42, 1,000, 10,000)
and random 32-char hex strings (K = 1,000, 10,000); plus `word_word` names from the vocabulary's own words
(K = 1,200, 10,000), whose root has thousands of valid tokens. Vocabularies: Qwen3 (151,936 rows) and
Qwen3.6 (248,077 rows).

- cold: `compile_charlevel` with an empty matcher cache (builds the vocabulary matcher); median of 3.
- warm: the matcher is cached (a new catalog version for a known tokenizer); median of 7.
- steps: 60 sampled names, each spelled canonically and by one random tokenization, fed as the same token
  sequences to every engine (k = 1). Ours is `GrammarState.legal_tokens()` (ids out) after one warm-up
  pass (steady state of a long-lived trie; "first" is the mean on a fresh trie, when per-node arrays are
  built on first visit); XGrammar is `fill_next_token_bitmask`; llguidance is `fill_next_token_bitmask`
  of `llguidance.numpy`. "root" is the mean cost at the root state; "root valid" counts the content
  tokens legal there (control tokens excluded). "k16": our per-step cost on random walks with
  k = min(16, K) after 100 warm-up walks, where no-repeat pruning changes the sets (`GrammarState`).
- XGrammar: `root ::= "n1" | "n2" | ...`, compiled with all cores, cache off. llguidance: the regex
  alternative `n1|n2|...` (its lark form `start: "n1" | ...` stops with ParserTooComplex at 10,000 names);
  its compile time is the `LLMatcher` constructor.

Usage: python bench/charlevel.py [--quick] [--out bench/results/charlevel.json]
       python bench/charlevel.py --exactness [--sample N]   # every name (or N per catalog), Qwen3 and SmolLM2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402
from bench.compile import hex_names, synthetic_names, walk_costs  # noqa: E402
from tooltrie.grammar import GrammarState, load_tokenizer  # noqa: E402
from tooltrie.grammar.charlevel import compile_charlevel  # noqa: E402
from tooltrie.grammar.charlevel_vocab import MatcherCache  # noqa: E402
from tooltrie.grammar.tokenizers import Tokenizer  # noqa: E402

WALK_NAMES = 60


def word_names(k: int, tok: Tokenizer, seed: int = 0) -> list[str]:
    """`word_word` names from the vocabulary's own lowercase words: many first words, so the root of the
    character trie has thousands of valid tokens (like a catalog of real function names)."""
    words = sorted({b.decode() for b in tok.token_bytes() if 3 <= len(b) <= 10 and b.isalpha() and b.islower()})
    rng, names = random.Random(seed), set()
    while len(names) < k:
        names.add(f"{rng.choice(words)}_{rng.choice(words)}")
    return sorted(names)


def median_ms(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), result


def sequences(trie, tok: Tokenizer, names: list[str], seed: int) -> list[list[int]]:
    """Token sequences (ending in STOP) spelling sampled names canonically and by one random tokenization."""
    rng, vocab = random.Random(seed), tok.token_bytes()
    out = []
    for name in rng.sample(names, min(WALK_NAMES, len(names))):
        out.append([*tok.encode(name), trie.stop_token])
        state, rest, seq = GrammarState(trie, 1), name.encode(), []
        while rest:
            legal = [t for t in state.legal_tokens().tolist() if rest.startswith(vocab[t]) and t != trie.stop_token]
            token = rng.choice(legal)
            state.advance(token)
            seq.append(token)
            rest = rest[len(vocab[token]) :]
        out.append([*seq, trie.stop_token])
    return out


def timed_walks(seqs: list[list[int]], start, mask, advance) -> tuple[np.ndarray, np.ndarray]:
    """Per-step mask cost in us over every sequence; the second array holds the root steps."""
    steps, roots = [], []
    gc.collect()
    gc.disable()  # a collection inside one timed call would be charged to that step
    try:
        for seq in seqs:
            handle = start()
            for i, token in enumerate(seq):
                t0 = time.perf_counter_ns()
                mask(handle)
                dt = time.perf_counter_ns() - t0
                (roots if i == 0 else steps).append(dt)
                advance(handle, token)
    finally:
        gc.enable()
    return np.asarray(steps + roots, dtype=np.float64) / 1e3, np.asarray(roots, dtype=np.float64) / 1e3


def mask_sets(seqs: list[list[int]], start, legal, advance) -> list[np.ndarray]:
    """The legal token ids at every state of every sequence (untimed; for the agreement columns)."""
    out = []
    for seq in seqs:
        handle = start()
        for token in seq:
            out.append(np.asarray(legal(handle), dtype=np.int64))
            advance(handle, token)
    return out


def disagreements(ours_sets: list[np.ndarray], theirs: list[np.ndarray]) -> int:
    return sum(not np.array_equal(a, b) for a, b in zip(ours_sets, theirs, strict=True))


def bitmask_ids(words: np.ndarray, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def summary(all_steps: np.ndarray, roots: np.ndarray) -> dict:
    return {
        "mean_us": float(all_steps.mean()),
        "p99_us": float(np.percentile(all_steps, 99)),
        "root_us": float(roots.mean()),
    }


def ours(names: list[str], tok: Tokenizer, cache: MatcherCache) -> tuple[dict, object, list[list[int]], list]:
    cold_ms, _ = median_ms(lambda: compile_charlevel(names, tok, matcher_cache=MatcherCache()), 3)
    warm_ms, trie = median_ms(lambda: compile_charlevel(names, tok, matcher_cache=cache), 7)
    seqs = sequences(trie, tok, names, seed=1)

    def start():
        return GrammarState(trie, 1)

    def mask(state):
        state.legal_tokens()

    def advance(state, token):
        state.advance(token)

    fresh = compile_charlevel(names, tok, matcher_cache=cache)
    first, _ = timed_walks(seqs, lambda: GrammarState(fresh, 1), mask, advance)
    timed_walks(seqs, start, mask, advance)  # warm-up: per-node arrays built
    steady, roots = timed_walks(seqs, start, mask, advance)
    sets = mask_sets(seqs, start, lambda st: st.legal_tokens(), advance)
    walk_costs(trie, 100, seed=2)  # warm-up
    k16 = walk_costs(trie, 100, seed=3)
    stats = trie.stats
    root_valid = int(np.sum(trie.edge_child[trie.edges_of(0)] < trie.n_nodes))
    row = {
        "cold_ms": cold_ms,
        "warm_ms": warm_ms,
        "nodes": stats.n_nodes,
        "edges": stats.n_edges,
        "max_out_degree": stats.max_out_degree,
        "device_bytes": stats.device_bytes,
        "fits_constant_bank": stats.fits_constant_bank,
        "root_valid": root_valid,
        "first_mean_us": float(first.mean()),
        **summary(steady, roots),
        "k16_mean_us": float(k16.mean()),
        "k16_p99_us": float(np.percentile(k16, 99)),
    }
    return row, trie, seqs, sets


def popcount_mask(words: np.ndarray, vocab_size: int, stop: int) -> int:
    ids = bitmask_ids(words, vocab_size)
    return int(np.count_nonzero(ids != stop))


def xgrammar_row(names: list[str], tok: Tokenizer, info, seqs: list[list[int]], stop: int, sets: list) -> dict:
    import xgrammar as xgr

    ebnf = "root ::= " + " | ".join(json.dumps(n, ensure_ascii=False) for n in names)
    compiler = xgr.GrammarCompiler(info, max_threads=os.cpu_count() or 1, cache_enabled=False)
    t0 = time.perf_counter()
    compiled = compiler.compile_grammar(ebnf)
    compile_ms = (time.perf_counter() - t0) * 1e3
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, tok.vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    root_valid = popcount_mask(bitmask.numpy(), tok.vocab_size, stop)

    def start():
        matcher.reset()
        return matcher

    def advance(m, token):
        if not m.accept_token(token):
            raise RuntimeError(f"XGrammar refused token {token}")

    steps, roots = timed_walks(seqs, start, lambda m: m.fill_next_token_bitmask(bitmask), advance)

    def legal(m):
        m.fill_next_token_bitmask(bitmask)
        return bitmask_ids(bitmask.numpy(), tok.vocab_size)

    differ = disagreements(sets, mask_sets(seqs, start, legal, advance))
    return {"compile_ms": compile_ms, "root_valid": root_valid, "states_differing": differ, **summary(steps, roots)}


class _LLGuidanceVocab:
    """What `llguidance.TokenizerWrapper` reads: our byte vocabulary, specials, EOS and an encoder."""

    def __init__(self, tok: Tokenizer) -> None:
        self.eos_token_id = tok.default_stop
        self.bos_token_id = None
        self.tokens = list(tok.token_bytes())
        self.special_token_ids = sorted(tok.special_tokens.values())
        self._tok = tok

    def __call__(self, text: str | bytes) -> list[int]:
        return self._tok.encode(text.decode() if isinstance(text, bytes) else text)


def llguidance_tokenizer(tok: Tokenizer):
    import llguidance
    from llguidance._tokenizer import TokenizerWrapper

    return llguidance.LLTokenizer(
        TokenizerWrapper(_LLGuidanceVocab(tok)), n_vocab=tok.vocab_size, eos_token=tok.default_stop
    )


def llguidance_row(names: list[str], tok: Tokenizer, lltok, seqs: list[list[int]], stop: int, sets: list) -> dict:
    import llguidance
    import llguidance.numpy as llnp

    # One regex alternative: llguidance's lark form of 10,000 alternatives stops with "ParserTooComplex"
    # (a parser row over 2,000 items); as one lexeme the names go to its lexer instead.
    grammar = llguidance.LLMatcher.grammar_from_regex("|".join(re.escape(n) for n in names))
    t0 = time.perf_counter()
    matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
    compile_ms = (time.perf_counter() - t0) * 1e3
    if matcher.is_error():
        raise RuntimeError(f"llguidance refused the grammar: {matcher.get_error()}")
    bitmask = llnp.allocate_token_bitmask(1, tok.vocab_size)
    llnp.fill_next_token_bitmask(matcher, bitmask)
    root_valid = popcount_mask(bitmask[0], tok.vocab_size, stop)

    def start():
        matcher.reset()
        return matcher

    def advance(m, token):
        if not m.consume_token(token):
            raise RuntimeError(f"llguidance refused token {token}: {m.get_error()}")

    steps, roots = timed_walks(seqs, start, lambda m: llnp.fill_next_token_bitmask(m, bitmask), advance)

    def legal(m):
        llnp.fill_next_token_bitmask(m, bitmask)
        return bitmask_ids(bitmask[0], tok.vocab_size)

    differ = disagreements(sets, mask_sets(seqs, start, legal, advance))
    return {"compile_ms": compile_ms, "root_valid": root_valid, "states_differing": differ, **summary(steps, roots)}


def run_table(args: argparse.Namespace) -> None:
    import xgrammar as xgr

    if args.quick:
        catalogs, vocabs = [("synthetic", 42), ("synthetic", 1000), ("hex", 1000), ("words", 1200)], ["qwen3"]
    else:
        catalogs = [("synthetic", 42), ("synthetic", 1000), ("synthetic", 10_000), ("hex", 1000), ("hex", 10_000)]
        catalogs += [("words", 1200), ("words", 10_000)]
        vocabs = ["qwen3", "qwen3.6"]
    info = machine.describe()
    print(f"# {info['cpu']} ({info['cores']} cores), Python {info['python']}, commit {info['commit']}, {info['date']}")
    print(f"# command: {info['command']}")
    print(f"# load average at start: {os.getloadavg()[0]:.2f}")
    columns = [
        ("vocab", 8, "s"),
        ("catalog", 9, "s"),
        ("K", 6, "d"),
        ("cold ms", 7, ".1f"),
        ("warm ms", 7, ".1f"),
        ("nodes", 7, "d"),
        ("edges", 7, "d"),
        ("root", 5, "d"),
        ("first", 6, ".2f"),
        ("mean", 5, ".2f"),
        ("p99", 6, ".2f"),
        ("root us", 7, ".2f"),
        ("k16", 5, ".2f"),
        ("k16p99", 6, ".2f"),
        ("xgr ms", 7, ".1f"),
        ("root", 5, "d"),
        ("mean", 6, ".1f"),
        ("p99", 6, ".1f"),
        ("root us", 7, ".1f"),
        ("diff", 5, "d"),
        ("llg ms", 6, ".1f"),
        ("root", 5, "d"),
        ("mean", 6, ".1f"),
        ("p99", 6, ".1f"),
        ("root us", 7, ".1f"),
        ("diff", 5, "d"),
    ]
    header = " ".join(f"{name:>{width}}" for name, width, _ in columns)
    print("# ours: cold/warm compile, nodes, edges, root = valid tokens at the root; per-step us: first (fresh")
    print("# trie), mean, p99, root us (cost at the root), k16 mean/p99; then XGrammar (xgr) and llguidance (llg):")
    print("# compile ms, root valid, per-step mean/p99/root us, diff = states whose mask differs from ours")
    print(header)
    print("-" * len(header))
    rows = []
    for vocab in vocabs:
        tok = load_tokenizer(vocab)
        t0 = time.perf_counter()
        cache = MatcherCache()
        cache.get(tok)
        matcher_ms = (time.perf_counter() - t0) * 1e3
        print(f"# {vocab}: vocabulary matcher built in {matcher_ms:.0f} ms (part of every cold compile)")
        xgr_info = xgr.TokenizerInfo(
            _xgrammar_vocab(tok), xgr.VocabType.RAW, vocab_size=tok.vocab_size, stop_token_ids=[tok.default_stop]
        )
        lltok = llguidance_tokenizer(tok)
        for kind, k in catalogs:
            names = {"synthetic": synthetic_names, "hex": hex_names}[kind](k) if kind != "words" else word_names(k, tok)
            row_ours, trie, seqs, sets = ours(names, tok, cache)
            xg = xgrammar_row(names, tok, xgr_info, seqs, trie.stop_token, sets)
            ll = llguidance_row(names, tok, lltok, seqs, trie.stop_token, sets)
            rows.append(
                {
                    "vocab": vocab,
                    "vocab_size": tok.vocab_size,
                    "catalog": kind,
                    "k": k,
                    "matcher_ms": matcher_ms,
                    "ours": row_ours,
                    "xgrammar": xg,
                    "llguidance": ll,
                }
            )
            o = row_ours
            values = [
                vocab,
                kind,
                k,
                o["cold_ms"],
                o["warm_ms"],
                o["nodes"],
                o["edges"],
                o["root_valid"],
                o["first_mean_us"],
                o["mean_us"],
                o["p99_us"],
                o["root_us"],
                o["k16_mean_us"],
                o["k16_p99_us"],
            ]
            for r in (xg, ll):
                values += [
                    r["compile_ms"],
                    r["root_valid"],
                    r["mean_us"],
                    r["p99_us"],
                    r["root_us"],
                    r["states_differing"],
                ]
            print(" ".join(f"{v:>{w}{f}}" for v, (_, w, f) in zip(values, columns, strict=True)), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": info, "quick": args.quick, "rows": rows}, indent=2) + "\n")
    print(f"# wrote {args.out}")


def _xgrammar_vocab(tok: Tokenizer) -> list[bytes]:
    from tests.support.xgrammar_reference import xgrammar_vocab

    return xgrammar_vocab(tok)


def run_exactness(args: argparse.Namespace) -> int:
    """Every name (or `--sample` per catalog) walked canonically and randomly, masks compared at every state."""
    from tests.tooltrie.grammar.test_charlevel_exactness import compare, hex_catalog, synthetic_catalog, tricky_catalog

    info = machine.describe()
    print(f"# {info['cpu']} ({info['cores']} cores), commit {info['commit']}, {info['date']}")
    print(f"# command: {info['command']}")
    catalogs = [
        ("synthetic", synthetic_catalog(42)),
        ("synthetic", synthetic_catalog(1000)),
        ("synthetic", synthetic_catalog(10_000)),
        ("hex", hex_catalog(1000)),
        ("tricky", synthetic_catalog(200) + tricky_catalog()),
    ]
    failed = 0
    print(f"{'vocab':8} {'catalog':9} {'K':>6} | {'walks':>6} {'states':>8} {'mismatches':>10} {'seconds':>8}")
    for vocab in ("qwen3", "smollm2"):
        tok = load_tokenizer(vocab)
        for kind, names in catalogs:
            t0 = time.perf_counter()
            tally = compare(names, tok, sample=args.sample, seed=7, free_walks=200)
            seconds = time.perf_counter() - t0
            failed += len(tally.mismatches)
            print(
                f"{vocab:8} {kind:9} {len(names):6d} | {tally.walks:6d} {tally.states:8d} "
                f"{len(tally.mismatches):10d} {seconds:8.1f}",
                flush=True,
            )
            for line in tally.mismatches[:5]:
                print(f"    {line}")
    print("# exact: every state equal" if not failed else f"# {failed} walks disagree with XGrammar")
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="K = 42 and 1,000 synthetic, 1,000 hex, Qwen3 only")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "charlevel.json")
    ap.add_argument("--exactness", action="store_true", help="compare masks with XGrammar instead of timing")
    ap.add_argument("--sample", type=int, default=None, help="with --exactness: names per catalog (default all)")
    args = ap.parse_args()
    if args.exactness:
        sys.exit(run_exactness(args))
    run_table(args)


if __name__ == "__main__":
    main()
