"""Where the persistent decode kernel's time goes, from timestamps it takes (cuda/decode_persistent.cuh's probes).

Builds a second cubin with -DTT_TRACE (the product's cubin has no probes), runs the Qwen3-1.7B-shaped decode step
(embedding, then the persistent kernel) as one CUDA graph after a prefill of each prompt length, and reads each
block's timer at every phase's start (its part of the phase before done), inside it (the input staged; attention:
the first task's record written) and at its end, for the first PDEC_TRACE_LAYERS layers. Prints, per phase of layers
1 and 2, the phase's span (first start to last end over the blocks) and its hand-over (its last end to the first
block's next phase's input staged), and writes every block's timestamps (null where a block has no work in a phase).

    PYTHONPATH=. python3 bench/gpu_trace_persistent.py --out trace_persistent.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_forward import QWEN3_1_7B, capture, synthetic_weights  # noqa: E402
from bench.gpu_trace_attention import read_trace, traced_cubin  # noqa: E402
from bench.machine import gpu_missing  # noqa: E402
from decoder_service.engines.cuda.driver import call  # noqa: E402
from decoder_service.engines.cuda.forward import CudaModel  # noqa: E402
from decoder_service.engines.cuda.module import Module  # noqa: E402
from tooltrie.cuda_build import CUDA_DIR  # noqa: E402

PHASES = ["qkv", "attention", "o", "gate_up", "down"]
MARKS = ["start", "inside", "end"]


def _define(name: str) -> int:
    source = (CUDA_DIR / "decode_persistent.cuh").read_text()
    return int(re.search(rf"#define {name} (\d+)", source).group(1))


TRACE_LAYERS = _define("PDEC_TRACE_LAYERS")


def phase_table(rel: np.ndarray) -> list[dict[str, float | str | int]]:
    """Per phase of layers 1 and 2 (layer 0 starts cold): its span over the blocks and its hand-over, from its last
    end to the first block's input of the next phase staged (attention: its first record)."""
    rows = []
    for layer in (1, 2):
        for p, name in enumerate(PHASES):
            start, inside, end = rel[:, layer, p, 0], rel[:, layer, p, 1], rel[:, layer, p, 2]
            nxt_layer, nxt_phase = (layer, p + 1) if p + 1 < len(PHASES) else (layer + 1, 0)
            nxt = np.nanmin(rel[:, nxt_layer, nxt_phase, 1])
            rows.append(
                {
                    "layer": layer,
                    "phase": name,
                    "span_us": float(np.nanmax(end) - np.nanmin(start)),
                    "inside_after_start_median_us": float(np.nanmedian(inside - start)),
                    "end_median_after_start_us": float(np.nanmedian(end - start)),
                    "next_input_after_last_end_us": float(nxt - np.nanmax(end)),
                }
            )
    return rows


def trace_prompt(module: Module, weights: dict, prompt_len: int, repeats: int) -> dict[str, object]:
    cfg = QWEN3_1_7B
    model = CudaModel(cfg, weights, module, max_context=1024, max_prefill=256, decode_kernel="persistent")
    try:
        prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, prompt_len).tolist()
        model.prefill(prompt)
        model.read_token()
        model.set_decode_position(prompt_len)
        graph = capture(model.stream, model.decode_launches[:2])  # the embedding and the persistent kernel
        # Marks of earlier launches would stay where the last replay writes none (a block without attention
        # tasks there): cleared first, they read as no mark.
        ptr, size = module.get_global("tt_trace")
        model.stream.synchronize()
        call("cuMemsetD8", ptr, 0, size)
        for _ in range(repeats):  # the last replay's timestamps remain
            call("cuGraphLaunch", graph, model.stream.handle)
        trace = read_trace(module, model).astype(np.int64)
        call("cuGraphExecDestroy", graph)
        blocks = model.persistent.grid
    finally:
        model.free()
    ns = trace[: blocks * TRACE_LAYERS * len(PHASES) * len(MARKS), 0]
    ns = ns.reshape(blocks, TRACE_LAYERS, len(PHASES), len(MARKS))
    rel = np.where(ns > 0, (ns - ns[:, 0, 0, 0].min()) / 1e3, np.nan)  # no mark: the block had no work there
    per_layer = float((np.nanmin(rel[:, 3, 0, 0]) - np.nanmin(rel[:, 1, 0, 0])) / 2)
    return {
        "prompt": prompt_len,
        "blocks": blocks,
        "us_per_layer": per_layer,
        "phases": phase_table(rel),
        "blocks_us": np.where(np.isnan(rel), None, rel.round(3)).tolist(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("trace_persistent.json"))
    parser.add_argument("--prompts", type=int, nargs="+", default=[200, 708])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if gpu_missing():
        return 2
    module = Module(traced_cubin(args.out.parent.resolve()))
    weights = synthetic_weights(QWEN3_1_7B, seed=0)
    results = [trace_prompt(module, weights, n, args.repeats) for n in args.prompts]
    for r in results:
        print(f"{r['prompt']}-token context: {r['us_per_layer']:.2f} µs per layer (layers 1-2)")
        for row in r["phases"]:
            print(
                f"  layer {row['layer']} {row['phase']:9s} span {row['span_us']:6.2f} µs, next input "
                f"{row['next_input_after_last_end_us']:5.2f} µs after its end"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": "qwen3-1.7b-shape (random bf16)", "traces": results}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
