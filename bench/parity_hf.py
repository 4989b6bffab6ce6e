"""SmolLM2-135M-Instruct (the embedded GGUF) on the CPU engine against transformers, on 20 eval intents.

For each intent: the logits of the whole prompt (catalog prefix + intent) from our numpy forward pass and
from transformers loading the same GGUF (each side dequantises it itself), compared as max abs error and
relative to the largest logit; then greedy constrained decoding (k = 2) with our engine, and the same greedy
rule driven by transformers' logits through the same grammar runtime: the pointers must be identical.

Usage: python bench/parity_hf.py [--intents 20] [--out bench/results/parity_hf.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402
from decoder_service.engines.base import DecodeRequest, PointerEvent  # noqa: E402
from decoder_service.engines.catalog import read_catalog_file  # noqa: E402
from decoder_service.engines.cpu.sampler import greedy_pick  # noqa: E402
from decoder_service.engines.prompt import request_suffix_ids  # noqa: E402
from decoder_service.model_runtime import load_runtime  # noqa: E402
from decoder_service.models.loader import embedded_model_path  # noqa: E402
from tests.decoder_service.engines.hf_cache import cache_argument  # noqa: E402
from tooltrie.grammar import GrammarState  # noqa: E402

CATALOG = REPO / "examples" / "catalogs" / "workplace.json"
INTENTS = REPO / "examples" / "eval" / "intents.jsonl"


def hf_greedy(hf, prompt: list[int], catalog, k: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Our greedy rule (legal argmax, ties to the lower id) on transformers' logits, with a KV cache."""
    import torch
    from transformers import DynamicCache

    state, names = GrammarState(catalog.trie, k), []
    cache = {cache_argument(hf): DynamicCache(), "use_cache": True}  # filled in place, token by token
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), **cache)
        while not state.done:
            logits = out.logits[0, -1].numpy()
            legal = state.legal_tokens()
            token, _ = greedy_pick(legal, logits[legal])
            pointer = state.advance(token)
            if pointer is not None:
                names.append(catalog.trie.names[pointer])
            if not state.done:
                out = hf(torch.tensor([[token]]), **cache)
    return names


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intents", type=int, default=20)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "parity_hf.json")
    args = parser.parse_args()
    info = machine.describe()
    runtime = load_runtime(None, engine="cpu")
    tools, _ = read_catalog_file(CATALOG)
    catalog = runtime.prepare_local("workplace", tools)
    path = embedded_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    cases = [json.loads(line) for line in INTENTS.read_text().splitlines() if line.strip()][: args.intents]
    rows = []
    for case in cases:
        prompt = list(catalog.prefix_ids) + request_suffix_ids(catalog, case["intent"], args.k)
        ours_logits = runtime.engine.model.forward_all(prompt)
        with torch.no_grad():
            theirs_logits = hf(torch.tensor([prompt])).logits[0].numpy()
        error = float(np.abs(ours_logits - theirs_logits).max())
        scale = float(np.abs(theirs_logits).max())
        request = DecodeRequest(intent=case["intent"], k=args.k, catalog=catalog)
        ours = [e.name for e in runtime.engine.decode(request) if isinstance(e, PointerEvent)]
        theirs = hf_greedy(hf, prompt, catalog, args.k)
        rows.append({"intent": case["intent"], "max_abs_error": error, "logit_scale": scale, "ours": ours,
                     "transformers": theirs, "identical": ours == theirs})  # fmt: skip
        print(f"{error:9.2e} {error / scale:9.2e}  {'same' if ours == theirs else 'DIFFER'}  {case['intent'][:50]:50} "
              f"{', '.join(ours)}")  # fmt: skip
    worst = max(r["max_abs_error"] for r in rows)
    same = sum(r["identical"] for r in rows)
    print(f"\n{len(rows)} prompts (catalog prefix of {len(catalog.prefix_ids)} tokens + intent): max abs logit error "
          f"{worst:.2e}; constrained pointers identical on {same}/{len(rows)}")  # fmt: skip
    print(f"on {info['cpu']} ({info['cores']} cores), commit {info['commit']}, torch {torch.__version__}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "machine": info,
        "k": args.k,
        "max_abs_error": worst,
        "identical": same,
        "prompts": len(rows),
        "rows": rows,
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
