from __future__ import annotations

import numpy as np
import torch

from decoder_service.models.bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from decoder_service.models.blocks import BLOCK_VALUES


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


def test_arrays_of_many_blocks_convert_as_torch_does_and_keep_their_shape() -> None:
    # Past BLOCK_VALUES values the conversions run a block per thread: every block must land in its place.
    rng = np.random.default_rng(1)
    values = (rng.standard_normal((3, BLOCK_VALUES + 123)) * 10.0 ** rng.integers(-8, 8, (3, 1))).astype(np.float32)
    bits = float32_to_bf16_bits(values)
    assert bits.shape == values.shape
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bits, theirs)
    widened = bf16_bits_to_float32(bits)
    assert widened.shape == values.shape
    assert np.array_equal(widened, torch.from_numpy(theirs.view(np.int16)).view(torch.bfloat16).float().numpy())


def test_empty_and_scalar_arrays() -> None:
    assert float32_to_bf16_bits(np.zeros((0, 4), np.float32)).shape == (0, 4)
    assert bf16_bits_to_float32(np.uint16(0x3F80)) == 1.0
