"""What the kernel-alone benchmarks (bench/gpu_prefill_attention.py, bench/gpu_prefill_gemm.py) share: the time of
one launch shape, and their command line (a cubin in, one JSON row a case out, optionally a JSON file)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import gpu_missing  # noqa: E402
from decoder_service.engines.cuda.driver import Stream  # noqa: E402
from decoder_service.engines.cuda.module import Launch, Module  # noqa: E402

Row = dict[str, object]


def launch_us(stream: Stream, launch: Launch, repeats: int) -> float:
    """Wall µs a launch over ``repeats`` launches of one shape, after one warm-up."""
    launch(stream)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        launch(stream)
    stream.synchronize()
    return round((time.perf_counter() - t0) / repeats * 1e6, 1)


def kernel_bench_main(
    doc: str, rows_of: Callable[..., Iterator[Row]], failed: Callable[[list[Row]], bool], *, ab: bool = False
) -> int:
    """Parse --cubin and --out, print each row ``rows_of`` yields as it comes, write them all to --out; exit 2
    without a usable GPU, 1 where ``failed`` says the rows show a fault (outputs that differ), else 0. With ``ab``,
    --base-cubin names a second cubin whose kernels ``rows_of`` times and compares beside --cubin's: it is called
    as rows_of(module, stream, base), base None without the option."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--cubin", type=Path, default=REPO / "cuda" / "build" / "tooltrie.cubin")
    parser.add_argument("--out", type=Path, help="also write the rows as a JSON list")
    if ab:
        parser.add_argument("--base-cubin", type=Path, help="time this cubin's kernels too; compare their outputs")
    args = parser.parse_args()
    if gpu_missing():
        return 2
    module, stream = Module(args.cubin), Stream()
    if ab:
        base = Module(args.base_cubin) if args.base_cubin else None
        cases = rows_of(module, stream, base)
    else:
        cases = rows_of(module, stream)
    rows = []
    for row in cases:
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 1 if failed(rows) else 0
