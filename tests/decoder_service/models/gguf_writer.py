"""Write a model as a GGUF file the way llama.cpp's converter does (names, metadata, q/k permutation)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from decoder_service.models.config import ModelConfig
from decoder_service.models.gguf_loader import _BLOCK_NAMES, _GLOBAL_NAMES, llama_cpp_permute
from decoder_service.models.weights import Weights

_TO_GGUF = {v: k for k, v in _GLOBAL_NAMES.items()}
_BLOCK_TO_GGUF = {v: k for k, v in _BLOCK_NAMES.items()}


def gguf_name(hf: str) -> str:
    if hf in _TO_GGUF:
        return _TO_GGUF[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_BLOCK_TO_GGUF[rest]}"


def write_gguf(path: Path, config: ModelConfig, weights: Weights, qtype: str = "F32") -> Weights:
    """Write ``weights`` (2-D tensors in ``qtype``, 1-D in F32); return what a reader should get back."""
    arch = config.architecture
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    expected: Weights = {}
    q = gguf.GGMLQuantizationType[qtype]
    for name, w in weights.items():
        stored = w
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_heads if "q_proj" in name else config.num_kv_heads
            stored = llama_cpp_permute(w, heads)
        if w.ndim == 2 and q != gguf.GGMLQuantizationType.F32:
            data = gguf.quants.quantize(stored, q)
            writer.add_tensor(gguf_name(name), data, raw_shape=data.shape, raw_dtype=q)
            round_trip = gguf.quants.dequantize(data, q).reshape(w.shape)
        else:
            writer.add_tensor(gguf_name(name), stored.astype(np.float32))
            round_trip = stored.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_heads if "q_proj" in name else config.num_kv_heads
            # What the reader must return: the quantised values, back in HF row order.
            round_trip = round_trip.reshape(heads, -1, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        expected[name] = round_trip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
