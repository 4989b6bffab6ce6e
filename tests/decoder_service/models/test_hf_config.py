from __future__ import annotations

import pytest

from decoder_service.models.hf_config import config_from_hf, config_to_hf
from decoder_service.models.synth import PRESETS


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_round_trip(preset: str) -> None:
    assert config_from_hf(config_to_hf(PRESETS[preset])) == PRESETS[preset]


def test_defaults_follow_transformers() -> None:
    hf = {
        "model_type": "llama",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
    }
    cfg = config_from_hf(hf)
    assert cfg.num_kv_heads == 8  # no num_key_value_heads: multi-head attention
    assert cfg.head_dim == 8  # hidden / heads
    assert cfg.tie_word_embeddings is False


def test_rope_theta_from_transformers5_rope_parameters() -> None:
    hf = config_to_hf(PRESETS["tiny"])
    del hf["rope_theta"]
    hf["rope_parameters"] = {"rope_theta": 5.0, "rope_type": "default"}
    assert config_from_hf(hf).rope_theta == 5.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "mistral"}, "model_type 'mistral'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"use_sliding_window": True}, "use_sliding_window is true"),
        ({"model_type": "llama", "attention_bias": True}, "attention_bias or mlp_bias"),
    ],
)
def test_refuses_unsupported(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_hf(config_to_hf(PRESETS["tiny"]) | change)
