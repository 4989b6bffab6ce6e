"""Read and write a Hugging Face ``config.json`` as a ModelConfig."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from decoder_service.models.config import ARCHITECTURES, ModelConfig

# The class name transformers instantiates for each architecture.
HF_ARCHITECTURE_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from the parsed ``config.json`` of a llama, qwen2 or qwen3 checkpoint."""
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"config.json has model_type {model_type!r}; supported: {', '.join(ARCHITECTURES)}")
    _refuse_unsupported(hf)
    heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    return ModelConfig(
        architecture=model_type,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hidden // heads),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(hf),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` transformers needs to instantiate the same model."""
    hf: dict[str, Any] = {
        "architectures": [HF_ARCHITECTURE_CLASSES[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": config.qkv_bias,
        "rope_scaling": None,
        "torch_dtype": "bfloat16",
    }
    if config.architecture == "qwen2":
        hf["use_sliding_window"] = False
    return hf


def read_hf_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; a Hugging Face model directory needs a config.json")
    return config_from_hf(json.loads(path.read_text()))


def _rope_theta(hf: dict[str, Any]) -> float:
    # transformers 5 nests the theta under rope_parameters; older files keep it at the top level.
    params = hf.get("rope_parameters") or {}
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _refuse_unsupported(hf: dict[str, Any]) -> None:
    scaling = hf.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    params_type = (hf.get("rope_parameters") or {}).get("rope_type", "default")
    for kind in (rope_type, params_type):
        if kind != "default":
            raise ValueError(f"rope scaling {kind!r} is not supported; only plain RoPE (rope_type 'default') is")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported; the engines implement SwiGLU with 'silu'")
    if hf.get("use_sliding_window"):
        raise ValueError("use_sliding_window is true; the engines implement full causal attention only")
    if hf.get("model_type") == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
        raise ValueError("llama checkpoints with attention_bias or mlp_bias are not supported; both must be false")
