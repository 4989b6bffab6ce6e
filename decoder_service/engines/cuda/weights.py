"""Upload a model's weights to the device as bf16, fusing q|k|v and gate|up so each layer needs fewer launches."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from decoder_service.engines.cuda.driver import Stream
from decoder_service.engines.cuda.memory import DeviceBuffer, to_bf16_bits
from decoder_service.models.config import ModelConfig
from decoder_service.models.weights import expected_shapes


@dataclass(slots=True)
class LayerWeights:
    input_norm: DeviceBuffer
    qkv: DeviceBuffer  # [(H + 2 KV) * head_dim, hidden]: q rows, then k rows, then v rows
    qkv_bias: DeviceBuffer | None  # Qwen2 only
    q_norm: DeviceBuffer | None  # Qwen3 only
    k_norm: DeviceBuffer | None
    o: DeviceBuffer  # [hidden, H * head_dim]
    post_norm: DeviceBuffer
    gate_up: DeviceBuffer  # [2 * intermediate, hidden]: gate rows, then up rows
    down: DeviceBuffer  # [hidden, intermediate]


@dataclass(slots=True)
class ModelWeights:
    embed: DeviceBuffer
    layers: list[LayerWeights]
    norm: DeviceBuffer
    lm_head: DeviceBuffer  # the embedding buffer itself when tied

    def free(self) -> None:
        seen: set[int] = set()
        for buf in [self.embed, self.norm, self.lm_head, *(b for lw in self.layers for b in _layer_buffers(lw))]:
            if buf is not None and id(buf) not in seen:
                seen.add(id(buf))
                buf.free()


def _layer_buffers(lw: LayerWeights) -> list[DeviceBuffer | None]:
    return [lw.input_norm, lw.qkv, lw.qkv_bias, lw.q_norm, lw.k_norm, lw.o, lw.post_norm, lw.gate_up, lw.down]


class _Source:
    """Reads named tensors, checks their shapes and converts them to bf16 bits."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.weights:
            raise KeyError(f"weight {name!r} is missing; expected shape {shape}")
        array = self.weights[name]
        if tuple(array.shape) != shape:
            raise ValueError(f"weight {name!r} has shape {tuple(array.shape)}, expected {shape}")
        return to_bf16_bits(array)


def upload_weights(config: ModelConfig, weights: dict[str, np.ndarray], stream: Stream) -> ModelWeights:
    """Check every tensor against ``config`` and copy it to the device (bf16; fused where launches share input)."""
    src = _Source(weights)
    c = config
    hd, d = c.head_dim, c.hidden_size
    q_rows, kv_rows = c.num_heads * hd, c.num_kv_heads * hd

    def up(array: np.ndarray) -> DeviceBuffer:
        return DeviceBuffer.from_array(array, stream)

    embed = up(src.get("model.embed_tokens.weight", (c.vocab_size, d)))
    layers = []
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        qkv = np.concatenate(
            [
                src.get(attn + "q_proj.weight", (q_rows, d)),
                src.get(attn + "k_proj.weight", (kv_rows, d)),
                src.get(attn + "v_proj.weight", (kv_rows, d)),
            ]
        )
        bias = None
        if c.qkv_bias:
            bias = up(
                np.concatenate(
                    [
                        src.get(attn + "q_proj.bias", (q_rows,)),
                        src.get(attn + "k_proj.bias", (kv_rows,)),
                        src.get(attn + "v_proj.bias", (kv_rows,)),
                    ]
                )
            )
        q_norm = up(src.get(attn + "q_norm.weight", (hd,))) if c.qk_norm else None
        k_norm = up(src.get(attn + "k_norm.weight", (hd,))) if c.qk_norm else None
        mlp = p + "mlp."
        gate_up = np.concatenate(
            [
                src.get(mlp + "gate_proj.weight", (c.intermediate_size, d)),
                src.get(mlp + "up_proj.weight", (c.intermediate_size, d)),
            ]
        )
        layers.append(
            LayerWeights(
                input_norm=up(src.get(p + "input_layernorm.weight", (d,))),
                qkv=up(qkv),
                qkv_bias=bias,
                q_norm=q_norm,
                k_norm=k_norm,
                o=up(src.get(attn + "o_proj.weight", (d, q_rows))),
                post_norm=up(src.get(p + "post_attention_layernorm.weight", (d,))),
                gate_up=up(gate_up),
                down=up(src.get(mlp + "down_proj.weight", (d, c.intermediate_size))),
            )
        )
    norm = up(src.get("model.norm.weight", (d,)))
    lm_head = embed if c.tie_word_embeddings else up(src.get("lm_head.weight", (c.vocab_size, d)))
    return ModelWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head)


def weight_bytes(config: ModelConfig) -> int:
    """Bytes of bf16 weights one decode step reads: every tensor once, but of the embedding only a row (ignored)
    unless it doubles as the tied head."""
    elements = sum(math.prod(shape) for shape in expected_shapes(config).values())
    if not config.tie_word_embeddings:
        elements -= config.vocab_size * config.hidden_size
    return 2 * elements
