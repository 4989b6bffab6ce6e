"""Two cubins' decode attention kernels, bit for bit, on the same random inputs.

A change that claims "the same bits" for decode attention (a new merge, a new load order) is checked against the
revision before it: every decode attention kernel (single token, cluster merge, forced chain, chain cluster; the
generic body and the _hd128 / _hd64 forms; 24 and 5 blocks a head) runs in both cubins on the same q|k|v rows and
caches at positions from 0 to 4,700, and their outputs and written cache rows are compared word for word. Build the
two cubins from two revisions (`scripts/gpu_ab.sh` does it for timings), then on a GPU machine:

    PYTHONPATH=. python3 bench/gpu_attention_bits.py BEFORE.cubin AFTER.cubin

Prints how many kernel runs were compared and which differ; exits 1 if any does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import gpu_missing  # noqa: E402
from decoder_service.engines.cuda.driver import Stream  # noqa: E402
from decoder_service.engines.cuda.module import Module  # noqa: E402
from tests.decoder_service.engines.cuda.gpu_harness import Device, bf16_random  # noqa: E402
from tests.decoder_service.engines.cuda.test_kernels_gpu import (  # noqa: E402
    _chain_rows_args,
    _decode_attention_args,
    rope_table,
)

F32 = np.float32
HEADS, KV_HEADS, CONTEXT, CHAIN_TOKENS = 16, 8, 4864, 4
POSITIONS = (0, 5, 31, 32, 100, 200, 255, 300, 700, 1023, 1024, 1100, 2047, 3000, 4249, 4291, 4700)
CLUSTER_POSITIONS = 256  # the cluster merge holds up to 8 chunks of 32


def single_runs(hd: int, pos0: int) -> list[tuple[str, int]]:
    runs = [(f"attention_decode_hd{hd}", 24), (f"attention_decode_hd{hd}", 5), ("attention_decode", 24)]
    if pos0 < CLUSTER_POSITIONS:
        runs += [(f"attention_decode_cluster_hd{hd}", 8), ("attention_decode_cluster", 8)]
    return runs


def chain_runs(hd: int, pos0: int) -> list[tuple[str, int]]:
    runs = [(f"attention_decode_chain_hd{hd}", 24), ("attention_decode_chain", 24)]
    if pos0 + CHAIN_TOKENS <= CLUSTER_POSITIONS:
        runs.append((f"attention_decode_chain_cluster_hd{hd}", 8))
    return runs


def run_kernels(
    dev: Device, hd: int, pos0: int, qkv: np.ndarray, norms: tuple[np.ndarray, np.ndarray], caches: tuple
) -> list[tuple[str, int, np.ndarray, np.ndarray | None]]:
    """(kernel, blocks a head, output words, the new K row's words or None) of every kernel at pos0."""
    chunks = CONTEXT // 32
    k_bits, v_bits = caches
    table = rope_table(dev, CONTEXT, hd, 1e6).ptr
    qn, kn = dev.put(norms[0]).ptr, dev.put(norms[1]).ptr
    results = []
    for kernel, blocks in single_runs(hd, pos0):
        kb, vb, out = dev.put(k_bits), dev.put(v_bits), dev.poisoned(HEADS * hd)
        part, done = dev.poisoned(HEADS * chunks * (hd + 2)), dev.put(np.zeros(HEADS, dtype=np.int32))
        bufs = {"qkv": dev.put(qkv[0]).ptr, "q_norm": qn, "k_norm": kn, "k": kb.ptr, "v": vb.ptr}
        bufs |= {"partial": part.ptr, "out": out.ptr, "done": done.ptr, "pos": 0}
        args = _decode_attention_args(bufs, ("i32", pos0), HEADS, KV_HEADS, hd, table, 1e-6, chunks)
        dev.launch(kernel, (HEADS, blocks, 1), (256, 1, 1), args)
        k_row = dev.get(kb, np.uint16, (CONTEXT, KV_HEADS, hd))[pos0]
        results.append((kernel, blocks, dev.get(out, np.uint32, HEADS * hd), k_row))
    for kernel, blocks in chain_runs(hd, pos0):
        kb, vb = dev.put(k_bits), dev.put(v_bits)
        out = dev.poisoned(CHAIN_TOKENS * HEADS * hd)
        part = dev.poisoned(CHAIN_TOKENS * HEADS * chunks * (hd + 2))
        done = dev.put(np.zeros(CHAIN_TOKENS * HEADS, dtype=np.int32))
        pos_ptr = dev.put(np.array([pos0], dtype=np.int32)).ptr
        count_ptr = dev.put(np.array([CHAIN_TOKENS], dtype=np.int32)).ptr
        qkv_ptr = dev.put(qkv).ptr
        rows = {"qkv": qkv_ptr, "k_norm": kn, "k": kb.ptr, "v": vb.ptr, "pos": pos_ptr, "count": count_ptr}
        rows_args = _chain_rows_args(rows, HEADS, KV_HEADS, hd, table, 1e-6)
        dev.launch("attention_chain_rows", (CHAIN_TOKENS, KV_HEADS, 1), (max(32, hd), 1, 1), rows_args)
        bufs = {"qkv": qkv_ptr, "q_norm": qn, "k_norm": kn, "k": kb.ptr, "v": vb.ptr}
        bufs |= {"partial": part.ptr, "out": out.ptr, "done": done.ptr, "pos": pos_ptr}
        args = _decode_attention_args(bufs, ("ptr", count_ptr), HEADS, KV_HEADS, hd, table, 1e-6, chunks)
        dev.launch(kernel, (HEADS, blocks, CHAIN_TOKENS), (256, 1, 1), args)
        results.append((kernel, blocks, dev.get(out, np.uint32, CHAIN_TOKENS * HEADS * hd), None))
    dev.free()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the cubin of the revision before the change")
    parser.add_argument("after", type=Path, help="the cubin with the change")
    args = parser.parse_args()
    if gpu_missing():
        return 2
    modules = [Module(args.before), Module(args.after)]
    stream = Stream()
    devs = [Device(module, stream) for module in modules]
    rng = np.random.default_rng(7)
    compared, differ = 0, []
    for hd in (128, 64):
        width = (HEADS + 2 * KV_HEADS) * hd
        norms = (bf16_random(rng, hd, 0.2, 1.0)[0], bf16_random(rng, hd, 0.2, 1.0)[0])
        caches = (bf16_random(rng, (CONTEXT, KV_HEADS, hd))[0], bf16_random(rng, (CONTEXT, KV_HEADS, hd))[0])
        for pos0 in POSITIONS:
            qkv = rng.standard_normal((CHAIN_TOKENS, width)).astype(F32)
            before, after = (run_kernels(dev, hd, pos0, qkv, norms, caches) for dev in devs)
            for (kernel, blocks, out0, row0), (_, _, out1, row1) in zip(before, after, strict=True):
                compared += 1
                same_row = row0 is None or np.array_equal(row0, row1)
                if not np.array_equal(out0, out1) or not same_row or np.isnan(out0.view(F32)).any():
                    differ.append(f"{kernel} ({blocks} blocks a head) at head_dim {hd}, position {pos0}")
    print(f"{compared} decode attention kernel runs compared, {len(differ)} differ")
    for line in differ:
        print(f"  differs: {line}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
