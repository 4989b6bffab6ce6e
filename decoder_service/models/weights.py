"""The tensors a ModelConfig implies, by Hugging Face name, and the check that a loaded set matches them."""

from __future__ import annotations

import numpy as np

from decoder_service.models.config import ModelConfig

Weights = dict[str, np.ndarray]

# Buffers some checkpoints carry that the forward pass recomputes.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, with its shape, in Hugging Face layout ([out, in] for projections)."""
    h, hd = config.hidden_size, config.head_dim
    q_out, kv_out = config.num_heads * hd, config.num_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q_out, h),
            p + "self_attn.k_proj.weight": (kv_out, h),
            p + "self_attn.v_proj.weight": (kv_out, h),
            p + "self_attn.o_proj.weight": (h, q_out),
            p + "mlp.gate_proj.weight": (config.intermediate_size, h),
            p + "mlp.up_proj.weight": (config.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, config.intermediate_size),
        }
        if config.qkv_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (q_out,),
                p + "self_attn.k_proj.bias": (kv_out,),
                p + "self_attn.v_proj.bias": (kv_out,),
            }
        if config.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    return shapes


def validate_weights(config: ModelConfig, weights: Weights, source: str = "checkpoint") -> Weights:
    """Check names and shapes against the config; drop ignorable buffers and a redundant tied head.

    Raises ValueError naming the first offending tensor and both shapes, so a config/weights mismatch never
    surfaces later as a broadcasting error deep inside a matmul.
    """
    weights = {k: v for k, v in weights.items() if not k.endswith(_IGNORED_SUFFIXES)}
    if config.tie_word_embeddings and "lm_head.weight" in weights:
        # Some exporters write the tied head out; it must equal the embedding to be dropped safely.
        if not np.array_equal(weights["lm_head.weight"], weights.get("model.embed_tokens.weight")):
            raise ValueError(
                f"{source}: tie_word_embeddings is true but lm_head.weight differs from "
                "model.embed_tokens.weight; set tie_word_embeddings to false in the config"
            )
        del weights["lm_head.weight"]
    shapes = expected_shapes(config)
    missing = sorted(set(shapes) - set(weights))
    if missing:
        raise ValueError(
            f"{source}: {len(missing)} tensor(s) the {config.architecture} config needs are missing, "
            f"first {missing[0]!r} with shape {shapes[missing[0]]}"
        )
    extra = sorted(set(weights) - set(shapes))
    if extra:
        raise ValueError(
            f"{source}: unexpected tensor {extra[0]!r} with shape {weights[extra[0]].shape} "
            f"({len(extra)} in all); the {config.architecture} config does not use it"
        )
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(
                f"{source}: tensor {name!r} has shape {tuple(weights[name].shape)} but the config implies {shape}"
            )
    return weights


def as_float32(weights: Weights) -> Weights:
    """The CPU engine computes in fp32; convert once, keeping arrays that already are."""
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}
