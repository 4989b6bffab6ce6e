"""FP8 (e4m3) rounding, codes and row scales, against torch's float8_e4m3fn as the independent reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decoder_service.models.bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from decoder_service.models.fp8 import (
    E4M3_MAX,
    MIN_ROW_EXPONENT,
    QUANTIZED_PROJECTIONS,
    e4m3_codes,
    fp8_rows,
    quantize_rows,
    quantize_weights,
    round_to_e4m3,
    row_exponents,
)
from decoder_service.models.synth import PRESETS, synthetic_weights


def _torch_e4m3(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(values).to(torch.float8_e4m3fn)


def _every_e4m3_value() -> np.ndarray:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    values = codes.to(torch.float32).numpy()
    return values[np.isfinite(values)]


def test_rounding_matches_torch_over_the_whole_range() -> None:
    rng = np.random.default_rng(7)
    samples = np.concatenate(
        [
            rng.uniform(-E4M3_MAX, E4M3_MAX, 200_000),
            rng.normal(0, 1e-2, 200_000),  # the subnormal range (below 2**-6) and around it
            np.ldexp(rng.uniform(-1, 1, 100_000), rng.integers(-12, 9, 100_000)),
        ]
    ).astype(np.float32)
    # Exact ties between neighbouring e4m3 values: midpoints go to the even mantissa.
    grid = np.sort(np.unique(np.abs(_every_e4m3_value())))
    midpoints = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    samples = np.concatenate([samples, midpoints, -midpoints, grid, -grid])
    expected = _torch_e4m3(samples).to(torch.float32).numpy()
    np.testing.assert_array_equal(round_to_e4m3(samples), expected)


def test_codes_are_torchs_bytes() -> None:
    values = _every_e4m3_value()
    expected = _torch_e4m3(values).view(torch.uint8).numpy()
    np.testing.assert_array_equal(e4m3_codes(values), expected)


def test_values_past_the_range_raise_rather_than_clamp() -> None:
    with pytest.raises(ValueError, match="outside e4m3's range"):
        round_to_e4m3(np.array([1.0, 449.0], dtype=np.float32))
    with pytest.raises(ValueError, match="not finite"):
        round_to_e4m3(np.array([np.nan], dtype=np.float32))


def test_row_exponent_is_the_smallest_that_fits() -> None:
    rows = np.array([[448.0, 1.0], [448.5, 0.0], [0.1, -0.3], [0.0, 0.0], [1e-38, 0.0]], dtype=np.float32)
    e = row_exponents(rows)
    peaks = np.abs(rows).max(axis=1)
    assert np.all(peaks <= E4M3_MAX * np.ldexp(1.0, e))
    smaller = np.ldexp(1.0, e - 1) * E4M3_MAX
    nonzero = (peaks > 0) & (e > MIN_ROW_EXPONENT)
    assert np.all(peaks[nonzero] > smaller[nonzero])
    assert e[0] == 0 and e[1] == 1
    assert e[4] == MIN_ROW_EXPONENT  # the floor: 1e-38 would need 2**-135
    assert not quantize_rows(rows)[3].any()  # a zero row stays zero, whatever its exponent


def test_quantized_rows_are_exact_bf16_and_close_to_the_input() -> None:
    rng = np.random.default_rng(3)
    w = (rng.normal(0, 0.02, (64, 512)) * rng.uniform(0.1, 10, (64, 1))).astype(np.float32)
    q = quantize_rows(w)
    np.testing.assert_array_equal(bf16_bits_to_float32(float32_to_bf16_bits(q)), q)
    # Within half an e4m3 step (2**-4 relative in the normal range) of each value, plus the subnormal step.
    scale = np.ldexp(1.0, row_exponents(w))[:, None]
    assert np.all(np.abs(q - w) <= np.abs(w) * 2.0**-4 + scale * 2.0**-10)
    assert np.array_equal(quantize_rows(q), q)  # rounding twice changes nothing


def test_fp8_rows_give_back_the_quantized_values() -> None:
    rng = np.random.default_rng(5)
    q = quantize_rows(rng.normal(0, 0.05, (16, 256)).astype(np.float32))
    codes, scales = fp8_rows(q)
    assert codes.dtype == np.uint8 and scales.dtype == np.float32
    assert np.all(np.frexp(scales)[0] == 0.5)  # powers of two
    decoded = torch.from_numpy(codes).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    np.testing.assert_array_equal(decoded * scales[:, None], q)


def test_fp8_rows_take_bf16_bits_as_the_engine_holds_them() -> None:
    # The CUDA engine hands over its bf16 copy; each block is widened on its own thread (several blocks here).
    rng = np.random.default_rng(6)
    q = quantize_rows(rng.normal(0, 0.05, (600, 4096)).astype(np.float32))
    bits = float32_to_bf16_bits(q)
    from_bits = fp8_rows(bits)
    from_floats = fp8_rows(q)
    assert all(np.array_equal(a, b) for a, b in zip(from_bits, from_floats, strict=True))
    bits[457, 9] ^= 1  # one more mantissa bit than e4m3 holds
    with pytest.raises(ValueError, match=r"qkv: row 457 is not e4m3"):
        fp8_rows(bits, "qkv")


def test_fp8_rows_refuse_an_unquantized_weight_and_name_it() -> None:
    w = np.full((4, 32), 0.1, dtype=np.float32)
    w[2, 5] = 0.1234567
    with pytest.raises(ValueError, match=r"layer 3 down: row 0 is not e4m3"):
        fp8_rows(w, "layer 3 down")


def test_quantize_weights_rounds_the_projections_only() -> None:
    config = PRESETS["tiny"]
    weights = dict(synthetic_weights(config, seed=1))
    done: list[int] = []
    quantized = quantize_weights(config, weights, progress=lambda n, total: done.append(n))
    assert done == [1, 2]
    for name, value in weights.items():
        if name.endswith(QUANTIZED_PROJECTIONS):
            assert not np.array_equal(quantized[name], value)
            np.testing.assert_array_equal(quantize_rows(quantized[name]), quantized[name])
        else:
            assert quantized[name] is value
