"""Decode over gRPC end to end with the CPU engine: latency to the first pointer and to the whole answer,
and throughput, sequential and with concurrent clients.

One registry (SQLite) and one decoder in one process, over loopback gRPC; the 42-tool example catalog.
Usage: python bench/serve.py [--model tiny|embedded|PATH] [--requests 40] [--concurrency 4] [--k 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402
from bench.stack import bench_runtime, scratch_dir  # noqa: E402
from tests.support.decoder import RunningDecoder, start_decoder  # noqa: E402
from tests.support.registry import start_registry  # noqa: E402

CATALOG = REPO / "examples" / "catalogs" / "workplace.json"
INTENTS = [
    "open an issue about the failing build",
    "tell the team in chat that the deploy is done",
    "book a meeting with Ana on Friday",
    "share the budget spreadsheet with finance",
    "what is the weather in Lisbon tomorrow",
    "translate the welcome email to German",
]


def one(decoder: RunningDecoder, index: int, k: int) -> tuple[float, float, int]:
    start = time.perf_counter()
    first = 0.0
    with decoder.client() as client:
        for event in client.decode("workplace", f"{INTENTS[index % len(INTENTS)]} (#{index})", k):
            if event.WhichOneof("event") == "pointer" and event.pointer.index == 0:
                first = time.perf_counter() - start
            elif event.WhichOneof("event") == "summary":
                tokens = event.summary.tokens_generated
    return first, time.perf_counter() - start, tokens


def run(decoder: RunningDecoder, requests: int, concurrency: int, k: int) -> dict[str, float]:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: one(decoder, i, k), range(requests)))
    wall = time.perf_counter() - start
    firsts, totals, tokens = zip(*results, strict=True)
    return {
        "concurrency": concurrency,
        "requests": requests,
        "first_pointer_p50_ms": 1000 * machine.percentile(list(firsts), 0.5),
        "first_pointer_p99_ms": 1000 * machine.percentile(list(firsts), 0.99),
        "answer_p50_ms": 1000 * machine.percentile(list(totals), 0.5),
        "answer_p99_ms": 1000 * machine.percentile(list(totals), 0.99),
        "answers_per_s": requests / wall,
        "tokens_per_s": sum(tokens) / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serve.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    info = machine.describe()
    with scratch_dir() as scratch_name:
        scratch = Path(scratch_name)
        registry = start_registry(f"sqlite:///{scratch / 'registry.db'}", scratch)
        decoder = start_decoder(registry, bench_runtime(args.model, scratch), max_queued=max(64, args.concurrency))
        with registry.client() as client:
            client.push("workplace", CATALOG.read_bytes(), activate=True)
        decoder.wait_for("workplace", 1)
        one(decoder, 0, args.k)  # the catalog prefix's KV is computed once per version; not measured
        rows = [run(decoder, args.requests, 1, args.k), run(decoder, args.requests, args.concurrency, args.k)]
        decoder.server.stop(grace=0)
        registry.server.stop(grace=0)
    print(f"Decode over gRPC, CPU engine, model {args.model}, k={args.k}, 42-tool catalog")
    print(f"on {info['cpu']} ({info['cores']} cores), commit {info['commit']}")
    print(
        f"{'clients':>7} {'reqs':>5} {'first p50':>10} {'first p99':>10} {'answer p50':>11} {'answer p99':>11} "
        f"{'answers/s':>10} {'tokens/s':>9}"
    )
    for r in rows:
        latencies = " ".join(
            f"{r[key]:>9.1f}ms"
            for key in ("first_pointer_p50_ms", "first_pointer_p99_ms", "answer_p50_ms", "answer_p99_ms")
        )
        print(
            f"{r['concurrency']:>7} {r['requests']:>5} {latencies} "
            f"{r['answers_per_s']:>10.2f} {r['tokens_per_s']:>9.1f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": info, "model": args.model, "k": args.k, "results": rows}, indent=2) + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
