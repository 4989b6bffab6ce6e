from __future__ import annotations

import numpy as np
import pytest

from decoder_service.engines.cpu.lm_head import BLOCK, LMHead


@pytest.mark.parametrize("vocab", [BLOCK * 40, BLOCK * 40 + 13])
def test_sparse_rows_are_bit_identical_to_dense(vocab: int) -> None:
    rng = np.random.default_rng(0)
    head = LMHead(rng.standard_normal((vocab, 96), dtype=np.float32))
    for trial in range(30):
        hidden = rng.standard_normal(96, dtype=np.float32) * 3
        ids = np.sort(rng.choice(vocab, size=int(rng.integers(1, 200)), replace=False))
        dense = head.dense(hidden)
        assert dense.shape == (vocab,)
        assert np.array_equal(head.sparse(hidden, ids), dense[ids]), trial


def test_dense_is_the_matrix_product() -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((200, 32), dtype=np.float32)
    hidden = rng.standard_normal(32, dtype=np.float32)
    np.testing.assert_allclose(LMHead(weight).dense(hidden), weight.astype(np.float64) @ hidden, rtol=1e-5, atol=1e-5)


def test_out_of_range_ids_are_refused() -> None:
    head = LMHead(np.zeros((100, 8), np.float32))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 100\); got 3..100"):
        head.sparse(np.zeros(8, np.float32), np.array([3, 100]))
    assert head.sparse(np.zeros(8, np.float32), np.array([], np.int32)).shape == (0,)
