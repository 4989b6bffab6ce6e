"""Whole models on the GPU against Hugging Face transformers (torch fp32 on the same bf16-rounded weights).

Models are random (fixed seed) and generated on the GPU machine; nothing is downloaded. Logits must agree to
a relative error of 1e-2, and greedy tokens must agree wherever the reference's top-2 margin exceeds 0.05."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.decoder_service.engines.cuda.gpu_harness import load_module, record, requires_gpu
from tests.decoder_service.engines.cuda.hf_models import SHAPES, build_fp8_reference, build_reference, compare_greedy

pytestmark = requires_gpu
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# (shape, prompt length, new tokens, max_prefill): the tiny ones prefill in several chunks.
CASES = [
    ("tiny-qwen3", 100, 16, 64),
    ("tiny-qwen2-hd128-untied", 100, 16, 64),
    ("tiny-llama-untied", 70, 16, 32),
    ("smollm2-shape", 64, 16, 512),
    ("qwen3-1.7b-shape", 64, 16, 512),
]


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device; the reference runs on the GPU")
    yield load_module(tmp_path_factory.mktemp("cubin"))


@pytest.mark.parametrize(("shape", "prompt_len", "new_tokens", "max_prefill"), CASES)
def test_model_matches_transformers(
    module: object, shape: str, prompt_len: int, new_tokens: int, max_prefill: int
) -> None:
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.host_loop import greedy_decode

    cfg = SHAPES[shape]
    hf_model, weights = build_reference(cfg, seed=1234, device="cuda")
    model = CudaModel(cfg, weights, module, max_context=512, max_prefill=max_prefill)
    del weights
    prompt = np.random.default_rng(99).integers(0, cfg.vocab_size, prompt_len).tolist()
    try:
        report = compare_greedy(model, hf_model, prompt, new_tokens)
        if shape.startswith("tiny"):
            # Determinism is structural: a second run must reproduce every logit bit for bit.
            first = greedy_decode(model, prompt, new_tokens, keep_logits=True)
            second = greedy_decode(model, prompt, new_tokens, keep_logits=True)
            report["bit_identical_rerun"] = all(
                np.array_equal(a, b) for a, b in zip(first.logits, second.logits, strict=True)
            )
            assert report["bit_identical_rerun"]
    finally:
        model.free()
        del hf_model
        torch.cuda.empty_cache()
    record("model", shape, prompt_len=prompt_len, **report)
    assert report["rel_err"] <= 1e-2, report
    assert report["token_mismatches"] == 0, report


@pytest.mark.parametrize("shape", ["tiny-qwen3", "smollm2-shape"])
def test_fp8_weights_match_transformers_and_the_bf16_kernels_bits(module: object, shape: str) -> None:
    """The FP8 weight format on quantized weights: transformers with the same quantized parameters agrees (the
    bound above), and every logit is the bits of the bf16 kernels on those weights."""
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.host_loop import greedy_decode

    cfg = SHAPES[shape]
    hf_model, weights = build_fp8_reference(cfg, seed=1234, device="cuda")
    models = [CudaModel(cfg, weights, module, max_context=512, weight_format=f) for f in ("bf16", "fp8")]
    del weights
    prompt = np.random.default_rng(98).integers(0, cfg.vocab_size, 64).tolist()
    try:
        report = compare_greedy(models[1], hf_model, prompt, 16)
        runs = [greedy_decode(m, prompt, 16, keep_logits=True) for m in models]
        report["bit_identical_to_bf16"] = all(
            np.array_equal(a, b) for a, b in zip(runs[0].logits, runs[1].logits, strict=True)
        )
    finally:
        for m in models:
            m.free()
        del hf_model
        torch.cuda.empty_cache()
    record("model", f"{shape}/fp8", prompt_len=len(prompt), **report)
    assert report["bit_identical_to_bf16"], report
    assert report["rel_err"] <= 1e-2, report
    assert report["token_mismatches"] == 0, report
