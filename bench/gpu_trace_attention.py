"""Where the time of one decode layer's attention and the GEMV after it goes, from timestamps the kernels take.

Builds a second cubin with -DTT_TRACE (probes TT_MARK in cuda/attention_decode.cuh and the GEMVs; the
product's cubin has none), runs the Qwen3-1.7B-shaped decode step's first launches (embedding, layer 0's qkv
GEMV, attention, o GEMV) with programmatic dependent launch, after a 200-token prefill, replayed as one CUDA
graph as the engine does (or launched from the host one by one, --host-launch, where the host's launch gaps show).
Writes, for each probe, the earliest, median and latest block in microseconds from the attention's first block
start, and every attention block's probes. Timing probes perturb little (one store per block and probe).

    PYTHONPATH=. python3 bench/gpu_trace_attention.py --out trace.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_forward import QWEN3_1_7B, capture, synthetic_weights  # noqa: E402
from bench.machine import gpu_missing  # noqa: E402
from decoder_service.engines.cuda.driver import call  # noqa: E402
from decoder_service.engines.cuda.forward import ATTN_CHUNK, CudaModel  # noqa: E402
from decoder_service.engines.cuda.module import Module  # noqa: E402
from tooltrie.cuda_build import CUDA_DIR, ENTRY, NVCC_FLAGS, find_nvcc  # noqa: E402

SLOTS = 8192
ATTN_PROBES = [
    "entry",
    "after pdl wait",
    "q (and k) rotated, new row written",
    "block barrier passed",
    "K products done",
    "score rows reduced",
    "scores done",
    "softmax done",
    "V done",
    "chunks done",
    "counted in",
    "merge inputs loaded",
    "merge done",
    # Inside the global merge (the cluster merge has neither): between "merge inputs loaded" and "merge done".
    "merge weights ready",
    "merge sums done",
]
GEMV_PROBES = ["entry", "after pdl wait", "input staged", "rows done"]
GEMV_SLOT = 6144


def traced_cubin(out_dir: Path) -> Path:
    target = out_dir / "tooltrie-trace.cubin"
    cmd = [find_nvcc() or "nvcc", *NVCC_FLAGS, "-DTT_TRACE", "-o", str(target), ENTRY]
    subprocess.run(cmd, check=True, cwd=CUDA_DIR)
    return target


def read_trace(module: Module, model: CudaModel) -> np.ndarray:
    ptr, size = module.get_global("tt_trace")
    out = np.zeros((SLOTS, 2), dtype=np.uint64)
    model.stream.synchronize()
    call("cuMemcpyDtoH", out.ctypes.data, ptr, size)
    return out


def summarise(trace: np.ndarray, slots: list[int], t0: int) -> dict[str, float]:
    ns = np.array([int(trace[s, 0]) for s in slots if trace[s, 0]], dtype=np.int64)
    if ns.size == 0:
        return {}
    rel = (ns - t0) / 1e3
    return {"first_us": float(rel.min()), "median_us": float(np.median(rel)), "last_us": float(rel.max())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("trace_attention.json"))
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--max-context",
        type=int,
        default=0,
        help="the model's KV capacity (default: the prompt + 16, four blocks a head)",
    )
    parser.add_argument(
        "--host-launch",
        action="store_true",
        help="launch the kernels one by one from the host instead of replaying them as one CUDA graph (the host's "
        "launch gaps then show between kernels)",
    )
    parser.add_argument(
        "--warm", action="store_true", help="run the attention launch twice and trace the second (caches warm)"
    )
    args = parser.parse_args()
    if gpu_missing():
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        module = Module(traced_cubin(Path(tmp)))
    cfg = QWEN3_1_7B
    max_context = args.max_context or args.prompt + 16
    model = CudaModel(cfg, synthetic_weights(cfg, seed=0), module, max_context=max_context, max_prefill=256)
    model.prefill(np.random.default_rng(1).integers(0, cfg.vocab_size, args.prompt).tolist())
    model.read_token()
    model.set_decode_position(args.prompt)
    launches = model.decode_launches[:4]  # embedding, qkv, attention, o
    if args.warm:
        launches.insert(2, launches[2])
    heads, splits = launches[2].grid[0], launches[2].grid[1]
    o_blocks = launches[-1].grid[0]
    if heads * splits * len(ATTN_PROBES) > GEMV_SLOT:  # cuda/attention_decode.cuh's probes end below the GEMV's
        raise SystemExit(f"{heads} x {splits} attention blocks need more probe slots than {GEMV_SLOT}")
    graph = None if args.host_launch else capture(model.stream, launches)
    runs = []
    for _ in range(args.repeats):
        if graph is None:
            for launch in launches:
                launch(model.stream)
        else:
            call("cuGraphLaunch", graph, model.stream.handle)
        trace = read_trace(module, model)
        attn_blocks = range(heads * splits)
        stride = len(ATTN_PROBES)  # slots per attention block: ATTN_TRACE_PROBES in cuda/attention_decode.cuh
        t0 = int(min(trace[b * stride, 0] for b in attn_blocks))
        run: dict[str, dict[str, dict[str, float]]] = {"attention": {}, "gemv_o": {}}
        for i, name in enumerate(ATTN_PROBES):
            run["attention"][name] = summarise(trace, [b * stride + i for b in attn_blocks], t0)
        for i, name in enumerate(GEMV_PROBES):
            slots = [GEMV_SLOT + b * 4 + i for b in range(o_blocks)]
            run["gemv_o"][name] = summarise(trace, slots, t0)
        # the block that scores the new token (last chunk) of head 0, probe by probe
        last = (args.prompt // ATTN_CHUNK) % splits
        run["head0_last_chunk_block_us"] = {
            name: (int(trace[last * stride + i, 0]) - t0) / 1e3
            for i, name in enumerate(ATTN_PROBES)
            if trace[last * stride + i, 0]
        }
        run["raw_attention"] = {  # per block (head-major): [probe ns from t0 or null, ...] and SM clocks
            "ns": [
                [
                    int(trace[b * stride + i, 0]) - t0 if trace[b * stride + i, 0] else None
                    for i in range(len(ATTN_PROBES))
                ]
                for b in attn_blocks
            ],
            "clk": [
                [
                    int(trace[b * stride + i, 1]) - int(trace[b * stride, 1]) if trace[b * stride + i, 0] else None
                    for i in range(len(ATTN_PROBES))
                ]
                for b in attn_blocks
            ],
        }
        runs.append(run)
        call("cuMemsetD8", module.get_global("tt_trace")[0], 0, SLOTS * 16)
    result = {
        "model": "qwen3-1.7b-shape",
        "prompt": args.prompt,
        "max_context": max_context,
        "warm": args.warm,
        "launched": "host, one by one" if args.host_launch else "one CUDA graph",
        "runs": runs,
    }
    if graph is not None:
        call("cuGraphExecDestroy", graph)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in runs[-1].items() if not k.startswith("raw")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
