"""CPU engine on the embedded SmolLM2-135M-Instruct and the 40-tool example catalog.

    python bench/cpu_decode.py [--model PATH] [--requests 5] [-k 3] [--out bench/results/cpu_decode.json]

Reports: model load, catalog preparation (tokenizer, trie, prompt), prefill of the catalog prompt prefix,
per request (prefix KV reused) the prefill of the intent, time to first pointer, ms per generated token and
forward passes per answer, for the sparse and the dense head and for the sparse head with a forward pass per token
(no forced tail or chains); and the head alone (legal rows vs the whole vocabulary) at the root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402
from decoder_service.engines.base import DecodeRequest, PointerEvent, SummaryEvent  # noqa: E402
from decoder_service.engines.catalog import read_catalog_file  # noqa: E402
from decoder_service.engines.cpu.engine import CpuEngine  # noqa: E402
from decoder_service.engines.cpu.model import CpuTransformer  # noqa: E402
from decoder_service.engines.prompt import prepare_catalog  # noqa: E402
from decoder_service.models.loader import load_model, resolve_model_path  # noqa: E402
from decoder_service.models.tokenizer_source import chat_template, model_tokenizer  # noqa: E402
from tooltrie.grammar.runtime import GrammarState  # noqa: E402

CATALOG = ROOT / "examples" / "catalogs" / "workplace.json"
INTENTS = [
    "File a GitHub issue for the crash and tell the team in Slack",
    "Schedule a meeting with Alice and Bob next Tuesday at 10am",
    "Find the Q3 budget spreadsheet in the shared drive",
    "Create a Jira ticket for the outage and assign it to Heidi",
    "Will it rain in Lisbon this weekend?",
]


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def run_requests(engine: CpuEngine, catalog, intents: list[str], k: int) -> dict[str, float]:
    ttfp, per_token, suffix_prefill, passes, tokens = [], [], [], [], []
    for intent in intents:
        start = time.perf_counter()
        first = None
        for event in engine.decode(DecodeRequest(intent=intent, k=k, catalog=catalog)):
            if isinstance(event, PointerEvent) and first is None:
                first = time.perf_counter() - start
            if isinstance(event, SummaryEvent):
                assert event.prefix_cached
                suffix_prefill.append(event.prefill_seconds)
                per_token.append(event.decode_seconds / event.tokens_generated)
                passes.append(event.forward_passes)
                tokens.append(event.tokens_generated)
        ttfp.append(first)
    return {
        "intent_prefill_ms": 1000 * statistics.median(suffix_prefill),
        "time_to_first_pointer_ms": 1000 * statistics.median(ttfp),
        "ms_per_token": 1000 * statistics.median(per_token),
        "forward_passes_per_answer": statistics.mean(passes),
        "tokens_per_answer": statistics.mean(tokens),
    }


def head_only(model: CpuTransformer, catalog, repeats: int = 50) -> dict[str, float]:
    legal = GrammarState(catalog.trie, 3).legal_tokens()
    hidden = np.random.default_rng(0).standard_normal(model.config.hidden_size).astype(np.float32)
    _, sparse = timed(lambda: [model.logits_for(hidden, legal) for _ in range(repeats)])
    _, dense = timed(lambda: [model.logits(hidden)[legal] for _ in range(repeats)])
    return {
        "root_legal_tokens": len(legal),
        "sparse_head_us": 1e6 * sparse / repeats,
        "dense_head_us": 1e6 * dense / repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--requests", type=int, default=len(INTENTS))
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu_decode.json")
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    (config, weights), load_s = timed(load_model, path)
    model = CpuTransformer(config, weights)
    tools, digest = read_catalog_file(CATALOG)
    catalog, prepare_s = timed(
        lambda: prepare_catalog(
            tools,
            model_tokenizer(path),
            chat_template(path),
            context_length=config.max_position_embeddings,
            catalog_id=digest,
        )
    )
    prefix = list(catalog.prefix_ids)
    _, prefix_s = timed(model.prefill, prefix, model.new_cache(len(prefix)))

    results = {
        "model": str(path.name),
        "catalog_tools": len(tools),
        "prefix_tokens": len(prefix),
        "with_descriptions": catalog.with_descriptions,
        "k": args.k,
        "load_s": load_s,
        "prepare_catalog_s": prepare_s,
        "prefix_prefill_s": prefix_s,
        "prefix_prefill_tokens_per_s": len(prefix) / prefix_s,
        "heads": {},
        "machine": describe(),
        "numpy": np.__version__,
    }
    intents = (INTENTS * ((args.requests + len(INTENTS) - 1) // len(INTENTS)))[: args.requests]
    variants = {
        "sparse": {"head": "sparse"},
        "dense": {"head": "dense"},
        "sparse, a pass per token": {"head": "sparse", "forced_tail": False, "forced_chains": False},
    }
    for head, options in variants.items():
        engine = CpuEngine(model, **options)
        list(engine.decode(DecodeRequest(intent=INTENTS[0], k=1, catalog=catalog)))  # warm the prefix KV
        results["heads"][head] = run_requests(engine, catalog, intents, args.k)
    results["head_only"] = head_only(model, catalog)

    print(f"model {results['model']}: load {load_s:.2f} s; catalog of {len(tools)} tools prepared in {prepare_s:.2f} s")
    print(
        f"catalog prompt prefix: {len(prefix)} tokens prefilled in {prefix_s:.2f} s "
        f"({results['prefix_prefill_tokens_per_s']:.0f} tok/s); descriptions kept: {catalog.with_descriptions}"
    )
    print(
        "\n| head | intent prefill ms | time to first pointer ms | ms/token | forward passes / tokens |"
        "\n| --- | --- | --- | --- | --- |"
    )
    for head, r in results["heads"].items():
        print(
            f"| {head} | {r['intent_prefill_ms']:.0f} | {r['time_to_first_pointer_ms']:.0f} | {r['ms_per_token']:.1f} "
            f"| {r['forward_passes_per_answer']:.1f} / {r['tokens_per_answer']:.1f} |"
        )
    h = results["head_only"]
    print(
        f"\nhead alone at the root ({h['root_legal_tokens']} legal tokens): sparse {h['sparse_head_us']:.0f} us, "
        f"dense {h['dense_head_us']:.0f} us"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
