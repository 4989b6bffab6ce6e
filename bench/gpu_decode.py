"""Constrained decode speed of the CUDA engine at batch 1: device-resident graph loop vs host loop, sparse vs
dense head, layered decode step vs the persistent decode kernel, on synthetic models (random bf16 weights drawn on
the GPU) with a 40-name catalog of token sequences and a 200-token cached prompt prefix. Beside it, the
unconstrained step (forward + dense head + argmax, captured as a straight-line graph) of the same model.

Per-token time = an answer's decode wall time (first step to the summary, pointers streamed meanwhile) divided
by its generated tokens, the median over the intents after one warm-up answer. Every variant but one runs a
forward pass after every token but the last (``forced_tail=False, forced_chains=False``), so its per-token time is
the cost of a step; the "default" variant is the product's, which takes the answer's forced end without forward
passes and feeds forced chains through one pass (the same answers), timed per generated token and per forward
pass. The FP8 variants run the same model with its layer projections rounded to e4m3 rows with power-of-two scales
(decoder_service/models/fp8.py): the bf16 kernels on those weights, then the FP8 weight format (single-token GEMVs
reading e4m3 bytes), whose answers must be the same.

    PYTHONPATH=. python3 bench/gpu_decode.py --out results/bench_gpu_decode.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_forward import QWEN3_1_7B, graph_ms, synthetic_weights  # noqa: E402
from bench.machine import code_identity_lines, git_commit, run_env  # noqa: E402
from decoder_service.engines.base import PointerEvent, SummaryEvent  # noqa: E402
from decoder_service.engines.cuda.driver import cuda_available  # noqa: E402
from decoder_service.models.synth import PRESETS  # noqa: E402
from tests.decoder_service.engines.cuda.synthetic_tries import random_catalog  # noqa: E402

SHAPES = {"smollm2-shape": PRESETS["smollm2-shape"], "qwen3-1.7b-shape": QWEN3_1_7B, "tiny-qwen3": PRESETS["tiny"]}
SEP, STOP = 11, 12
VARIANTS = [("graph", "sparse"), ("graph", "dense"), ("host", "sparse"), ("host", "dense")]


def measure(engine, trie, prefix: list[int], intents: list[list[int]], k: int) -> dict[str, float]:
    per_token, per_pass, tokens, passes, answers, early = [], [], [], [], [], []
    for i, intent in enumerate([intents[0], *intents]):
        events = list(engine.decode_ids(trie, k, prefix, intent, cache_key="bench"))
        summary = events[-1]
        assert isinstance(summary, SummaryEvent)
        if i:  # the first answer warms up (graph capture, prefix KV)
            per_token.append(summary.decode_seconds / summary.tokens_generated)
            per_pass.append(summary.decode_seconds / max(summary.forward_passes, 1))
            tokens.append(summary.tokens_generated)
            passes.append(summary.forward_passes)
            answers.append([e.pointer_id for e in events if isinstance(e, PointerEvent)])
            early.append(engine.last_streamed / k)
    return {
        "ms_per_token": 1e3 * statistics.median(per_token),
        "ms_per_token_min": 1e3 * min(per_token),
        "ms_per_forward_pass": 1e3 * statistics.median(per_pass),
        "tokens_per_answer": statistics.mean(tokens),
        "forward_passes_per_answer": statistics.mean(passes),
        "answers": answers,
        "pointers_streamed_before_loop_end": statistics.mean(early),
    }


def bench_shape(name: str, n_intents: int, k: int, prompt: int, fp8_only: bool = False) -> dict:
    from decoder_service.engines.cuda.engine import CudaEngine

    cfg = SHAPES[name]
    weights = synthetic_weights(cfg, seed=5)
    rng = np.random.default_rng(17)
    trie = random_catalog(rng, 40, cfg.vocab_size, SEP, STOP)
    prefix = rng.integers(200, cfg.vocab_size, prompt).tolist()
    intents = [rng.integers(200, cfg.vocab_size, 10).tolist() for _ in range(n_intents)]
    out: dict = {"shape": name, "k": k, "prompt_prefix": prompt, "trie_device_bytes": trie.stats.device_bytes}

    def stepping(model_weights: dict | None = None, **options: object) -> CudaEngine:
        """A graph-loop, sparse-head engine with a forward pass per token (no forced tail or chains), ``options``
        changing one setting."""
        settings = {"head": "sparse", "loop": "graph", "forced_tail": False, "forced_chains": False, **options}
        return CudaEngine(cfg, weights if model_weights is None else model_weights, max_context=1024, **settings)

    if fp8_only:
        engine = stepping()
        out["graph/sparse"] = measure(engine, trie, prefix, intents, k)
        print(f"{name:18s} graph sparse {out['graph/sparse']['ms_per_token']:8.3f} ms/token", flush=True)
        engine.free()
        out |= bench_fp8(cfg, weights, stepping, lambda e: measure(e, trie, prefix, intents, k), prompt, name)
        out["all_variants_same_answers"] = out["fp8_same_answers"]
        return out
    engine = None
    for loop, head in VARIANTS:
        if engine is None or engine.loop != loop:
            if engine is not None:
                engine.free()
            engine = stepping(head=head, loop=loop)
        engine.head = head
        out[f"{loop}/{head}"] = measure(engine, trie, prefix, intents, k)
        if (loop, head) == ("graph", "sparse"):  # the default's decode attention
            out["cluster_merge_used"] = engine.last_attention == "cluster"
        print(f"{name:18s} {loop:5s} {head:6s} {out[f'{loop}/{head}']['ms_per_token']:8.3f} ms/token", flush=True)
    engine.free()
    engine.module.unload()
    # The same graph loop with every kernel launched the classic way (no programmatic dependent launch).
    from decoder_service.engines.cuda.engine import load_module

    engine = stepping(module=load_module(pdl=False))
    out["graph/sparse/no-pdl"] = measure(engine, trie, prefix, intents, k)
    print(f"{name:18s} graph sparse no PDL {out['graph/sparse/no-pdl']['ms_per_token']:8.3f} ms/token", flush=True)
    engine.free()
    # The same graph loop with decode attention merged through global records and a counter (attention_decode) where
    # the default merges each head's chunks inside a thread-block cluster (requests within 256 positions, as these);
    # then the same with the short form (attention_decode_short), which such requests take with the cluster form off.
    engine = stepping(cluster_attention=False, short_attention=False)
    out["graph/sparse/global-merge"] = measure(engine, trie, prefix, intents, k)
    print(
        f"{name:18s} graph sparse global merge {out['graph/sparse/global-merge']['ms_per_token']:8.3f} ms/token",
        flush=True,
    )
    engine.free()
    engine = stepping(cluster_attention=False)
    out["graph/sparse/short"] = measure(engine, trie, prefix, intents, k)
    print(f"{name:18s} graph sparse short {out['graph/sparse/short']['ms_per_token']:8.3f} ms/token", flush=True)
    engine.free()
    # The same graph loop with the decode step as one persistent kernel (cuda/decode_persistent.cuh), and its step.
    engine = stepping(decode_kernel="persistent")
    out["graph/sparse/persistent"] = measure(engine, trie, prefix, intents, k)
    engine.model.set_decode_position(prompt + 10)
    out["persistent_unconstrained_graph_ms_per_token"] = graph_ms(engine.model.stream, engine.model.decode_launches)
    print(
        f"{name:18s} graph sparse persistent {out['graph/sparse/persistent']['ms_per_token']:8.3f} ms/token", flush=True
    )
    engine.free()
    # The product's default: the answer's forced end without forward passes, forced chains through one pass.
    engine = stepping(forced_tail=True, forced_chains=True)
    out["graph/sparse/default"] = measure(engine, trie, prefix, intents, k)
    tail = out["graph/sparse/default"]
    print(
        f"{name:18s} graph sparse default (forced tail, chains) {tail['ms_per_token']:8.3f} ms/token, "
        f"{tail['ms_per_forward_pass']:.3f} ms/forward pass, {tail['forward_passes_per_answer']:.1f} passes "
        f"for {tail['tokens_per_answer']:.1f} tokens",
        flush=True,
    )
    m = engine.model
    m.set_decode_position(prompt + 10)
    out["unconstrained_graph_ms_per_token"] = graph_ms(m.stream, m.decode_launches)
    forward, pos_args = m.step_launches(token_ptr=0, pos_ptr=0)
    for launch, index in pos_args:
        launch.set(index, prompt + 10)
    out["forward_only_graph_ms_per_token"] = graph_ms(m.stream, forward)
    print(
        f"{name:18s} unconstrained forward+dense head+argmax graph {out['unconstrained_graph_ms_per_token']:.3f} ms",
        flush=True,
    )
    same = all(
        out[v]["answers"] == out["graph/sparse"]["answers"]
        for v in [
            *(f"{lp}/{hd}" for lp, hd in VARIANTS),
            "graph/sparse/no-pdl",
            "graph/sparse/global-merge",
            "graph/sparse/short",
            "graph/sparse/persistent",
            "graph/sparse/default",
        ]
    )
    engine.free()
    out |= bench_fp8(cfg, weights, stepping, lambda e: measure(e, trie, prefix, intents, k), prompt, name)
    out["all_variants_same_answers"] = same and out["fp8_same_answers"]
    return out


def bench_fp8(cfg, weights: dict, stepping, measure_engine, prompt: int, name: str) -> dict:
    """The model with its projections rounded to e4m3 rows: the bf16 kernels on it, the FP8 weight format's
    stepping and default variants, and the FP8 unconstrained step; whether all three answered alike."""
    from decoder_service.models.fp8 import quantize_weights

    started = time.perf_counter()
    quantized = quantize_weights(cfg, weights)
    out: dict = {"fp8_quantize_seconds": time.perf_counter() - started}
    for label, options in (
        ("graph/sparse/fp8-weights-bf16-kernels", {}),
        ("graph/sparse/fp8", {"weight_format": "fp8"}),
        ("graph/sparse/fp8-default", {"weight_format": "fp8", "forced_tail": True, "forced_chains": True}),
    ):
        started = time.perf_counter()
        engine = stepping(quantized, **options)
        load = time.perf_counter() - started
        out[label] = measure_engine(engine) | {"engine_load_seconds": load}
        print(f"{name:18s} {label} {out[label]['ms_per_token']:8.3f} ms/token (loaded in {load:.1f} s)", flush=True)
        if label == "graph/sparse/fp8":
            m = engine.model
            m.set_decode_position(prompt + 10)
            out["fp8_unconstrained_graph_ms_per_token"] = graph_ms(m.stream, m.decode_launches)
        engine.free()
    answers = [out[label]["answers"] for label in ("graph/sparse/fp8-weights-bf16-kernels", "graph/sparse/fp8")]
    out["fp8_same_answers"] = answers[0] == answers[1] == out["graph/sparse/fp8-default"]["answers"]
    return out


def tail_cell(b: dict, key: str) -> str:
    """A figure of the default variant (absent from runs before it existed)."""
    value = b.get("graph/sparse/default", {}).get(key)
    return "-" if value is None else f"{value:.3f} ms"


def _yes_no(flag: bool | None) -> str:
    """A recorded check, or "not recorded" where the run's bench did not record it."""
    return "not recorded" if flag is None else "yes" if flag else "no"


def end_to_end_section(log: Path) -> list[str]:
    """The product's own output on the GPU (registry, decoder on the CUDA engine, example decodes), when run."""
    if not log.exists():
        return []
    keep = re.compile(r"(registry listening|decoder listening|pushed:|  compiled|> |   |\d+\. )")
    shown = [re.sub(r" \(data in .*\)$", "", line) for line in log.read_text().splitlines() if keep.match(line)]
    return [
        "",
        "## End to end: `tooltrie up --once --engine cuda` on a tiny synthetic Qwen3 (random weights)",
        "",
        "Registry, decoder on the CUDA engine, the 42-tool example catalog pushed and activated, three example",
        "decodes streamed (the answers of random weights carry no meaning; the path does):",
        "",
        "```",
        *shown,
        "```",
    ]


def write_report(run_dir: Path, results_dir: Path) -> None:
    """Fold one gpu_run.sh output folder (gates, CPU parity, this benchmark) into results/gpu_engine.{json,md}."""
    env, keyed = run_env(run_dir)
    sha = keyed.get("cuda_sources_sha256", "?")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    bench = json.loads((run_dir / "bench_gpu_decode.json").read_text())
    gates = [m for m in metrics if m["kind"] == "gate"]
    parity = [m for m in metrics if m["kind"] == "cpu_parity"]
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "gpu_engine.json").write_text(
        json.dumps(
            {
                "commit": git_commit(),
                "date": env[0],
                "device": env[1],
                "cuda_sources_sha256": sha,
                "cubin_sha256": keyed.get("cubin_sha256"),
                "env": env,
                "gates": gates,
                "cpu_parity": parity,
                "bench": bench,
            },
            indent=2,
        )
        + "\n"
    )
    lines = [
        "# CUDA engine on the GPU: grammar step, device-resident loop, bit-identity gates",
        "",
        f"- date: {env[0]}",
        f"- commit: {git_commit()}",
        f"- device: {env[1]} (name, driver, memory, max SM clock)",
        f"- toolchain: {env[2]}; {env[4]}",
        *code_identity_lines(keyed),
        "- command: `OUT=<dir> scripts/gpu_run.sh` from the repository root, then "
        f"`python3 bench/gpu_decode.py --report <dir> --results {results_dir}`",
        "",
        "## Bit-identity gates (tests/decoder_service/engines/cuda/test_engine_gpu.py)",
        "",
        "Synthetic Qwen3 (`tiny` preset, seed 7), a 40-name catalog of token sequences, 20 intents of random ids,",
        "k = 4; every step's token, winning logit bits and log-prob bits compared, plus the published pointers.",
        "",
        "| gate | result |",
        "| --- | --- |",
    ]
    for g in gates:
        extra = ", ".join(f"{k} {v}" for k, v in g.items() if k not in ("kind", "name", "identical"))
        lines.append(
            f"| {g['name']} | {'identical' if g['identical'] else 'DIFFERENT'}{f' ({extra})' if extra else ''} |"
        )
    lines += [
        "",
        "## Pointers against the CPU reference engine (50 intents, k = 3, 40-name catalog)",
        "",
        "Intents whose CPU answer has a step with a top-2 legal margin <= 0.05 are near ties and not compared.",
        "",
        "| model | intents | compared | near ties | flips (compared) | flips (near ties) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for p in parity:
        hard = [f for f in p["flips"] if not f["near_tie"]]
        soft = [f for f in p["flips"] if f["near_tie"]]
        lines.append(
            f"| {p['name']} | {p['intents']} | {p['compared']} | {p['near_ties']} | {len(hard)} | {len(soft)} |"
        )
    lines.append("")
    for p in parity:
        for f in p["flips"]:
            lines.append(
                f"- {p['name']} intent {f['intent']}: CPU {f['cpu']}, CUDA {f['cuda']} "
                f"(smallest CPU margin {f['margin']:.4f})"
            )
    lines += [
        "",
        "## Decode time per token, batch 1 (bench/gpu_decode.py)",
        "",
        "Random bf16 weights, 200-token cached prefix, 10-token intents, k = 3, 40-name catalog; median over 10",
        "answers of decode wall time / generated tokens (pointers streamed to the host while the loop runs).",
        "Every column but the last two runs a forward pass after every token but the last, so it times a step;",
        "the default columns are the product's, which takes the answer's forced end (the tokens after which the",
        "grammar leaves one legal token at every step) without forward passes and feeds the tokens it forces after",
        "a chosen one through the same pass (up to 4), timed per generated token and per forward pass.",
        "Kernels are launched with programmatic dependent launch (PDL) unless the column says otherwise. The",
        "default merges each head's attention chunks inside a thread-block cluster (attention_decode_cluster, for",
        "requests within 256 positions); it took that kernel: "
        + ", ".join(f"{b['shape']} {_yes_no(b.get('cluster_merge_used'))}" for b in bench["shapes"])
        + ". The global-merge column merges through global records and a counter (attention_decode) instead; the"
        " short-attention column does so with attention_decode_short (no merge past 32 chunks compiled in), which"
        " the product takes for requests past 256 and within 1,024 positions.",
        "",
        "| model | graph + sparse | graph + sparse, no PDL | graph + sparse, global merge "
        "| graph + sparse, short attention "
        "| graph + sparse, persistent decode kernel | graph + dense | host + sparse | host + dense "
        "| forward only (graph) | unconstrained forward + dense head + argmax (graph) | tokens per answer "
        "| default: per token | default: per forward pass (passes per answer) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in bench["shapes"]:
        no_pdl = b.get("graph/sparse/no-pdl", {}).get("ms_per_token", float("nan"))
        global_merge = b.get("graph/sparse/global-merge", {}).get("ms_per_token", float("nan"))
        short = b.get("graph/sparse/short", {}).get("ms_per_token")  # absent from runs before the short form
        short_cell = "not run" if short is None else f"{short:.3f} ms"
        persistent = b.get("graph/sparse/persistent", {}).get("ms_per_token", float("nan"))
        lines.append(
            f"| {b['shape']} | {b['graph/sparse']['ms_per_token']:.3f} ms | {no_pdl:.3f} ms | {global_merge:.3f} ms "
            f"| {short_cell} | {persistent:.3f} ms "
            f"| {b['graph/dense']['ms_per_token']:.3f} ms "
            f"| {b['host/sparse']['ms_per_token']:.3f} ms | {b['host/dense']['ms_per_token']:.3f} ms "
            f"| {b.get('forward_only_graph_ms_per_token', float('nan')):.3f} ms "
            f"| {b['unconstrained_graph_ms_per_token']:.3f} ms | {b['graph/sparse']['tokens_per_answer']:.1f} "
            f"| {tail_cell(b, 'ms_per_token')} | {tail_cell(b, 'ms_per_forward_pass')}"
            f" ({b.get('graph/sparse/default', {}).get('forward_passes_per_answer', float('nan')):.1f}) |"
        )
    lines += [
        "",
        "Pointers that reached the host while the device loop was still running (graph + sparse): "
        + ", ".join(
            f"{b['shape']} {100 * b['graph/sparse']['pointers_streamed_before_loop_end']:.0f}%" for b in bench["shapes"]
        )
        + " (the last pointer is published as the loop ends, so about (k-1)/k is the expected share).",
        "",
        "The unconstrained step (forward + dense head + argmax, graph) with the persistent decode kernel: "
        + ", ".join(
            f"{b['shape']} {b.get('persistent_unconstrained_graph_ms_per_token', float('nan')):.3f} ms"
            for b in bench["shapes"]
        )
        + " (the layered launch list's is in the table).",
        "",
        "All eight variants gave the same answers: "
        + ", ".join(f"{b['shape']} {'yes' if b['all_variants_same_answers'] else 'NO'}" for b in bench["shapes"])
        + ".",
    ]
    lines += fp8_section(bench["shapes"])
    lines += end_to_end_section(run_dir / "e2e.log")
    (results_dir / "gpu_engine.md").write_text("\n".join(lines) + "\n")


def fp8_section(shapes: list[dict]) -> list[str]:
    """The FP8 weight format's table (absent from runs before it existed)."""
    shapes = [b for b in shapes if "graph/sparse/fp8" in b]
    if not shapes:
        return []
    lines = [
        "",
        "## FP8 weights (e4m3 rows, power-of-two row scales)",
        "",
        "The same models with every layer projection rounded to e4m3 rows (`--weights fp8`; embeddings, head and",
        "norms stay bf16). The bf16 kernels on those weights and the FP8 weight format (single-token GEMVs reading",
        "e4m3 bytes, the same bits) must give the same answers; graph loop, sparse head, a forward pass per token",
        "but for the default column.",
        "",
        "| model | bf16 weights: graph + sparse | FP8 weights, bf16 kernels | FP8 weight format "
        "| FP8 default: per token (per forward pass) | FP8 unconstrained step (graph) | same answers "
        "| quantize (s) | FP8 engine load (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in shapes:
        default = b["graph/sparse/fp8-default"]
        lines.append(
            f"| {b['shape']} | {b['graph/sparse']['ms_per_token']:.3f} ms "
            f"| {b['graph/sparse/fp8-weights-bf16-kernels']['ms_per_token']:.3f} ms "
            f"| {b['graph/sparse/fp8']['ms_per_token']:.3f} ms "
            f"| {default['ms_per_token']:.3f} ms ({default['ms_per_forward_pass']:.3f} ms) "
            f"| {b['fp8_unconstrained_graph_ms_per_token']:.3f} ms | {'yes' if b['fp8_same_answers'] else 'NO'} "
            f"| {b['fp8_quantize_seconds']:.1f} | {b['graph/sparse/fp8']['engine_load_seconds']:.1f} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench_gpu_decode.json"))
    parser.add_argument("--report", type=Path, help="fold a gpu_run.sh output folder into --results and exit")
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--shapes", nargs="+", default=["smollm2-shape", "qwen3-1.7b-shape"], choices=list(SHAPES))
    parser.add_argument("--intents", type=int, default=10)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--fp8-only", action="store_true", help="only graph + sparse and the FP8 variants")
    args = parser.parse_args()
    if args.report:
        write_report(args.report, args.results)
        return 0
    ok, detail = cuda_available()
    if not ok:
        print(f"no usable GPU: {detail}", file=sys.stderr)
        return 2
    results = {
        "device": detail,
        "shapes": [bench_shape(s, args.intents, args.k, args.prompt, args.fp8_only) for s in args.shapes],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(s["all_variants_same_answers"] for s in results["shapes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
