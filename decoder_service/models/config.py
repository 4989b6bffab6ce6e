"""The shape of a decoder-only transformer, shared by every loader and every engine."""

from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family model.

    Weights travel beside it as ``dict[str, numpy.ndarray]`` keyed by Hugging Face tensor names
    (``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``, ``lm_head.weight``, ...),
    so every loader (safetensors, GGUF, synthetic) and every engine agree on one naming.
    """

    architecture: str  # one of ARCHITECTURES
    vocab_size: int  # embedding rows, padding included
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    @property
    def qk_norm(self) -> bool:
        """Qwen3 applies a per-head RMSNorm to q and k before RoPE."""
        return self.architecture == "qwen3"

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 carries biases on the q, k and v projections."""
        return self.architecture == "qwen2"

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.architecture!r}; supported: {', '.join(ARCHITECTURES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
