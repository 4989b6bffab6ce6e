from __future__ import annotations

import numpy as np
import pytest

from decoder_service.engines.cpu.layers import apply_rope, rope_tables
from decoder_service.engines.cpu.model import CpuTransformer

PROMPT = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 9707]


@pytest.fixture(scope="module")
def tiny(tiny_model) -> CpuTransformer:
    return CpuTransformer(*tiny_model)


@pytest.fixture(scope="module")
def tiny_fp32(tiny_model) -> CpuTransformer:
    """An fp32 cache, for comparisons across different splits of one prompt: BLAS may round an 8-row projection
    and a 15-row one differently in the last bit, which a bf16 cache turns into whole bf16 steps."""
    return CpuTransformer(*tiny_model, kv_precision="fp32")


def test_incremental_decode_matches_full_forward(tiny_fp32: CpuTransformer) -> None:
    full = tiny_fp32.forward_all(PROMPT)
    cache = tiny_fp32.new_cache(len(PROMPT))
    steps = [tiny_fp32.logits(tiny_fp32.prefill(PROMPT[:6], cache))]
    steps += [tiny_fp32.logits(tiny_fp32.decode(t, cache)) for t in PROMPT[6:]]
    np.testing.assert_allclose(np.stack(steps), full[5:], atol=1e-6)


def test_forked_prefix_matches_one_prefill(tiny_fp32: CpuTransformer) -> None:
    prefix = tiny_fp32.new_cache(8)
    tiny_fp32.prefill(PROMPT[:8], prefix)
    forked = prefix.fork(len(PROMPT) - 8)
    hidden = tiny_fp32.prefill(PROMPT[8:], forked)
    whole = tiny_fp32.prefill(PROMPT, tiny_fp32.new_cache(len(PROMPT)))
    np.testing.assert_allclose(hidden, whole, atol=1e-6)
    assert prefix.length == 8  # the shared prefix is not written by the request


def test_forked_bf16_prefix_equals_the_prefix_continued_in_place(tiny: CpuTransformer) -> None:
    prefix = tiny.new_cache(8)
    tiny.prefill(PROMPT[:8], prefix)
    snapshot = prefix.keys.copy(), prefix.values.copy()
    hidden = tiny.prefill(PROMPT[8:], prefix.fork(len(PROMPT) - 8))
    in_place = tiny.new_cache(len(PROMPT))
    tiny.prefill(PROMPT[:8], in_place)
    np.testing.assert_array_equal(hidden, tiny.prefill(PROMPT[8:], in_place))
    np.testing.assert_array_equal(prefix.keys, snapshot[0])  # the shared prefix is not written by the request
    np.testing.assert_array_equal(prefix.values, snapshot[1])
    assert prefix.length == 8 and tiny.kv_precision == "bf16"


def test_cache_overflow_is_refused_before_compute(tiny: CpuTransformer) -> None:
    cache = tiny.new_cache(4)
    with pytest.raises(ValueError, match="KV cache holds 0 of 4 positions; 5 more do not fit"):
        tiny.prefill(PROMPT[:5], cache)
    assert cache.length == 0


def test_rope_rotates_pairs_half_apart() -> None:
    cos, sin = rope_tables(np.array([0, 3]), head_dim=8, theta=10000.0)
    x = np.random.default_rng(0).standard_normal((2, 1, 8)).astype(np.float32)
    y = apply_rope(x, cos, sin)
    np.testing.assert_array_equal(y[0], x[0])  # position 0 is the identity
    # Dimension i pairs with i + 4 (rotate_half), and each pair keeps its norm.
    pair_norm = lambda v: v[..., :4] ** 2 + v[..., 4:] ** 2  # noqa: E731
    np.testing.assert_allclose(pair_norm(y[1]), pair_norm(x[1]), rtol=1e-5)
    angle = 3.0  # frequency of pair 0 is 1
    np.testing.assert_allclose(y[1, 0, 0], x[1, 0, 0] * np.cos(angle) - x[1, 0, 4] * np.sin(angle), rtol=1e-5)
