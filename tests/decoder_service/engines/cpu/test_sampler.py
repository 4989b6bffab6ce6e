from __future__ import annotations

import math

import numpy as np
import pytest

from decoder_service.engines.cpu.sampler import greedy_pick


def test_argmax_with_ties_to_the_lower_id() -> None:
    legal = np.array([3, 10, 42, 99], np.int32)
    assert greedy_pick(legal, np.array([0.5, 2.0, 2.0, 1.0], np.float32))[0] == 10
    assert greedy_pick(legal, np.array([2.0, 1.0, 1.0, 2.0], np.float32))[0] == 3


def test_score_is_log_softmax_over_the_legal_logits() -> None:
    logits = np.array([1.5, -0.25, 3.0], np.float32)
    _, score = greedy_pick(np.array([1, 2, 3], np.int32), logits)
    expected = 3.0 - math.log(sum(math.exp(float(x)) for x in logits))
    assert score == pytest.approx(expected, abs=1e-6)
    assert greedy_pick(np.array([7], np.int32), np.array([-1e4], np.float32)) == (7, 0.0)


def test_refuses_empty_masks_and_non_finite_logits() -> None:
    with pytest.raises(ValueError, match="no legal token"):
        greedy_pick(np.array([], np.int32), np.array([], np.float32))
    with pytest.raises(ValueError, match="non-finite logit for legal token 8"):
        greedy_pick(np.array([5, 8], np.int32), np.array([1.0, np.inf], np.float32))
