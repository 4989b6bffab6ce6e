"""float64 numpy references of every CUDA kernel, written from the model's definition (Hugging Face semantics),
not from the kernels. Shapes and layouts match the kernels' arguments."""

from __future__ import annotations

import numpy as np


def embed(table: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return table[tokens].astype(np.float64)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def linear(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, residual: np.ndarray | None = None
) -> np.ndarray:
    y = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        y = y + bias.astype(np.float64)
    if residual is not None:
        y = y + residual.astype(np.float64)
    return y


def rope_table(n_positions: int, hd: int, theta: float) -> np.ndarray:
    """[n_positions, hd]: each position's cosines, then its sines (cuda/rope.cuh's rope_table layout)."""
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(n_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=-1)


def rope(x: np.ndarray, table_rows: np.ndarray) -> np.ndarray:
    """rotate_half RoPE over the last axis; x is [T, heads, head_dim], table_rows [T, head_dim] (rope_table)."""
    hd = x.shape[-1]
    cos, sin = table_rows[:, : hd // 2], table_rows[:, hd // 2 :]
    cos2 = np.concatenate([cos, cos], axis=-1)[:, None, :]
    sin2 = np.concatenate([sin, sin], axis=-1)[:, None, :]
    rotated = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], axis=-1)
    return x * cos2 + rotated * sin2


def qk_norm_rope(
    qkv: np.ndarray,
    q_norm: np.ndarray | None,
    k_norm: np.ndarray | None,
    pos0: int,
    n_heads: int,
    n_kv: int,
    hd: int,
    table: np.ndarray,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q [T, H, hd] rotated, k [T, KV, hd] rotated, v [T, KV, hd]) from a [T, (H + 2 KV) hd] qkv block, with the
    angles of positions pos0 .. pos0 + T - 1 read from ``table`` (rope_table's layout)."""
    t = qkv.shape[0]
    qkv = qkv.astype(np.float64)
    q = qkv[:, : n_heads * hd].reshape(t, n_heads, hd)
    k = qkv[:, n_heads * hd : (n_heads + n_kv) * hd].reshape(t, n_kv, hd)
    v = qkv[:, (n_heads + n_kv) * hd :].reshape(t, n_kv, hd)
    if q_norm is not None:
        q = rmsnorm(q, q_norm, eps)
        k = rmsnorm(k, k_norm, eps)
    rows = np.asarray(table, dtype=np.float64)[pos0 : pos0 + t]
    return rope(q, rows), rope(k, rows), v


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int) -> np.ndarray:
    """Causal attention of q [T, H, hd] (positions pos0..) over caches [L, KV, hd]; returns [T, H * hd]."""
    t, n_heads, hd = q.shape
    group = n_heads // k_cache.shape[1]
    out = np.zeros((t, n_heads, hd))
    for i in range(t):
        length = pos0 + i + 1
        for h in range(n_heads):
            kk = k_cache[:length, h // group].astype(np.float64)
            vv = v_cache[:length, h // group].astype(np.float64)
            s = kk @ q[i, h] / np.sqrt(hd)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ vv
    return out.reshape(t, n_heads * hd)


def swiglu(gate_up: np.ndarray) -> np.ndarray:
    g, u = np.split(gate_up.astype(np.float64), 2, axis=-1)
    return g / (1.0 + np.exp(-g)) * u


def argmax(logits: np.ndarray) -> int:
    return int(np.argmax(logits))  # numpy returns the first (lowest) index of a tie


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref||; NaN anywhere (an unwritten, poisoned element) makes it infinite."""
    out = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
