from __future__ import annotations

import numpy as np
import torch

from decoder_service.models.bf16 import bf16_bits_to_float32, float32_to_bf16_bits


def test_rounding_matches_torch() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10_000),
            np.array([0.0, -0.0, np.inf, -np.inf, 1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32),
        ]
    )
    ours = float32_to_bf16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)


def test_widening_is_exact() -> None:
    bits = np.arange(0, 2**16, 7, dtype=np.uint16)
    ours = bf16_bits_to_float32(bits)
    theirs = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(ours, theirs, equal_nan=True)


def test_nan_stays_nan() -> None:
    assert np.isnan(bf16_bits_to_float32(float32_to_bf16_bits(np.array([np.nan], np.float32))))[0]
