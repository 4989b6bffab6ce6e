"""make_engine: the positions each engine serves, by default and as asked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from decoder_service.engines.factory import CUDA_MAX_CONTEXT, engine_context, make_engine
from tests.decoder_service.engines.cuda.emulator import install_fake_driver


def test_engine_context_defaults_to_the_trained_context_capped_on_cuda(tiny_model) -> None:
    config, _ = tiny_model
    wide = dataclasses.replace(config, max_position_embeddings=40_960)
    assert engine_context("cpu", wide, None) == 40_960
    assert engine_context("cuda", wide, None) == CUDA_MAX_CONTEXT < 40_960
    assert engine_context("cuda", config, None) == config.max_position_embeddings  # a model within the cap
    assert engine_context("cuda", wide, 32_768) == 32_768  # asked for: past the default cap, within the model's


@pytest.mark.parametrize(
    ("asked", "message"),
    [(0, "max context 0 positions: at least 1 is needed"), (4097, "max context 4,097 positions exceeds the 4,096")],
)
def test_a_context_the_model_cannot_serve_is_refused(tiny_model, asked: int, message: str) -> None:
    config, weights = tiny_model
    assert config.max_position_embeddings == 4096
    with pytest.raises(ValueError, match=message):
        make_engine("cpu", config, weights, max_context=asked)


def test_the_cpu_engine_serves_the_context_asked_for(tiny_model) -> None:
    assert make_engine("cpu", *tiny_model).context == 4096
    assert make_engine("cpu", *tiny_model, max_context=300).context == 300


def test_the_cuda_engine_reserves_its_kv_cache_for_the_context_asked_for(
    tiny_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the emulated driver (no GPU here): the engine's context is the KV cache's positions, so asking for fewer
    allocates less device memory: the model's estimate of the KV cache and the buffers that grow with the context
    (rotary table, attention's chunk records), as the driver counts it."""
    from decoder_service.engines.cuda.forward import model_device_bytes

    fake = install_fake_driver(monkeypatch, heap_bytes=512 << 20)
    cubin = tmp_path / "tooltrie.cubin"
    cubin.write_bytes(b"emulated")
    monkeypatch.setenv("TOOLTRIE_CUBIN", str(cubin))
    config, _ = tiny_model
    live = {}
    for asked in (None, 1024):
        engine = make_engine("cuda", *tiny_model, max_context=asked)
        live[asked] = sum(fake.sizes.values())
        assert engine.context == engine.model.max_context == (asked or config.max_position_embeddings)
        engine.free()
    parts = {n: model_device_bytes(config, n, 512, "bf16") for n in (4096, 1024)}
    assert live[None] - live[1024] == sum(parts[4096].values()) - sum(parts[1024].values())
    kv_cache = {n: parts[n]["KV cache"] for n in parts}
    assert kv_cache[4096] - kv_cache[1024] == (4096 - 1024) * 2 * config.num_layers * config.num_kv_heads * (
        config.head_dim * 2  # K and V, bf16
    )
