"""Logits of the CPU engine against transformers (torch CPU, fp32) on the same weights.

Measured (numpy 2.4, torch 2.13 CPU): tiny synthetic Qwen3 max abs error about 4e-7 at logits of scale 1.5;
SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised independently by each side) max abs error about 5e-5 at logits
of scale 33 (relative to the largest logit: 2e-6). The tolerances below leave about a tenfold margin. These
run the CPU engine with an fp32 KV cache, as transformers keeps one; its default bf16 cache is checked against
transformers with a cache that rounds the same way.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from decoder_service.engines.cpu.model import CpuTransformer
from decoder_service.models.hf_config import config_to_hf
from decoder_service.models.hf_loader import load_hf_dir
from decoder_service.models.loader import embedded_model_path
from decoder_service.models.safetensors_io import write_safetensors
from decoder_service.models.synth import PRESETS, synthetic_weights
from tests.decoder_service.engines.hf_cache import with_bf16_kv_cache

TINY_ATOL = 5e-6
SMOLLM2_ATOL = 5e-4


def _hf_logits(model, ids: list[int], **cache: object) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids]), **cache).logits[0].numpy()


def test_tiny_qwen3(tiny_dir: Path, tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    ours = CpuTransformer(*tiny_model, kv_precision="fp32")
    rng = np.random.default_rng(0)
    for length in (1, 2, 17, 64):
        ids = rng.integers(0, 151_936, length).tolist()
        expected = _hf_logits(hf, ids)
        got = ours.forward_all(ids)
        assert np.abs(got - expected).max() < TINY_ATOL, length


def test_smollm2_from_gguf(smollm2_model) -> None:
    from transformers import AutoModelForCausalLM

    path = embedded_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ours = CpuTransformer(*smollm2_model, kv_precision="fp32")
    prompts = [[1, 4093, 314, 253, 1345, 28, 957, 2115], [1], [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 2]]
    for ids in prompts:
        expected = _hf_logits(hf, ids)
        got = ours.forward_all(ids)
        assert np.abs(got - expected).max() < SMOLLM2_ATOL, ids


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_untied_small_vocab_architectures(tmp_path: Path, architecture: str) -> None:
    """Qwen2 (q/k/v biases) and Llama with an untied head, written in fp32 so both sides read the same values."""
    from transformers import AutoModelForCausalLM

    config = dataclasses.replace(
        PRESETS["tiny"], architecture=architecture, vocab_size=1000, tie_word_embeddings=False, rope_theta=10000.0
    )
    tensors = {name: ("F32", value) for name, value in synthetic_weights(config, seed=11)}
    write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(config)))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = CpuTransformer(*load_hf_dir(tmp_path), kv_precision="fp32")
    ids = np.random.default_rng(1).integers(0, 1000, 23).tolist()
    assert np.abs(ours.forward_all(ids) - _hf_logits(hf, ids)).max() < TINY_ATOL


def test_bf16_kv_cache_against_a_rounding_transformers_cache(tiny_dir: Path, tiny_model) -> None:
    """The engine's default KV cache (bf16 entries) against transformers whose cache rounds keys and values the
    same way: as close as the fp32 pair, and measurably apart from the fp32 cache's logits."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    rounded, exact = CpuTransformer(*tiny_model), CpuTransformer(*tiny_model, kv_precision="fp32")
    ids = np.random.default_rng(2).integers(0, 151_936, 40).tolist()
    got = rounded.forward_all(ids)
    assert np.abs(got - _hf_logits(hf, ids, **with_bf16_kv_cache(hf))).max() < TINY_ATOL
    assert np.abs(got - exact.forward_all(ids)).max() > 10 * TINY_ATOL  # the rounding is there to see


def test_unknown_kv_precision_is_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match="KV cache precision must be one of bf16, fp32; got 'fp16'"):
        CpuTransformer(*tiny_model, kv_precision="fp16").new_cache(4)  # type: ignore[arg-type]
