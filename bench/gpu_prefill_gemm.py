"""Prefill GEMMs alone: the tensor-core kernels on the Qwen3-1.7B shape's four projections (qkv, o, gate|up, down), for
request suffixes of 16 to 128 tokens and a 512-token prompt chunk, with the grid and shared memory the model gives
them: gemm_mma16_bf16 (gemm_mma8_bf16 for the down rows) in each of its row-group forms (64 rows, r32 and r128:
docs/cuda-speed-notes.md #148), the 64-row form on sixteen warps (gemm_mma16w_bf16, #149), gemm_mma16h_bf16 for the
down rows (16 tokens with each K-quarter staged in two phases, #142) and the cluster GEMM (cuda/gemm_cluster.cuh,
#141: each weight read once by a cluster of four blocks), their outputs compared word for word; `engine` names the
kernel the model launches for the case.

Each case fills random bf16 weights and fp32 inputs and times repeated launches of one shape on one stream (wall
time over the launches, after one warm-up), every kernel once a round, the faster of two rounds kept. On a GPU
machine:

    PYTHONPATH=. python3 bench/gpu_prefill_gemm.py [--out FILE] [--base-cubin OLD.cubin]
    python3 bench/gpu_prefill_gemm.py --report FILE --results results/h100   # FILE: an --out file; no GPU needed

Prints what ran where (date, commit, device, the sources' and cubins' hashes), then one JSON object a case: µs a
launch and the weight bytes over that time for each kernel, and whether the other kernels' outputs matched the
first's; with --base-cubin, also each gemm_mma kernel of that cubin, launched right after the same kernel of --cubin
on the same inputs (kernels that cubin lacks are skipped), its µs (base_us) and whether its output has the same bits
(same_bits_as_base). Exits 1 if any outputs differ.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.kernel_bench import Row, kernel_bench_main, launch_us  # noqa: E402
from decoder_service.engines.cuda.driver import CudaError, Stream, multiprocessor_count  # noqa: E402
from decoder_service.engines.cuda.forward import (  # noqa: E402
    GEMM_HALVES_TOKENS,
    GEMM_MMA_ROW_FORMS,
    GEMM_MMA_ROWS,
    gemm_mma_fitting_rows,
    gemm_mma_kernel,
    gemm_mma_launch,
    gemm_mma_row_kernel,
    gemm_mma_wide_kernel,
)
from decoder_service.engines.cuda.gemm_cluster import cluster_grid, cluster_plan  # noqa: E402
from decoder_service.engines.cuda.module import Launch, Module  # noqa: E402
from tests.decoder_service.engines.cuda.gpu_harness import Device, bf16_random  # noqa: E402

# (name, output rows, input width): Qwen3-1.7B's projections
SHAPES = (("qkv", 4096, 2048), ("o", 2048, 2048), ("gate_up", 12288, 2048), ("down", 2048, 6144))
CASES = ((16, 20), (36, 20), (64, 20), (128, 10), (512, 5))  # (tokens, timed launches)
THREADS = 256
ROUNDS = 2  # each kernel's time: the faster of this many rounds


def run_case(
    module: Module, stream: Stream, sms: int, shape: tuple[str, int, int], m: int, repeats: int, base: Module | None
) -> Row:
    name, n_out, k_in = shape
    dev = Device(module, stream)
    rng = np.random.default_rng(n_out + k_in + m)
    w_bits = bf16_random(rng, (n_out, k_in), 0.05)[0]
    x = rng.standard_normal((m, k_in)).astype(np.float32)
    wb, xb = dev.put(w_bits), dev.put(x)
    engine = gemm_mma_launch(k_in, m, n_out, sms, GEMM_HALVES_TOKENS)
    row: dict[str, object] = {"shape": name, "tokens": m, "engine": engine.kernel if engine else None}
    outputs = []
    base_args = [("ptr", xb.ptr), ("ptr", wb.ptr), ("ptr", 0), ("ptr", 0)]
    sizes = [("i32", m), ("i32", n_out), ("i32", k_in)]
    launches = []  # (kernel, its module, output buffer, launch)
    # Each row-group form that fits, the 64-row form on sixteen warps, then the halves form where it applies: the
    # launches the engine would make with those settings.
    fits = gemm_mma_fitting_rows(gemm_mma_kernel(k_in)[1], k_in)
    forms = [gemm_mma_launch(k_in, m, n_out, sms, rows=rows, warps=8) for rows in fits]
    if GEMM_MMA_ROWS in fits:
        forms.append(gemm_mma_launch(k_in, m, n_out, sms, rows=GEMM_MMA_ROWS, warps=16))
    halves = gemm_mma_launch(k_in, m, n_out, sms, halves_tokens=m)
    if halves is not None and halves.kernel == "gemm_mma16h_bf16":
        forms.append(halves)
    for form in forms:
        assert form is not None, "every shape here takes the tensor-core GEMM"
        kernel, shared, grid, threads = form
        for mod in (module, base) if base is not None and has_kernel(base, kernel) else (module,):
            mod.kernel(kernel).set_max_dynamic_shared(shared)
            out = dev.poisoned(m * n_out)
            args = [*base_args, ("ptr", out.ptr), *sizes]
            launches.append((kernel, mod, out, Launch(mod.kernel(kernel), grid, (threads, 1, 1), args, shared)))
    plan = cluster_plan(m, k_in, max_tokens=m)
    if plan is not None:
        cluster = module.kernel(plan.kernel)
        cluster.set_max_dynamic_shared(plan.shared)
        most = cluster.max_active_clusters((1, 4, 1), (THREADS, 1, 1), plan.shared)
        grid = cluster_grid(m, n_out, plan.tokens, most)
        out = dev.poisoned(m * n_out)
        args = [*base_args, ("ptr", out.ptr), *sizes, ("i32", plan.depth)]
        launches.append((plan.kernel, module, out, Launch(cluster, grid, (THREADS, 1, 1), args, plan.shared)))
    times: list[list[float]] = [[] for _ in launches]
    for _ in range(ROUNDS):  # every kernel once a round, so drift between rounds falls on all of them
        for spent, (_, _, _, launch) in zip(times, launches, strict=True):
            spent.append(launch_us(stream, launch, repeats))
    for spent, (kernel, mod, out, launch) in zip(times, launches, strict=True):
        us = min(spent)
        bits = dev.get(out, np.float32, m * n_out).view(np.uint32)
        if mod is base:  # the base cubin's kernel, launched just after the same kernel of --cubin
            entry = row[kernel]
            assert isinstance(entry, dict)
            entry["base_us"] = us
            entry["same_bits_as_base"] = bool(np.array_equal(bits, outputs[-1]))
            continue
        tb_s = round(n_out * k_in * 2 / (us * 1e-6) / 1e12, 2)
        row[kernel] = {"us": us, "weight_tb_s": tb_s, "grid": list(launch.grid)}
        outputs.append(bits)
    if len(outputs) > 1:
        row["same_bits"] = all(np.array_equal(outputs[0], o) for o in outputs[1:])
    dev.free()
    return row


def has_kernel(module: Module, name: str) -> bool:
    """Whether the cubin holds the kernel (an older --base-cubin lacks the newer forms)."""
    try:
        module.kernel(name)
    except CudaError:
        return False
    return True


def all_rows(module: Module, stream: Stream, base: Module | None = None) -> Iterator[Row]:
    sms = multiprocessor_count()
    for m, repeats in CASES:
        for shape in SHAPES:
            yield run_case(module, stream, sms, shape, m, repeats, base)


# The report's columns: each kernel's form, by name
FORM_NAMES = {
    **{gemm_mma_row_kernel(t, r): "64 rows" if r == 64 else f"r{r}" for t in (16, 8) for r in GEMM_MMA_ROW_FORMS},
    "gemm_mma16h_bf16": "16h",
    **{gemm_mma_wide_kernel(t): "64 rows w16" for t in (16, 8)},
}


def form_of(kernel: str) -> str:
    return "cluster" if kernel.startswith("gemm_mma_cluster") else FORM_NAMES[kernel]


def write_report(data: dict[str, Any], results_dir: Path) -> Path:
    """Render an --out file as results_dir/gpu_prefill_gemm.md (a row a case, µs a form, the engine's form in bold)
    and copy it beside as gpu_prefill_gemm.json; return the Markdown file."""
    run, rows = data["run"], data["rows"]
    forms = ["64 rows", "64 rows w16", *(f"r{r}" for r in GEMM_MMA_ROW_FORMS if r != 64), "16h", "cluster"]
    base = any("base_us" in v for r in rows for v in r.values() if isinstance(v, dict))
    lines = [
        f"# Prefill GEMMs launched alone, on an {run['device'].removeprefix('NVIDIA ').split()[0]}",
        "",
        f"- date: {run['date']}",
        f"- commit: {run['commit']}",
        f"- device: {run['device']}, {run['sms']} SMs",
        f"- cuda/ sources sha256: `{run['cuda_sources_sha256']}`",
        *([f"- cubin sha256: `{run['cubin_sha256']}`"] if "cubin_sha256" in run else []),
        f"- command: `{run['command']}`, then `python3 bench/gpu_prefill_gemm.py --report FILE --results "
        f"{results_dir.as_posix()}`",
        "",
        "Qwen3-1.7B's projections, random bf16 weights; µs a launch: wall time over back-to-back launches on one "
        "stream after a warm-up, every kernel once a round, the faster of two rounds. The columns are the "
        "tensor-core GEMM's forms (`cuda/gemm.cuh`), each with the grid and shared memory the engine gives it: 64 "
        "rows, r32 and r128: gemm_mma16_bf16 (gemm_mma8_bf16 for the down rows, K = 6,144) with row groups of 64, "
        "32 and 128 rows (`docs/cuda-speed-notes.md` #148); 64 rows w16: the 64-row form on sixteen warps "
        "(gemm_mma16w_bf16, gemm_mma8w_bf16; opt-in, #149); 16h: gemm_mma16h_bf16 (the down rows, 16 tokens "
        "staged in halves, #142); cluster: the cluster GEMM (opt-in, #141). In bold, the form the engine launches "
        "(`gemm_mma_launch` in `decoder_service/engines/cuda/forward.py`). same bits: every form's output equal "
        "word for word to the first's"
        + (
            ", and each kernel's to the same kernel's in the base cubin, launched right after it (µs in brackets)"
            if base
            else ""
        )
        + ". The kernels and their grids per row: the JSON beside this file.",
        "",
        f"| shape | tokens | {' | '.join(forms)} | the engine takes | same bits |",
        "| --- | --- | " + "--- | " * len(forms) + "--- | --- |",
    ]
    for row in rows:
        cells = {form_of(k): v for k, v in row.items() if isinstance(v, dict)}
        engine = form_of(str(row["engine"])) if row["engine"] else "tiled"
        same = row.get("same_bits", True) and all(v.get("same_bits_as_base", True) for v in cells.values())
        times = " | ".join(report_cell(cells.get(form), form == engine) for form in forms)
        lines.append(f"| {row['shape']} | {row['tokens']} | {times} | {engine} | {'yes' if same else 'NO'} |")
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "gpu_prefill_gemm.json").write_text(json.dumps(data, indent=2) + "\n")
    out = results_dir / "gpu_prefill_gemm.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def report_cell(entry: dict[str, Any] | None, engines: bool) -> str:
    """A form's µs (the base cubin's in brackets), in bold where the engine takes the form; empty where it did not
    run."""
    if entry is None:
        return ""
    text = f"{entry['us']}" + (f" ({entry['base_us']})" if "base_us" in entry else "")
    return f"**{text}**" if engines else text


def failed(rows: list[Row]) -> bool:
    entries = [v for r in rows for v in r.values() if isinstance(v, dict)]
    return any(r.get("same_bits") is False for r in rows) or any(v.get("same_bits_as_base") is False for v in entries)


if __name__ == "__main__":
    sys.exit(kernel_bench_main(__doc__, all_rows, failed, ab=True, report=write_report))
