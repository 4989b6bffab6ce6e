"""The runtime's launch lists, run on a numpy stand-in for the driver, against Hugging Face transformers.

No GPU needed: this checks argument order, pointer offsets, fused weight layouts, chunked prefill and the
host loop. The kernels' arithmetic itself is checked on the GPU (test_kernels_gpu.py)."""

from __future__ import annotations

import pytest

from tests.decoder_service.engines.cuda.emulator import FakeDriver, install_fake_driver
from tests.decoder_service.engines.cuda.hf_models import SHAPES, build_reference, compare_greedy

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    return install_fake_driver(monkeypatch)


@pytest.mark.parametrize("shape", ["tiny-qwen3", "tiny-qwen2-hd128-untied", "tiny-llama-untied"])
def test_emulated_model_matches_transformers(fake_driver: FakeDriver, shape: str) -> None:
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES[shape]
    hf_model, weights = build_reference(cfg, seed=7)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=8)
    prompt = [(3 * i * i + 11 * i + 5) % cfg.vocab_size for i in range(13)]
    report = compare_greedy(model, hf_model, prompt, new_tokens=4)
    assert report["rel_err"] <= 1e-4, report
    assert report["token_mismatches"] == 0, report
    # 13 prompt tokens in chunks of 8 take two prefills; both are short enough for the skinny kernel.
    assert fake_driver.launches.count("gemm_skinny_bf16") == 2 * 4 * cfg.num_layers
    assert fake_driver.launches.count("gemm_bf16") == 0
    assert fake_driver.launches.count("gemv_bf16") == 3 * (3 * cfg.num_layers + 1) + 2  # decode steps + heads
    assert fake_driver.launches.count("gemv_swiglu_bf16") == 3 * cfg.num_layers  # each decode step's gate|up
    assert model.length == 13 + 3


def test_long_prefill_uses_the_tiled_gemm(fake_driver: FakeDriver) -> None:
    from decoder_service.engines.cuda.forward import SKINNY_MAX_TOKENS, CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES["tiny-qwen3"]
    hf_model, weights = build_reference(cfg, seed=7)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=128, max_prefill=128)
    prompt = [(5 * i * i + 7 * i + 3) % cfg.vocab_size for i in range(SKINNY_MAX_TOKENS + 6)]
    report = compare_greedy(model, hf_model, prompt, new_tokens=2)
    assert report["rel_err"] <= 1e-4, report
    assert report["token_mismatches"] == 0, report
    assert fake_driver.launches.count("gemm_bf16") == 4 * cfg.num_layers
    assert fake_driver.launches.count("gemm_skinny_bf16") == 0


def test_repeated_prefill_reuses_its_launch_list(fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second prefill of the same length at the same position launches the kept list, with the same result."""
    from decoder_service.engines.cuda.forward import PREFILL_LISTS_KEPT, CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES["tiny-qwen3"]
    _, weights = build_reference(cfg, seed=7)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=8)
    builds = []
    build = model._build
    monkeypatch.setattr(model, "_build", lambda n, **kw: builds.append((n, kw["pos"])) or build(n, **kw))

    def answer(prompt: list[int]) -> tuple[list[float], int]:
        model.reset()
        model.prefill(prompt)
        return model.read_logits().tolist(), model.read_token()

    first = answer([5, 9, 2, 7, 1])
    other = answer([3, 3, 8, 1, 4, 6])
    again = answer([5, 9, 2, 7, 1])
    assert builds == [(5, 0), (6, 0)]  # the third prefill built nothing
    assert again == first and other != first
    for pos in range(PREFILL_LISTS_KEPT + 3):  # more shapes than are kept: the least recently used go
        model._prefill_launches(1, pos)
    assert len(model._prefill_lists) == PREFILL_LISTS_KEPT
    assert (1, 0) not in model._prefill_lists and (1, PREFILL_LISTS_KEPT + 2) in model._prefill_lists


def test_model_rejects_wrong_weight_shape(fake_driver: FakeDriver) -> None:
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES["tiny-llama-untied"]
    _, weights = build_reference(cfg, seed=1)
    weights["model.layers.1.mlp.down_proj.weight"] = weights["model.layers.1.mlp.down_proj.weight"][:, :-8]
    with pytest.raises(ValueError, match=r"down_proj\.weight.*expected"):
        CudaModel(cfg, weights, Module(b"cubin"), max_context=32, max_prefill=8)
