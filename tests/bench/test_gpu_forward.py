"""The forward benchmark's prefill GEMM warp sweep on the emulated driver (tests/decoder_service/engines/cuda/
emulator.py, a numpy stand-in for the GPU). The emulator keeps no time and captures no graph, so the graph replay is
replaced by a recorder: what is checked is which launch lists the sweep times, in which order, and the report's
table. No GPU needed."""

from __future__ import annotations

import pytest

from tests.decoder_service.engines.cuda.emulator import install_fake_driver

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_gemm_warps_sweep_times_both_forms_alternately_and_reports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_driver(monkeypatch)
    monkeypatch.setenv("TOOLTRIE_GEMM_ROWS", "64")  # the tiny model's GEMMs then take 64-row groups
    import bench.gpu_forward as bench
    from tests.decoder_service.engines.cuda.test_emulated_forward import tiny_qwen3_model

    replays: list[set[str]] = []

    def recorded_graph_ms(stream: object, launches: list, repeats: int = 30) -> float:
        replays.append({launch.kernel.name for launch in launches})
        return float(len(replays))

    monkeypatch.setattr(bench, "graph_ms", recorded_graph_ms)
    model = tiny_qwen3_model()
    model.prefill([5, 6, 7])
    model.gemm_warps = 8  # not the default: the sweep must put back the model's own setting
    out = bench.gemm_warps_sweep(bench.Stream(), model, prefix=3, rounds=2)

    # max_prefill is 8: the longer suffixes are left out rather than chunked
    assert list(out) == ["8"]
    assert out["8"] == {"8": [1.0, 3.0], "16": [2.0, 4.0]}
    eight, sixteen = replays[0::2], replays[1::2]
    assert all("gemm_mma16_bf16" in r and "gemm_mma16w_bf16" not in r for r in eight)
    assert all("gemm_mma16w_bf16" in r and "gemm_mma16_bf16" not in r for r in sixteen)
    assert model.gemm_warps == 8 and model.length == 3  # the model's own setting and position are back

    data = {"prompt_tokens": 3, "gemm_warps": 16, "gemm_warps_prefill_ms": {"36": {"8": [4.7, 4.8], "16": [4.6, 4.65]}}}
    lines = bench.gemm_warps_lines(data)
    assert "the engine's setting in this run: 16" in lines[1]
    assert "| 36 | 4.700 / 4.800 | 4.600 / 4.650 | -125.0 |" in lines
