"""bfloat16 <-> float32 by bit manipulation (numpy has no bfloat16 dtype)."""

from __future__ import annotations

import numpy as np


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 is the top half of an fp32: widen the 16 bits and shift them into place (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even, as torch's ``.to(torch.bfloat16)`` does; NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    nan = np.isnan(values)
    if nan.any():
        rounded = np.where(nan, (bits >> 16) | np.uint32(0x40), rounded)
    return rounded.astype(np.uint16)
