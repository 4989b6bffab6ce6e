"""FP8 (e4m3) weights with one power-of-two scale per output row, in numpy (which has no fp8 dtype).

A quantized row holds values ``code * 2**e``: ``code`` an e4m3 number (at most 448 in magnitude, 3 mantissa bits)
and ``e`` the row's exponent. Such a value has at most 4 significant bits, so it is exactly a bf16 and an fp32:
every engine computes with the same numbers, whether it reads them as bf16 (the CPU engine, prefill, forced
chains) or as fp8 bytes and a row scale (the CUDA engine's single-token GEMVs, which multiply the row's sum by
``2**e`` at the end: rounding commutes with scaling by a power of two, so the sums are the bf16 path's bits unless a
partial sum falls among fp32's subnormals, below 2**-126, which real activations and weights do not reach).

The scale is a power of two so that the dequantized weights stay exact; the price is at most one binade of
e4m3's range per row against a free scale.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from decoder_service.models.bf16 import bf16_bits_to_float32
from decoder_service.models.blocks import each_block
from decoder_service.models.config import ModelConfig
from decoder_service.models.weights import Weights

E4M3_MAX = 448.0
# A row's exponent e is the smallest with max|row| <= 448 * 2**e; at least this, so that the row's smallest
# nonzero value (2**-9 * 2**e) is still a normal fp32 and bf16.
MIN_ROW_EXPONENT = -117
_MIN_NORMAL = np.float32(2.0**-6)  # e4m3's smallest normal; below it, multiples of 2**-9

#: The layer projections that FP8 quantization rounds (Hugging Face names after ``model.layers.N.``). Embeddings,
#: the head, norms and biases stay bf16.
QUANTIZED_PROJECTIONS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
WEIGHT_FORMATS = ("bf16", "fp8")


def round_to_e4m3(values: np.ndarray) -> np.ndarray:
    """Each value rounded to the nearest e4m3 number, ties to even (float32 out). Magnitudes past 448 raise:
    the row scale keeps every value within range, and a silent clamp would hide a wrong scale."""
    v = np.asarray(values, dtype=np.float32)
    a = np.abs(v)
    if a.size and not np.all(a <= E4M3_MAX):
        raise ValueError(f"values outside e4m3's range (|v| <= {E4M3_MAX:g}) or not finite; largest {np.max(a)!r}")
    # Normal range: keep 3 of fp32's 23 mantissa bits, rounding to nearest even on the 20 dropped ones. (In place
    # where possible: a model's projections are a billion values or more.)
    bits = a.view(np.uint32)
    rounded = bits >> 20
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFFF)
    rounded += bits
    rounded &= np.uint32(0xFFF00000)
    out = rounded.view(np.float32)
    # Subnormal range: multiples of 2**-9. Adding 2**14, whose fp32 neighbours are 2**-9 apart, rounds to the
    # nearest multiple, ties to even; subtracting it again is exact.
    subnormal = a + np.float32(2.0**14)
    subnormal -= np.float32(2.0**14)
    np.copyto(out, subnormal, where=a < _MIN_NORMAL)
    return np.copysign(out, v, out=out)


def e4m3_codes(values: np.ndarray) -> np.ndarray:
    """The e4m3 bytes (sign, 4 exponent bits with bias 7, 3 mantissa bits) of values that are e4m3 numbers.

    An e4m3 number times 2**-8 is an fp16 whose bits, shifted right by 7, are the e4m3 byte's exponent and mantissa
    (the exponent biases differ by 8; e4m3's subnormals land on fp16's subnormals), and both conversions are
    exact."""
    half = (np.asarray(values, dtype=np.float32) * np.float32(2.0**-8)).astype(np.float16).view(np.uint16)
    code = half >> 7
    code &= np.uint16(0x7F)
    code |= (half >> 8) & np.uint16(0x80)
    return code.astype(np.uint8)


def row_exponents(rows: np.ndarray) -> np.ndarray:
    """Per row of a 2-D array, the smallest e with max|row| <= 448 * 2**e (at least MIN_ROW_EXPONENT), as int32."""
    peak = np.max(np.abs(np.asarray(rows, dtype=np.float32)), axis=1)
    if not np.all(np.isfinite(peak)):
        raise ValueError("rows with infinite or NaN values cannot be quantized")
    # peak = f * 2**x with f in [0.5, 1); 448 = 0.875 * 2**9, so e = x - 9 when f <= 0.875, else x - 8.
    fraction, exponent = np.frexp(peak)
    e = np.where(fraction <= 0.875, exponent - 9, exponent - 8)
    return np.maximum(e, MIN_ROW_EXPONENT).astype(np.int32)


def _row_scales(e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(2**e, 2**-e) as float32 columns: multiplying by them is exact, and far faster than np.ldexp."""
    return np.ldexp(np.float32(1), e)[:, None], np.ldexp(np.float32(1), -e)[:, None]


def quantize_rows(rows: np.ndarray) -> np.ndarray:
    """A 2-D weight with each row rounded to e4m3 times its power-of-two scale (float32, exact as bf16)."""
    values = np.asarray(rows, dtype=np.float32)
    out = np.empty(values.shape, dtype=np.float32)

    def work(block: slice) -> None:
        scale, inverse = _row_scales(row_exponents(values[block]))
        out[block] = round_to_e4m3(values[block] * inverse)
        out[block] *= scale

    each_block(*values.shape, work)
    return out


def fp8_rows(rows: np.ndarray, name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 bytes, float32 row scales 2**e) of a weight whose rows are already e4m3 numbers times a power of two,
    given as float32 or as bf16 bits (uint16, widened a block at a time).

    Raises ValueError naming the weight and the first row that is not: FP8 kernels fed a bf16 weight would round
    it, and the engines would then disagree."""
    source = np.asarray(rows)
    bf16 = source.dtype == np.uint16
    if not bf16:
        source = np.asarray(source, dtype=np.float32)
    codes = np.empty(source.shape, dtype=np.uint8)
    scales = np.empty(source.shape[0], dtype=np.float32)
    inexact: list[int] = []

    def work(block: slice) -> None:
        values = bf16_bits_to_float32(source[block]) if bf16 else source[block]
        scale, inverse = _row_scales(row_exponents(values))
        scaled = values * inverse
        exact = (round_to_e4m3(scaled) == scaled).all(axis=1)
        if not exact.all():
            inexact.append(block.start + int(np.argmin(exact)))
        codes[block] = e4m3_codes(scaled)
        scales[block] = scale.ravel()

    each_block(*source.shape, work)
    if inexact:
        raise ValueError(
            f"{name}: row {min(inexact)} is not e4m3 times a power of two; quantize the model's weights first "
            "(weight format 'fp8' when loading it)"
        )
    return codes, scales


def quantize_weights(
    config: ModelConfig, weights: Weights, progress: Callable[[int, int], None] = lambda done, total: None
) -> Weights:
    """The model with every layer projection (QUANTIZED_PROJECTIONS) rounded to e4m3 rows with power-of-two
    scales, as float32; other tensors unchanged. ``progress(done, total)`` after each layer."""
    out = dict(weights)
    for i in range(config.num_layers):
        for suffix in QUANTIZED_PROJECTIONS:
            name = f"model.layers.{i}.{suffix}"
            out[name] = quantize_rows(_as_float32(weights[name]))
        progress(i + 1, config.num_layers)
    return out


def _as_float32(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.uint16:  # bf16 bits
        return bf16_bits_to_float32(array)
    return np.asarray(array, dtype=np.float32)
