"""Prefill attention alone: `attention` (a block per head and token) against attention_prefill_hd128 (a block per kv
head and group of tokens) at 1 to 4 tokens a block, on the Qwen3-1.7B shape (16 heads of 128, 8 kv heads).

Each case fills a bf16 cache with random rows, launches each kernel on the same q rows at a first position pos0, and
times repeated launches of one shape on one stream (wall time over the launches, after one warm-up); every grouped
output is compared with `attention`'s (relative difference, ||grouped - attention|| / ||attention||: the grouped
kernel's products run on the tensor cores with bf16 hi and lo terms, so the bits differ). On a GPU machine:

    PYTHONPATH=. python3 bench/gpu_prefill_attention.py [--out FILE]

Prints what ran where (date, commit, device, the sources' and cubin's hashes), then one JSON object a case: µs a
launch and the relative difference; exits 1 if any difference passes MAX_DIFFERENCE. (docs/cuda-speed-notes.md
#135-#139 quote its numbers for the kernel's earlier forms.)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.kernel_bench import Row, kernel_bench_main, launch_us  # noqa: E402
from decoder_service.engines.cuda.driver import Stream  # noqa: E402
from decoder_service.engines.cuda.forward import ATTN_THREADS, prefill_attention_shared  # noqa: E402
from decoder_service.engines.cuda.memory import DeviceBuffer  # noqa: E402
from decoder_service.engines.cuda.module import Launch, Module  # noqa: E402
from tests.decoder_service.engines.cuda.gpu_harness import Device, bf16_random  # noqa: E402
from tests.decoder_service.engines.cuda.reference import rel_err  # noqa: E402

HD, HEADS, KV_HEADS = 128, 16, 8
# (first position, tokens, timed launches): a request suffix after the 1,000-name catalog's prompt, after short
# prompts, and a 512-token chunk of a long prompt's own prefill.
CASES = ((4249, 36, 20), (200, 36, 20), (1000, 36, 20), (3737, 512, 5))
TOKENS_PER_BLOCK = (1, 2, 3, 4)
MAX_DIFFERENCE = 1e-4  # the GPU kernel test's bound against float64


def run_case(module: Module, stream: Stream, pos0: int, tokens: int, repeats: int) -> dict[str, object]:
    dev = Device(module, stream)
    rng = np.random.default_rng(pos0)
    context = pos0 + tokens + 64
    qkv = rng.standard_normal((tokens, (HEADS + 2 * KV_HEADS) * HD)).astype(np.float32)
    k_bits, v_bits = bf16_random(rng, (context, KV_HEADS, HD))[0], bf16_random(rng, (context, KV_HEADS, HD))[0]
    qb, kb, vb = dev.put(qkv), dev.put(k_bits), dev.put(v_bits)
    scale = ("f32", HD**-0.5)

    def args(out: DeviceBuffer) -> list[tuple[str, int | float]]:
        return [("ptr", qb.ptr), ("ptr", kb.ptr), ("ptr", vb.ptr), ("ptr", out.ptr), ("ptr", 0), ("i32", pos0)]

    plain = module.kernel("attention")
    plain.set_max_dynamic_shared(context * 4)  # one score per position
    reference = dev.poisoned(tokens * HEADS * HD)
    launch = Launch(
        plain,
        (HEADS, tokens, 1),
        (ATTN_THREADS, 1, 1),
        [*args(reference), ("i32", HEADS), ("i32", KV_HEADS), ("i32", HD), scale],
        context * 4,
    )
    row: dict[str, object] = {"pos0": pos0, "tokens": tokens, "attention_us": launch_us(stream, launch, repeats)}
    want = dev.get(reference, np.float32, tokens * HEADS * HD).astype(np.float64)
    grouped, shared = module.kernel(f"attention_prefill_hd{HD}"), prefill_attention_shared(HD)
    grouped.set_max_dynamic_shared(shared)
    for per_block in TOKENS_PER_BLOCK:
        out = dev.poisoned(tokens * HEADS * HD)
        launch = Launch(
            grouped,
            (KV_HEADS, -(-tokens // per_block), 1),
            (ATTN_THREADS, 1, 1),
            [*args(out), ("i32", tokens), ("i32", per_block), ("i32", HEADS), ("i32", KV_HEADS), scale],
            shared,
        )
        us = launch_us(stream, launch, repeats)
        diff = rel_err(dev.get(out, np.float32, tokens * HEADS * HD), want)
        row[f"grouped_{per_block}_tokens_a_block"] = {"us": us, "difference": diff}
    dev.free()
    return row


def all_rows(module: Module, stream: Stream) -> Iterator[Row]:
    for pos0, tokens, repeats in CASES:
        yield run_case(module, stream, pos0, tokens, repeats)


def failed(rows: list[Row]) -> bool:
    grouped = [v for r in rows for key, v in r.items() if key.startswith("grouped_") and isinstance(v, dict)]
    return any(not v["difference"] <= MAX_DIFFERENCE for v in grouped)


if __name__ == "__main__":
    sys.exit(kernel_bench_main(__doc__, all_rows, failed))
