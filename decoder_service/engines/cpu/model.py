"""The transformer over a KV cache: prefill (a whole chunk of prompt, causal) and decode (one token)."""

from __future__ import annotations

import numpy as np

from decoder_service.engines.cpu.kv_cache import KVCache, KVPrecision
from decoder_service.engines.cpu.layers import apply_rope, causal_attention, rms_norm, rope_tables, swiglu_mlp
from decoder_service.engines.cpu.lm_head import LMHead
from decoder_service.models.config import ModelConfig
from decoder_service.models.weights import Weights, as_float32, validate_weights


class CpuTransformer:
    """A Llama/Qwen2/Qwen3 decoder in numpy fp32. Weights use Hugging Face names and [out, in] layout.
    ``kv_precision``: what its KV caches hold (kv_cache.py): bf16 as the CUDA engine's, or fp32."""

    def __init__(self, config: ModelConfig, weights: Weights, kv_precision: KVPrecision = "bf16") -> None:
        self.config = config
        self.kv_precision = kv_precision
        self.w = as_float32(validate_weights(config, weights))
        head = self.w["model.embed_tokens.weight"] if config.tie_word_embeddings else self.w["lm_head.weight"]
        self.head = LMHead(head)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.config, capacity, self.kv_precision)

    def prefill(self, token_ids: list[int] | np.ndarray, cache: KVCache) -> np.ndarray:
        """Run ``token_ids`` after the cache's positions; return the final-normed hidden state of the last one."""
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.ndim != 1 or not ids.size:
            raise ValueError(f"prefill needs a non-empty 1-D list of token ids; got shape {ids.shape}")
        return self._forward(ids, cache)[-1]

    def decode(self, token_id: int, cache: KVCache) -> np.ndarray:
        """Run one token at the next position; return its final-normed hidden state [hidden]."""
        return self._forward(np.asarray([token_id], dtype=np.int64), cache)[0]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Dense head: logits of the whole vocabulary."""
        return self.head.dense(hidden)

    def logits_for(self, hidden: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
        """Sparse head: logits of ``token_ids`` only, bit-identical to ``logits(hidden)[token_ids]``."""
        return self.head.sparse(hidden, token_ids)

    def forward_all(self, token_ids: list[int] | np.ndarray) -> np.ndarray:
        """Logits at every position of a fresh sequence, [T, vocab] (for parity checks, not serving)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        hidden = self._forward(ids, self.new_cache(len(ids)))
        return np.stack([self.logits(h) for h in hidden])

    def _forward(self, ids: np.ndarray, cache: KVCache) -> np.ndarray:
        cfg, w = self.config, self.w
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}); got {ids.min()}..{ids.max()}")
        cache.reserve(len(ids))
        start = cache.length
        cos, sin = rope_tables(np.arange(start, start + len(ids)), cfg.head_dim, cfg.rope_theta)
        x = w["model.embed_tokens.weight"][ids]
        for layer in range(cfg.num_layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            x = x + self._attention(layer, p, h, cos, sin, cache, start)
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            x = x + swiglu_mlp(
                h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"]
            )
        cache.advance(len(ids))
        return rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)

    def _attention(
        self, layer: int, p: str, h: np.ndarray, cos: np.ndarray, sin: np.ndarray, cache: KVCache, start: int
    ) -> np.ndarray:
        cfg, w = self.config, self.w
        t = h.shape[0]
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        if cfg.qkv_bias:
            q, k, v = (x + w[p + f"self_attn.{n}_proj.bias"] for x, n in zip((q, k, v), "qkv", strict=True))
        q = q.reshape(t, cfg.num_heads, cfg.head_dim)
        k = k.reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            # Qwen3 normalises each head's q and k before RoPE.
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = cache.write(layer, k, v)
        return causal_attention(q, keys, values, start) @ w[p + "self_attn.o_proj.weight"].T
