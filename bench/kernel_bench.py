"""What the kernel-alone benchmarks (bench/gpu_prefill_attention.py, bench/gpu_prefill_gemm.py) share: the time of
one launch shape, and their command line (a cubin in; what ran where, then one JSON row a case out; optionally a
JSON file holding both, and a report rendered from that file)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import git_commit, gpu_missing  # noqa: E402
from decoder_service.engines.cuda import driver  # noqa: E402
from decoder_service.engines.cuda.driver import Stream, multiprocessor_count  # noqa: E402
from decoder_service.engines.cuda.module import Launch, Module  # noqa: E402
from tooltrie.cuda_build import cubin_sha256, cuda_sources_sha256  # noqa: E402

Row = dict[str, object]
Report = Callable[[dict[str, Any], Path], Path]  # (a --out file's contents, results folder) -> the file written


def launch_us(stream: Stream, launch: Launch, repeats: int) -> float:
    """Wall µs a launch over ``repeats`` launches of one shape, after one warm-up."""
    launch(stream)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        launch(stream)
    stream.synchronize()
    return round((time.perf_counter() - t0) / repeats * 1e6, 1)


def script_path() -> str:
    """The running script, relative to the repository where it lies in it (no folder of this machine)."""
    script = Path(sys.argv[0]).resolve()
    return script.relative_to(REPO).as_posix() if script.is_relative_to(REPO) else script.name


def run_header(args: argparse.Namespace) -> dict[str, Any]:
    """What ran where: date, commit, device and its SMs, the kernels' sources and cubins, the command."""
    header = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "commit": git_commit(),
        "device": driver.device_name(),
        "sms": multiprocessor_count(),
        "cuda_sources_sha256": cuda_sources_sha256(),
        "cubin_sha256": cubin_sha256(args.cubin),
        "command": f"PYTHONPATH=. python3 {script_path()}",
    }
    if getattr(args, "base_cubin", None):  # the file names stay out: they are this machine's
        header["command"] += " --base-cubin OLD.cubin"
        header["base_cubin_sha256"] = cubin_sha256(args.base_cubin)
    return header


def kernel_bench_main(
    doc: str,
    rows_of: Callable[..., Iterator[Row]],
    failed: Callable[[list[Row]], bool],
    *,
    ab: bool = False,
    report: Report | None = None,
) -> int:
    """Parse --cubin and --out; print what ran where (one JSON object), then each row ``rows_of`` yields as it
    comes; write both to --out ({"run": ..., "rows": [...]}); exit 2 without a usable GPU, 1 where ``failed`` says
    the rows show a fault (outputs that differ), else 0. With ``ab``, --base-cubin names a second cubin whose
    kernels ``rows_of`` times and compares beside --cubin's: it is called as rows_of(module, stream, base), base
    None without the option. With ``report``, --report FILE --results DIR renders an --out file into DIR instead
    (no GPU needed)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--cubin", type=Path, default=REPO / "cuda" / "build" / "tooltrie.cubin")
    parser.add_argument("--out", type=Path, help="also write what ran and the rows as one JSON file")
    if ab:
        parser.add_argument("--base-cubin", type=Path, help="time this cubin's kernels too; compare their outputs")
    if report is not None:
        parser.add_argument("--report", type=Path, help="render this --out file into --results and exit")
        parser.add_argument("--results", type=Path, default=Path("results"))
    args = parser.parse_args()
    if report is not None and args.report is not None:
        print(f"wrote {report(json.loads(args.report.read_text()), args.results)}")
        return 0
    if gpu_missing():
        return 2
    module, stream = Module(args.cubin), Stream()
    header = run_header(args)
    print(json.dumps({"run": header}), flush=True)
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
        args.out.write_text(json.dumps({"run": header, "rows": rows}, indent=2) + "\n")
    return 1 if failed(rows) else 0
