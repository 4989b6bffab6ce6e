"""Token-trie compile time, size and host runtime cost, side by side with XGrammar on the same catalogs.

Catalogs: synthetic `service.verb_object` names (K = 42, 1,000, 10,000, 100,000) and random 32-char hex
strings (K = 1,000, 10,000), seeded. Vocabularies: Qwen3 (151,936 rows) and Qwen3.6 (248,077 rows).

- cold: compile with an empty tokenization cache (every name tokenized); median of several runs.
- warm: the cache holds the previous version's names (this version renames 1% of them); median.
- tables: building the per-trie runtime tables (once per trie, on its first sequence).
- runtime: `GrammarState.legal_tokens()` per step on random walks with k = min(16, K); "first" is the mean
  over walks on a fresh trie (per-node tables built on first visit), mean/p99 are over fresh walks after
  200 warm-up walks (steady state of a long-lived trie).
- XGrammar: `root ::= "name1" | "name2" | ...` compiled with the same vocabulary bytes (cache off, all
  cores), and `fill_next_token_bitmask` per step while accepting one random name's canonical tokens.

Usage: python bench/compile.py [--quick] [--out bench/results/compile.json] [--xgrammar-max-k 10000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402
from tooltrie.grammar import GrammarState, TokenizationCache, compile_catalog, load_tokenizer  # noqa: E402
from tooltrie.grammar.runtime import runtime_tables  # noqa: E402
from tooltrie.grammar.tokenizers import Tokenizer  # noqa: E402

SERVICES = [
    "crm",
    "billing",
    "github",
    "slack",
    "jira",
    "calendar",
    "drive",
    "mail",
    "search",
    "maps",
    "shop",
    "payments",
    "hr",
    "docs",
    "sheets",
    "ci",
]
VERBS = [
    "get",
    "list",
    "create",
    "update",
    "delete",
    "search",
    "send",
    "fetch",
    "archive",
    "restore",
    "share",
    "export",
    "import",
    "sync",
]
OBJECTS = [
    "user",
    "users",
    "contact",
    "invoice",
    "invoice_line",
    "order",
    "payment",
    "refund",
    "ticket",
    "comment",
    "issue",
    "pull_request",
    "branch",
    "message",
    "channel",
    "event",
    "calendar",
    "file",
    "folder",
    "document",
    "sheet",
    "report",
    "dashboard",
    "webhook",
    "token",
    "key",
    "role",
]


def synthetic_names(k: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    names: set[str] = set()
    version = 1
    while len(names) < k:
        services = [s if version == 1 else f"{s}_v{version}" for s in SERVICES]
        combos = [f"{s}.{v}_{o}" for s in services for v in VERBS for o in OBJECTS]
        rng.shuffle(combos)
        names.update(combos[: k - len(names)])
        version += 1
    out = sorted(names)
    rng.shuffle(out)
    return out


def hex_names(k: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return list(dict.fromkeys(f"{rng.getrandbits(128):032x}" for _ in range(k)))


def median_ms(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), result


def compile_times(names: list[str], tok: Tokenizer, repeats: int) -> dict:
    cold_ms, trie = median_ms(lambda: compile_catalog(names, tok, cache=TokenizationCache()), repeats)
    previous = TokenizationCache()
    changed = max(1, len(names) // 100)
    previous.encode(tok, names[:-changed] + [n + "_old" for n in names[-changed:]])
    warm_ms, _ = median_ms(lambda: compile_catalog(names, tok, cache=previous.copy()), repeats)
    return {"cold_ms": cold_ms, "warm_ms": warm_ms, "trie": trie}


def walk_costs(trie, walks: int, seed: int) -> np.ndarray:
    """Per-step cost, in us, of `legal_tokens()` on random walks with k = min(16, K) (no-repeat pruning at work)."""
    rng, times = random.Random(seed), []
    k = min(16, trie.n_pointers)
    gc.collect()
    gc.disable()  # a collection inside one timed call would be charged to that step
    try:
        _walks(trie, walks, k, rng, times)
    finally:
        gc.enable()
    return np.asarray(times, dtype=np.float64) / 1e3


def _walks(trie, walks: int, k: int, rng: random.Random, times: list[int]) -> None:
    for _ in range(walks):
        state = GrammarState(trie, k)
        while not state.done:
            t0 = time.perf_counter_ns()
            legal = state.legal_tokens()
            times.append(time.perf_counter_ns() - t0)
            state.advance(int(legal[rng.randrange(len(legal))]))


def runtime_costs(trie) -> dict:
    t0 = time.perf_counter()
    runtime_tables(trie)
    tables_ms = (time.perf_counter() - t0) * 1e3
    first = walk_costs(trie, 50, seed=1)
    walk_costs(trie, 200, seed=2)
    steady = walk_costs(trie, 200, seed=3)
    return {
        "tables_ms": tables_ms,
        "first_mean_us": first.mean(),
        "mean_us": steady.mean(),
        "p50_us": float(np.median(steady)),
        "p99_us": float(np.percentile(steady, 99)),
    }


def xgrammar_costs(names: list[str], tok: Tokenizer, info, samples: int = 50) -> dict:
    import xgrammar as xgr

    ebnf = "root ::= " + " | ".join(json.dumps(n) for n in names)
    compiler = xgr.GrammarCompiler(info, max_threads=os.cpu_count() or 1, cache_enabled=False)
    t0 = time.perf_counter()
    compiled = compiler.compile_grammar(ebnf)
    compile_ms = (time.perf_counter() - t0) * 1e3
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, tok.vocab_size)
    rng, fills = random.Random(4), []
    for name in rng.sample(names, min(samples, len(names))):
        matcher.reset()
        for token in [*tok.encode(name), None]:
            t0 = time.perf_counter_ns()
            matcher.fill_next_token_bitmask(bitmask)
            fills.append(time.perf_counter_ns() - t0)
            if token is not None and not matcher.accept_token(token):
                raise RuntimeError(f"XGrammar rejected token {token} of {name!r}")
    fills_us = np.asarray(fills, dtype=np.float64) / 1e3
    return {
        "compile_ms": compile_ms,
        "fill_mean_us": fills_us.mean(),
        "fill_p99_us": float(np.percentile(fills_us, 99)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="K = 42 and 1,000 synthetic, 1,000 hex, Qwen3 only")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "compile.json")
    ap.add_argument("--xgrammar-max-k", type=int, default=10_000, help="skip XGrammar above this catalog size")
    args = ap.parse_args()

    if args.quick:
        catalogs = [("synthetic", 42), ("synthetic", 1000), ("hex", 1000)]
        vocabs = ["qwen3"]
    else:
        catalogs = [("synthetic", k) for k in (42, 1000, 10_000, 100_000)] + [("hex", 1000), ("hex", 10_000)]
        vocabs = ["qwen3", "qwen3.6"]
    info = machine.describe()
    print(f"# {info['cpu']} ({info['cores']} cores), Python {info['python']}, commit {info['commit']}, {info['date']}")
    print(f"# command: {info['command']}")
    header = (
        f"{'vocab':8} {'catalog':10} {'K':>7} | {'cold ms':>8} {'warm ms':>8} {'blob B':>10} {'nodes':>8} "
        f"{'root deg':>8} {'fits64K':>7} | {'tables ms':>9} {'first us':>8} {'mean us':>7} {'p99 us':>7} | "
        f"{'xgr comp ms':>11} {'xgr fill us':>11} {'xgr p99':>8}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    import xgrammar as xgr

    for vocab in vocabs:
        tok = load_tokenizer(vocab)
        xgr_info = xgr.TokenizerInfo(
            tok.token_bytes(), xgr.VocabType.RAW, vocab_size=tok.vocab_size, stop_token_ids=[tok.default_stop]
        )
        for kind, k in catalogs:
            names = synthetic_names(k) if kind == "synthetic" else hex_names(k)
            repeats = 2 if k > 20_000 else 5
            ct = compile_times(names, tok, repeats)
            trie = ct.pop("trie")
            stats = trie.stats
            rt = runtime_costs(trie)
            xg = xgrammar_costs(names, tok, xgr_info) if k <= args.xgrammar_max_k else None
            row = {
                "vocab": vocab,
                "vocab_size": tok.vocab_size,
                "catalog": kind,
                "k": k,
                **ct,
                "serialized_bytes": len(trie.to_bytes()),
                **stats.as_dict(),
                **{f"runtime_{key}": v for key, v in rt.items()},
                "xgrammar": xg,
            }
            rows.append(row)
            xs = (
                f"{xg['compile_ms']:11.1f} {xg['fill_mean_us']:11.1f} {xg['fill_p99_us']:8.1f}"
                if xg
                else f"{'skipped':>11}"
            )
            print(
                f"{vocab:8} {kind:10} {k:7d} | {ct['cold_ms']:8.1f} {ct['warm_ms']:8.1f} {row['serialized_bytes']:10d} "
                f"{stats.n_nodes:8d} {stats.root_out_degree:8d} {'yes' if stats.fits_constant_bank else 'no':>7} | "
                f"{rt['tables_ms']:9.1f} {rt['first_mean_us']:8.2f} {rt['mean_us']:7.2f} {rt['p99_us']:7.2f} | {xs}",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": info, "quick": args.quick, "rows": rows}, indent=2, default=float) + "\n"
    )
    print(f"# wrote {args.out}")


if __name__ == "__main__":
    main()
