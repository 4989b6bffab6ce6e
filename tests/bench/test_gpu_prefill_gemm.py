"""The prefill GEMM benchmark end to end on the emulated driver (tests/decoder_service/engines/cuda/emulator.py, a
numpy stand-in for the GPU, so its times mean nothing): what ran where, a row a case with every form the engine has
and the one it takes, the JSON file, and the report rendered from it. No GPU needed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.decoder_service.engines.cuda.emulator import install_fake_driver


def test_bench_rows_and_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import bench.gpu_prefill_gemm as bench
    from bench.kernel_bench import kernel_bench_main
    from decoder_service.engines.cuda.forward import gemm_mma_launch

    install_fake_driver(monkeypatch, heap_bytes=256 << 20)
    # Small rows of the three widths the forms differ on: one that fits 16 tokens, one only 8 (and 16 in halves).
    monkeypatch.setattr(bench, "SHAPES", (("qkv", 256, 512), ("down", 192, 6144)))
    monkeypatch.setattr(bench, "CASES", ((16, 1), (36, 1)))
    cubin = tmp_path / "tooltrie.cubin"
    cubin.write_bytes(b"emulated")
    out, results = tmp_path / "gemm.json", tmp_path / "results"
    run = ["bench/gpu_prefill_gemm.py", "--cubin", str(cubin), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", run)
    assert kernel_bench_main(bench.__doc__, bench.all_rows, bench.failed, ab=True, report=bench.write_report) == 0

    data = json.loads(out.read_text())
    assert data["run"]["device"] and data["run"]["sms"] == 132
    assert data["run"]["command"] == "PYTHONPATH=. python3 bench/gpu_prefill_gemm.py"  # no file of this machine
    assert [(r["shape"], r["tokens"]) for r in data["rows"]] == [("qkv", 16), ("down", 16), ("qkv", 36), ("down", 36)]
    for row in data["rows"]:
        k_in = 512 if row["shape"] == "qkv" else 6144
        n_out = 256 if row["shape"] == "qkv" else 192
        engine = gemm_mma_launch(k_in, row["tokens"], n_out, 132, bench.GEMM_HALVES_TOKENS)
        assert engine is not None and row["engine"] == engine.kernel
        kernels = {k for k, v in row.items() if isinstance(v, dict)}
        assert row["engine"] in kernels and row["same_bits"] is True
        tokens = 16 if k_in == 512 else 8
        forms = {f"gemm_mma{tokens}{form}_bf16" for form in ("", "r32", "r128", "w")}
        assert forms <= kernels
    assert "gemm_mma16h_bf16" in data["rows"][3]  # the down rows at 36 tokens: 16 in halves

    monkeypatch.setattr(sys, "argv", ["bench/gpu_prefill_gemm.py", "--report", str(out), "--results", str(results)])
    assert kernel_bench_main(bench.__doc__, bench.all_rows, bench.failed, ab=True, report=bench.write_report) == 0
    text = (results / "gpu_prefill_gemm.md").read_text()
    assert json.loads((results / "gpu_prefill_gemm.json").read_text()) == data
    assert f"- device: {data['run']['device']}, 132 SMs" in text
    table = [line for line in text.splitlines() if line.startswith(("| qkv", "| down"))]
    assert len(table) == 4
    for line, row in zip(table, data["rows"], strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[-1] == "yes"
        engine = cells[-2]
        bold = [c for c in cells if c.startswith("**")]
        assert len(bold) == 1 and bold[0] == f"**{row[row['engine']]['us']}**", line
        assert engine == bench.form_of(row["engine"])
