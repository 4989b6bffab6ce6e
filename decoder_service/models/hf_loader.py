"""Load a Hugging Face checkpoint directory: ``config.json`` plus one or many ``.safetensors`` files."""

from __future__ import annotations

import json
from pathlib import Path

from decoder_service.models.config import ModelConfig
from decoder_service.models.hf_config import read_hf_config
from decoder_service.models.safetensors_io import read_safetensors
from decoder_service.models.weights import Weights, as_float32, validate_weights

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def safetensors_files(model_dir: Path) -> list[Path]:
    """The shard list of the index file when there is one, else the single ``model.safetensors``."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shard {missing[0]!r}, which is not in {model_dir}")
        return [model_dir / s for s in shards]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    raise FileNotFoundError(f"{model_dir} holds neither {SINGLE_FILE} nor {INDEX_FILE}")


def load_hf_dir(model_dir: Path) -> tuple[ModelConfig, Weights]:
    """Config and fp32 weights of a llama/qwen2/qwen3 safetensors checkpoint, validated against each other."""
    config = read_hf_config(model_dir)
    weights: Weights = {}
    for shard in safetensors_files(model_dir):
        tensors = read_safetensors(shard)
        clash = set(tensors) & set(weights)
        if clash:
            raise ValueError(f"tensor {sorted(clash)[0]!r} appears in more than one shard of {model_dir}")
        weights |= tensors
    return config, as_float32(validate_weights(config, weights, source=str(model_dir)))
