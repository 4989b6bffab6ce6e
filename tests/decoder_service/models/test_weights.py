from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from decoder_service.models.synth import PRESETS, synthetic_weights
from decoder_service.models.weights import expected_shapes, validate_weights

TINY = PRESETS["tiny"]


def _weights(config=TINY):
    return dict(synthetic_weights(config, seed=0))


def test_expected_shapes_per_architecture() -> None:
    qwen3 = expected_shapes(TINY)
    assert qwen3["model.layers.1.self_attn.q_norm.weight"] == (16,)
    assert qwen3["model.layers.0.self_attn.k_proj.weight"] == (32, 64)
    assert "lm_head.weight" not in qwen3
    qwen2 = expected_shapes(dataclasses.replace(TINY, architecture="qwen2", tie_word_embeddings=False))
    assert qwen2["model.layers.0.self_attn.v_proj.bias"] == (32,)
    assert qwen2["lm_head.weight"] == (TINY.vocab_size, 64)
    assert not any("q_norm" in k for k in qwen2)


def test_shape_mismatch_names_tensor_and_both_shapes() -> None:
    w = _weights()
    w["model.layers.1.mlp.up_proj.weight"] = np.zeros((129, 64), np.float32)
    with pytest.raises(ValueError, match=r"'model.layers.1.mlp.up_proj.weight' has shape \(129, 64\).*\(128, 64\)"):
        validate_weights(TINY, w)


def test_missing_and_unexpected_tensors() -> None:
    w = _weights()
    del w["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing, first 'model.norm.weight' with shape \(64,\)"):
        validate_weights(TINY, w)
    w = _weights() | {"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)}
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'"):
        validate_weights(TINY, w)


def test_tied_head_written_out_is_dropped_only_when_equal() -> None:
    w = _weights()
    w["lm_head.weight"] = w["model.embed_tokens.weight"].copy()
    assert "lm_head.weight" not in validate_weights(TINY, w)
    w["lm_head.weight"][0, 0] += 1
    with pytest.raises(ValueError, match=r"differs from model\.embed_tokens\.weight"):
        validate_weights(TINY, w)
