"""bfloat16 <-> float32 by bit manipulation (numpy has no bfloat16 dtype), a block at a time on threads for the
arrays of a model's weights."""

from __future__ import annotations

import numpy as np

from decoder_service.models.blocks import each_block


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 is the top half of an fp32: widen the 16 bits and shift them into place (exact)."""
    flat = np.ascontiguousarray(bits, dtype=np.uint16).reshape(-1)
    out = np.empty(flat.shape, dtype=np.uint32)

    def work(block: slice) -> None:
        out[block] = flat[block]
        out[block] <<= 16

    each_block(flat.size, 1, work)
    return out.view(np.float32).reshape(np.shape(bits))


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even, as torch's ``.to(torch.bfloat16)`` does; NaN stays NaN."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    out = np.empty(flat.shape, dtype=np.uint16)

    def work(block: slice) -> None:
        out[block] = _round_to_bf16_bits(flat[block])

    each_block(flat.size, 1, work)
    return out.reshape(np.shape(values))


def _round_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    nan = np.isnan(values)
    if nan.any():
        rounded = np.where(nan, (bits >> 16) | np.uint32(0x40), rounded)
    return rounded.astype(np.uint16)
