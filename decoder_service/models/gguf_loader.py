"""Load a GGUF file (llama.cpp's format) as a ModelConfig and fp32 weights under Hugging Face names.

Quantised tensors are dequantised on load with ``gguf.quants.dequantize``. llama.cpp's converter permutes the
rows of q_proj/k_proj of Llama-architecture models (it pairs RoPE dimensions as interleaved, HF splits them in
halves); those rows are un-permuted here so every engine sees Hugging Face layout.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from decoder_service.models.config import ARCHITECTURES, ModelConfig
from decoder_service.models.weights import Weights, as_float32, validate_weights

SUPPORTED_TYPES = frozenset(
    gguf.GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value as a Python object (str, int, float, list), or ``default`` when absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def config_from_gguf(reader: gguf.GGUFReader) -> ModelConfig:
    """Build a ModelConfig from ``general.architecture`` and its ``{arch}.*`` keys."""
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF general.architecture is {arch!r}; supported: {', '.join(ARCHITECTURES)}")

    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}, which a {arch} model needs")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    tensor_names = {t.name for t in reader.tensors}
    vocab = field(reader, f"{arch}.vocab_size") or len(field(reader, "tokenizer.ggml.tokens", []))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(field(reader, f"{arch}.attention.key_length", hidden // heads)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(field(reader, f"{arch}.context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensor_names,
    )


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor; ValueError for a tensor the engines do not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart known to tooltrie")


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The row permutation llama.cpp's converter applies to Llama q/k weights (kept for tests and writers)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of :func:`llama_cpp_permute`: interleaved RoPE pairs back to HF's rotate-half halves."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(tensor: gguf.ReaderTensor) -> np.ndarray:
    if tensor.tensor_type not in SUPPORTED_TYPES:
        accepted = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise ValueError(f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}; supported: {accepted}")
    # GGUF lists dimensions fastest-first; numpy (and HF) order is the reverse.
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """A memory-mapped reader, cached per file version because parsing a vocabulary's metadata takes seconds."""
    p = Path(path).resolve()
    stat = p.stat()
    return _open_gguf(str(p), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)
def _open_gguf(path: str, mtime_ns: int, size: int) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)


def load_gguf(path: Path) -> tuple[ModelConfig, Weights]:
    """Config and fp32 weights of a llama/qwen2/qwen3 GGUF, validated against each other."""
    reader = open_gguf(path)
    config = config_from_gguf(reader)
    weights: Weights = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        w = dequantize(tensor)
        if config.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            n_head = config.num_heads if name.endswith("q_proj.weight") else config.num_kv_heads
            w = llama_cpp_unpermute(w, n_head)
        weights[name] = w
    return config, as_float32(validate_weights(config, weights, source=str(path)))


def gguf_chat_template(path: Path) -> str | None:
    """The Jinja2 chat template stored in ``tokenizer.chat_template``, if any."""
    return field(open_gguf(path), "tokenizer.chat_template")
