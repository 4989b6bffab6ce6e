from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest

from decoder_service.models.gguf_loader import (
    config_from_gguf,
    dequantize,
    llama_cpp_permute,
    llama_cpp_unpermute,
    load_gguf,
)
from decoder_service.models.synth import PRESETS, synthetic_weights
from tests.decoder_service.models.gguf_writer import write_gguf

# Small vocabulary and a 256-wide hidden size so K-quant blocks (256 values) fit the rows.
SMALL_QWEN3 = dataclasses.replace(PRESETS["tiny"], vocab_size=512, hidden_size=256, intermediate_size=256)
SMALL_LLAMA = dataclasses.replace(SMALL_QWEN3, architecture="llama", tie_word_embeddings=False)
SMALL_QWEN2 = dataclasses.replace(SMALL_QWEN3, architecture="qwen2")


@pytest.mark.parametrize("config", [SMALL_QWEN3, SMALL_LLAMA, SMALL_QWEN2], ids=lambda c: c.architecture)
@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_round_trip(tmp_path: Path, config, qtype: str) -> None:
    weights = dict(synthetic_weights(config, seed=1))
    expected = write_gguf(tmp_path / "m.gguf", config, weights, qtype)
    got_config, got = load_gguf(tmp_path / "m.gguf")
    # GGUF stores floats as fp32.
    assert got_config == dataclasses.replace(config, rms_norm_eps=float(np.float32(config.rms_norm_eps)))
    assert got.keys() == expected.keys()
    for name in got:
        assert np.array_equal(got[name], expected[name]), name


def test_llama_q_k_rows_come_back_in_hf_order(tmp_path: Path) -> None:
    # F32 keeps values exact, so un-permuting must give back the original rows.
    weights = dict(synthetic_weights(SMALL_LLAMA, seed=2))
    write_gguf(tmp_path / "m.gguf", SMALL_LLAMA, weights, "F32")
    _, got = load_gguf(tmp_path / "m.gguf")
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"):
        assert np.array_equal(got[name], weights[name])


def test_unpermute_inverts_permute() -> None:
    w = np.arange(6 * 16 * 3, dtype=np.float32).reshape(6 * 16, 3)
    assert not np.array_equal(llama_cpp_permute(w, 6), w)
    assert np.array_equal(llama_cpp_unpermute(llama_cpp_permute(w, 6), 6), w)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_k_quants_dequantise_to_hf_shape(tmp_path: Path, qtype: str) -> None:
    # gguf-py cannot quantise K-quants; write random blocks with sane fp16 scales and compare with gguf's decoder.
    q = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[q]
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (4, 512 // block * size), dtype=np.uint8)
    scale_at = {"Q4_K": 0, "Q6_K": size - 2}[qtype]  # offset of the fp16 super-block scale d
    for b in range(512 // block):
        raw[:, b * size + scale_at : b * size + scale_at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        if qtype == "Q4_K":
            raw[:, b * size + 2 : b * size + 4] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)
    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "qwen3")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_shape=raw.shape, raw_dtype=q)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = gguf.GGUFReader(str(tmp_path / "k.gguf")).tensors[0]
    got = dequantize(tensor)
    assert got.shape == (4, 512) and np.isfinite(got).all()
    assert np.array_equal(got, gguf.quants.dequantize(raw, q).reshape(4, 512))


def test_unknown_architecture_is_refused(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gemma")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'gemma'; supported: llama, qwen2, qwen3"):
        config_from_gguf(gguf.GGUFReader(str(tmp_path / "m.gguf")))


def test_embedded_smollm2(smollm2_model) -> None:
    config, weights = smollm2_model
    assert (config.architecture, config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (
        "llama",
        576,
        30,
        9,
        3,
    )
    assert config.tie_word_embeddings and "lm_head.weight" not in weights
    assert weights["model.embed_tokens.weight"].shape == (49152, 576)
