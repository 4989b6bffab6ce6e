"""Prefill GEMMs alone: the tensor-core kernels on the Qwen3-1.7B shape's four projections (qkv, o, gate|up, down),
for a 36-token request suffix and a 512-token prompt chunk, with the grid and shared memory the model gives them;
where gemm_mma16_ring_bf16 applies (docs/cuda-speed-notes.md #140: two batches of weights in flight a warp), it
beside gemm_mma16_bf16, their outputs compared word for word.

Each case fills random bf16 weights and fp32 inputs and times repeated launches of one shape on one stream (wall
time over the launches, after one warm-up). On a GPU machine:

    PYTHONPATH=. python3 bench/gpu_prefill_gemm.py [--out FILE]

Prints one JSON object a case: µs a launch and the weight bytes over that time for each kernel, and whether the
ring kernel's outputs matched; exits 1 if any differ.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.kernel_bench import Row, kernel_bench_main, launch_us  # noqa: E402
from decoder_service.engines.cuda.driver import Stream, multiprocessor_count  # noqa: E402
from decoder_service.engines.cuda.forward import gemm_mma_grid, gemm_mma_kernel  # noqa: E402
from decoder_service.engines.cuda.module import Launch, Module  # noqa: E402
from tests.decoder_service.engines.cuda.gpu_harness import Device, bf16_random  # noqa: E402

# (name, output rows, input width): Qwen3-1.7B's projections
SHAPES = (("qkv", 4096, 2048), ("o", 2048, 2048), ("gate_up", 12288, 2048), ("down", 2048, 6144))
CASES = ((36, 20), (512, 5))  # (tokens, timed launches)
THREADS = 256


def run_case(module: Module, stream: Stream, sms: int, shape: tuple[str, int, int], m: int, repeats: int) -> Row:
    name, n_out, k_in = shape
    dev = Device(module, stream)
    rng = np.random.default_rng(n_out + k_in + m)
    w_bits = bf16_random(rng, (n_out, k_in), 0.05)[0]
    x = rng.standard_normal((m, k_in)).astype(np.float32)
    wb, xb = dev.put(w_bits), dev.put(x)
    plain, ring = gemm_mma_kernel(k_in), gemm_mma_kernel(k_in, ring=True)
    forms = [plain] if ring == plain else [plain, ring]
    row: dict[str, object] = {"shape": name, "tokens": m}
    outputs = []
    for kernel, tokens, shared in forms:
        module.kernel(kernel).set_max_dynamic_shared(shared)
        grid = gemm_mma_grid(m, n_out, tokens, sms)
        out = dev.poisoned(m * n_out)
        args = [("ptr", xb.ptr), ("ptr", wb.ptr), ("ptr", 0), ("ptr", 0), ("ptr", out.ptr)]
        args += [("i32", m), ("i32", n_out), ("i32", k_in)]
        us = launch_us(stream, Launch(module.kernel(kernel), grid, (THREADS, 1, 1), args, shared), repeats)
        tb_s = round(n_out * k_in * 2 / (us * 1e-6) / 1e12, 2)
        row[kernel] = {"us": us, "weight_tb_s": tb_s, "grid": list(grid)}
        outputs.append(dev.get(out, np.float32, m * n_out).view(np.uint32))
    if len(outputs) == 2:
        row["same_bits"] = bool(np.array_equal(outputs[0], outputs[1]))
    dev.free()
    return row


def all_rows(module: Module, stream: Stream) -> Iterator[Row]:
    sms = multiprocessor_count()
    for m, repeats in CASES:
        for shape in SHAPES:
            yield run_case(module, stream, sms, shape, m, repeats)


def failed(rows: list[Row]) -> bool:
    return any(r.get("same_bits") is False for r in rows)


if __name__ == "__main__":
    sys.exit(kernel_bench_main(__doc__, all_rows, failed))
