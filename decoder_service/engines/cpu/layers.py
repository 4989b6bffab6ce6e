"""The layer functions of a Llama-family transformer in numpy fp32, following transformers' definitions."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * weight``."""
    variance = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def rope_tables(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of shape [T, head_dim], each frequency repeated for both halves (HF's rotate-half layout)."""
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    freqs = np.asarray(positions, dtype=np.float32)[:, None] * inv_freq[None, :].astype(np.float32)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate x of shape [T, heads, head_dim]: ``x*cos + rotate_half(x)*sin`` with rotate_half = (-x2, x1)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_start: int) -> np.ndarray:
    """Grouped-query attention of T new queries against all S cached keys/values.

    q: [T, heads, d]; k, v: [S, kv_heads, d] with the queries at absolute positions q_start .. q_start+T-1
    (so S == q_start + T). A query attends to keys at positions <= its own. Returns [T, heads * d].
    """
    t, heads, d = q.shape
    s, kv_heads, _ = k.shape
    group = heads // kv_heads
    # [kv_heads, group, T, d] @ [kv_heads, 1, d, S] -> [kv_heads, group, T, S]
    qg = q.reshape(t, kv_heads, group, d).transpose(1, 2, 0, 3)
    scores = qg @ k.transpose(1, 2, 0)[:, None] / np.float32(np.sqrt(d))
    future = np.arange(s)[None, :] > (q_start + np.arange(t))[:, None]
    scores = np.where(future, np.float32(-np.inf), scores)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = probs @ v.transpose(1, 0, 2)[:, None]  # [kv_heads, group, T, d]
    return out.transpose(2, 0, 1, 3).reshape(t, heads * d)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def swiglu_mlp(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """``down(silu(gate(x)) * up(x))`` with weights in [out, in] layout."""
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T
