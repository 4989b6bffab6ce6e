"""Upload a model's weights to the device as bf16, fusing q|k|v and gate|up so each layer needs fewer launches.

With the FP8 weight format the layer projections also go up as e4m3 bytes with one power-of-two scale per row
(decoder_service/models/fp8.py), which the single-token GEMVs read: the same numbers in half the bytes. Prefill,
forced chains and the persistent kernel keep reading the bf16 copy."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from decoder_service.engines.cuda.driver import Stream
from decoder_service.engines.cuda.memory import DeviceBuffer, to_bf16_bits
from decoder_service.models.config import ModelConfig
from decoder_service.models.fp8 import QUANTIZED_PROJECTIONS, WEIGHT_FORMATS, fp8_rows
from decoder_service.models.weights import expected_shapes


@dataclass(slots=True)
class Fp8Weight:
    codes: DeviceBuffer  # e4m3 bytes, [N, K] row-major
    scales: DeviceBuffer  # float32 [N]: each row's power-of-two scale


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
    fp8: dict[str, Fp8Weight] | None = None  # "qkv", "o", "gate_up", "down" as e4m3 rows (FP8 weight format)


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
    fp8 = [b for w in (lw.fp8 or {}).values() for b in (w.codes, w.scales)]
    return [lw.input_norm, lw.qkv, lw.qkv_bias, lw.q_norm, lw.k_norm, lw.o, lw.post_norm, lw.gate_up, lw.down, *fp8]


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


def upload_weights(
    config: ModelConfig, weights: dict[str, np.ndarray], stream: Stream, weight_format: str = "bf16"
) -> ModelWeights:
    """Check every tensor against ``config`` and copy it to the device (bf16; fused where launches share input).

    ``weight_format`` 'fp8': the layer projections also as e4m3 rows; they must already be e4m3 numbers times a
    power of two per row (``decoder_service.models.fp8.quantize_weights``), else ValueError names the first that is
    not."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weight_format!r}; accepted: {', '.join(WEIGHT_FORMATS)}")
    if weight_format == "fp8":
        check_fp8_shapes(config)
    uploaded: list[DeviceBuffer] = []

    def up(array: np.ndarray) -> DeviceBuffer:
        uploaded.append(DeviceBuffer.from_array(array, stream))
        return uploaded[-1]

    try:
        return _upload_all(config, _Source(weights), up, weight_format)
    except BaseException:  # a refused tensor leaves nothing on the device
        for buf in uploaded:
            buf.free()
        raise


def _upload_all(
    config: ModelConfig, src: _Source, up: Callable[[np.ndarray], DeviceBuffer], weight_format: str
) -> ModelWeights:
    c = config
    hd, d = c.head_dim, c.hidden_size
    q_rows, kv_rows = c.num_heads * hd, c.num_kv_heads * hd

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
        o = src.get(attn + "o_proj.weight", (d, q_rows))
        down = src.get(mlp + "down_proj.weight", (d, c.intermediate_size))
        fp8 = None
        if weight_format == "fp8":
            fused = {"qkv": qkv, "o": o, "gate_up": gate_up, "down": down}
            fp8 = {name: _upload_fp8(bits, f"layer {i} {name}", up) for name, bits in fused.items()}
        layers.append(
            LayerWeights(
                input_norm=up(src.get(p + "input_layernorm.weight", (d,))),
                qkv=up(qkv),
                qkv_bias=bias,
                q_norm=q_norm,
                k_norm=k_norm,
                o=up(o),
                post_norm=up(src.get(p + "post_attention_layernorm.weight", (d,))),
                gate_up=up(gate_up),
                down=up(down),
                fp8=fp8,
            )
        )
    norm = up(src.get("model.norm.weight", (d,)))
    lm_head = embed if c.tie_word_embeddings else up(src.get("lm_head.weight", (c.vocab_size, d)))
    return ModelWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head)


def _upload_fp8(bf16_bits: np.ndarray, name: str, up: Callable[[np.ndarray], DeviceBuffer]) -> Fp8Weight:
    codes, scales = fp8_rows(bf16_bits, name)
    return Fp8Weight(up(codes), up(scales))


def check_fp8_shapes(config: ModelConfig) -> None:
    """The FP8 GEMVs copy 16-byte row pieces: every projection's input width must be a multiple of 16."""
    widths = {config.hidden_size, config.num_heads * config.head_dim, config.intermediate_size}
    if odd := sorted(k for k in widths if k % 16):
        raise ValueError(f"the FP8 weight format needs projection inputs a multiple of 16 wide; this model has {odd}")


def resident_weight_bytes(config: ModelConfig, weight_format: str = "bf16") -> int:
    """Bytes that upload_weights keeps on the device: every tensor in bf16 (the embedding whole), and with 'fp8' the
    layer projections' e4m3 rows and their scales beside them (prefill, chains and the persistent kernel read the
    bf16 copy)."""
    shapes = expected_shapes(config)
    total = 2 * sum(math.prod(shape) for shape in shapes.values())
    if weight_format == "fp8":
        projections = [shape for name, shape in shapes.items() if name.endswith(QUANTIZED_PROJECTIONS)]
        total += sum(math.prod(shape) + 4 * shape[0] for shape in projections)
    return total


def weight_bytes(config: ModelConfig, weight_format: str = "bf16") -> int:
    """Bytes of weights one decode step reads: every tensor once, but of the embedding only a row (ignored)
    unless it doubles as the tied head. FP8: a byte per projection weight plus 4 per row (its scale)."""
    shapes = expected_shapes(config)
    elements = sum(math.prod(shape) for shape in shapes.values())
    if not config.tie_word_embeddings:
        elements -= config.vocab_size * config.hidden_size
    if weight_format != "fp8":
        return 2 * elements
    projections = [shape for name, shape in shapes.items() if name.endswith(QUANTIZED_PROJECTIONS)]
    fp8_elements = sum(math.prod(shape) for shape in projections)
    return 2 * (elements - fp8_elements) + fp8_elements + 4 * sum(shape[0] for shape in projections)
