"""A per-sequence key/value cache: fixed-capacity arrays per layer, filled in position order."""

from __future__ import annotations

from typing import Literal

import numpy as np

from decoder_service.models.bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from decoder_service.models.config import ModelConfig

# What a cache entry holds. "bf16": keys and values rounded to bfloat16 (nearest, ties to even) as they are stored,
# as the CUDA engine's cache holds them (cuda/kv_cache.cuh), so both engines attend over the same values; the
# product's default. "fp32": unrounded, for parity with an fp32 reference.
KVPrecision = Literal["bf16", "fp32"]
KV_PRECISIONS: tuple[KVPrecision, ...] = ("bf16", "fp32")


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """The float32 values a bf16 cache entry holds once ``x`` is stored."""
    return bf16_bits_to_float32(float32_to_bf16_bits(x))


class KVCache:
    """Keys and values of every layer for positions ``0 .. length-1``, shape [capacity, kv_heads, head_dim], as
    float32 arrays that hold ``precision``'s values."""

    def __init__(self, config: ModelConfig, capacity: int, precision: KVPrecision = "bf16") -> None:
        if precision not in KV_PRECISIONS:
            raise ValueError(f"KV cache precision must be one of {', '.join(KV_PRECISIONS)}; got {precision!r}")
        shape = (config.num_layers, capacity, config.num_kv_heads, config.head_dim)
        self.keys = np.zeros(shape, dtype=np.float32)
        self.values = np.zeros(shape, dtype=np.float32)
        self.length = 0
        self.precision = precision

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def reserve(self, count: int) -> None:
        """Refuse before computing anything when ``count`` more positions would not fit."""
        if self.length + count > self.capacity:
            raise ValueError(
                f"KV cache holds {self.length} of {self.capacity} positions; "
                f"{count} more do not fit (raise the capacity or shorten the prompt)"
            )

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store the new positions' k, v for one layer; return that layer's keys and values so far."""
        end = self.length + k.shape[0]
        if self.precision == "bf16":
            k, v = round_to_bf16(k), round_to_bf16(v)
        self.keys[layer, self.length : end] = k
        self.values[layer, self.length : end] = v
        return self.keys[layer, :end], self.values[layer, :end]

    def advance(self, count: int) -> None:
        """Commit ``count`` positions once every layer has written them."""
        self.length += count

    def fork(self, extra: int) -> KVCache:
        """A copy holding this cache's positions with room for ``extra`` more (a prefix reused per request)."""
        child = KVCache.__new__(KVCache)
        n = self.length
        child.keys = np.zeros((self.keys.shape[0], n + extra, *self.keys.shape[2:]), dtype=np.float32)
        child.values = np.zeros_like(child.keys)
        child.keys[:, :n] = self.keys[:, :n]
        child.values[:, :n] = self.values[:, :n]
        child.length = n
        child.precision = self.precision
        return child
