"""Shared pieces of the GPU tests: skip logic, the cubin, device buffers with NaN poisoning, metric records."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoder_service.engines.cuda.driver import Stream, cuda_available
from decoder_service.engines.cuda.memory import NAN_WORD, DeviceBuffer, to_bf16_bits
from decoder_service.engines.cuda.module import Launch, Module
from decoder_service.models.bf16 import bf16_bits_to_float32

AVAILABLE, REASON = cuda_available()
requires_gpu = [pytest.mark.gpu, pytest.mark.skipif(not AVAILABLE, reason=f"no usable CUDA device: {REASON}")]
METRICS_ENV = "TOOLTRIE_GPU_METRICS"  # path of a JSON-lines file that collects measured errors
CUBIN_ENV = "TOOLTRIE_CUBIN"  # a prebuilt cubin; otherwise the tests build one


def record(kind: str, name: str, **values: Any) -> None:
    path = os.environ.get(METRICS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, "name": name, **values}) + "\n")


def load_module(tmp_dir: Path) -> Module:
    prebuilt = os.environ.get(CUBIN_ENV)
    if prebuilt:
        return Module(Path(prebuilt))
    from tooltrie.cuda_build import build_cubin

    return Module(build_cubin(tmp_dir))


def bf16_random(
    rng: np.random.Generator, shape: tuple[int, ...] | int, scale: float = 1.0, offset: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(bf16 bits, their exact float64 values) of normal(offset, scale) samples."""
    bits = to_bf16_bits((offset + scale * rng.standard_normal(shape)).astype(np.float32))
    return bits, bf16_bits_to_float32(bits).astype(np.float64)


KV_NAN_PAIR = 0x7FC07FC0  # two bf16 NaNs in one 32-bit fill


class Device:
    """Upload, poison, launch and read back, freeing everything at the end of a test."""

    def __init__(self, module: Module, stream: Stream) -> None:
        self.module = module
        self.stream = stream
        self.buffers: list[DeviceBuffer] = []

    def put(self, array: np.ndarray) -> DeviceBuffer:
        buf = DeviceBuffer.from_array(np.ascontiguousarray(array), self.stream)
        self.buffers.append(buf)
        return buf

    def poisoned_kv(self, count: int) -> DeviceBuffer:
        """A KV cache of ``count`` bf16 NaNs (cuda/kv_cache.cuh's entries)."""
        return self.poisoned((count + 1) // 2, word=KV_NAN_PAIR)

    def get_kv(self, buf: DeviceBuffer, shape: tuple[int, ...]) -> np.ndarray:
        """A KV cache's entries as the kernels read them (bf16 widened to fp32, exactly)."""
        return bf16_bits_to_float32(buf.download(np.uint16, shape, self.stream))

    def poisoned(self, count: int, itemsize: int = 4, word: int = NAN_WORD) -> DeviceBuffer:
        """A buffer of NaNs: any element a kernel fails to write stays NaN and fails the comparison."""
        buf = DeviceBuffer(count * itemsize)
        buf.fill_u32(word, self.stream)
        self.buffers.append(buf)
        return buf

    def get(self, buf: DeviceBuffer, dtype: type, shape: tuple[int, ...] | int) -> np.ndarray:
        return buf.download(dtype, shape, self.stream)

    def launch(
        self,
        name: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: list[tuple[str, int | float]],
        shared: int = 0,
    ) -> None:
        Launch(self.module.kernel(name), grid, block, args, shared)(self.stream)
        self.stream.synchronize()

    def free(self) -> None:
        for buf in self.buffers:
            buf.free()
        self.buffers.clear()
