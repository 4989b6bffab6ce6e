"""Recall@k of the decoder on the example catalog: for each intent, the share of its expected tools named;
and exact-set match: decoding with k = the number of expected tools, whether exactly those were named.

    python examples/eval/recall.py [-k 3] [--model PATH] [--head sparse|dense] [--json-out results.json]

Expected tools were written by hand from the catalog's descriptions, one to two per intent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from decoder_service.engines.base import PointerEvent  # noqa: E402
from decoder_service.engines.local import decode_local  # noqa: E402

CATALOG = HERE.parent / "catalogs" / "workplace.json"


def names(intent: str, k: int, model: str | None, head: str) -> list[str]:
    return [e.name for e in decode_local(intent, CATALOG, k, model, head=head) if isinstance(e, PointerEvent)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--model", default=None, help="a .gguf file or HF directory (default: embedded SmolLM2)")
    parser.add_argument("--head", default="sparse", choices=["sparse", "dense"])
    parser.add_argument("--intents", type=Path, default=HERE / "intents.jsonl")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()

    cases = [json.loads(line) for line in args.intents.read_text().splitlines() if line.strip()]
    rows, start = [], time.perf_counter()
    for case in cases:
        named = names(case["intent"], args.k, args.model, args.head)
        exact_k = names(case["intent"], len(case["expected"]), args.model, args.head)
        hits = len(set(named) & set(case["expected"]))
        rows.append(
            {
                "intent": case["intent"],
                "expected": case["expected"],
                "named": named,
                "recall": hits / len(case["expected"]),
                "top1": named[0] in case["expected"],
                "exact_set": set(exact_k) == set(case["expected"]),
            }
        )
        print(f"{rows[-1]['recall']:.2f}  {case['intent'][:60]:60}  {', '.join(named)}")
    recall = sum(r["recall"] for r in rows) / len(rows)
    top1 = sum(r["top1"] for r in rows) / len(rows)
    exact = sum(r["exact_set"] for r in rows) / len(rows)
    print(
        f"\nrecall@{args.k} = {recall:.3f}, top-1 accuracy = {top1:.3f}, exact-set match = {exact:.3f} "
        f"over {len(rows)} intents "
        f"({time.perf_counter() - start:.0f} s)"
    )
    if args.json_out:
        command = " ".join(["python", *sys.argv])
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        model = args.model or "embedded SmolLM2-135M-Instruct Q4_1"
        summary = {
            "command": command,
            "date": when,
            "k": args.k,
            "model": model,
            "head": args.head,
            "recall_at_k": recall,
            "top1": top1,
            "exact_set": exact,
            "cases": rows,
        }
        args.json_out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
