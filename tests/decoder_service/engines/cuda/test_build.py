"""CPU-only checks of the CUDA build and of the engine's behaviour on machines without a GPU."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from decoder_service.engines.cuda import cuda_available
from decoder_service.engines.cuda.forward import (
    ATTN_COMPILED_HEAD_DIMS,
    ATTN_STATIC_SHARED,
    GSTREAM_CHAIN_STATIC_SHARED,
    GSTREAM_CHAIN_WIDE_STATIC_SHARED,
    GSTREAM_STATIC_SHARED,
    MAX_SHARED_PER_BLOCK,
    check_config,
    prefill_attention_shared,
)
from decoder_service.engines.cuda.memory import to_bf16_bits
from decoder_service.engines.cuda.persistent import PDEC_STATIC_SHARED
from decoder_service.models.bf16 import bf16_bits_to_float32
from decoder_service.models.config import ModelConfig
from tooltrie.cubin_kernels import read_kernels
from tooltrie.cuda_build import (
    CUDA_DIR,
    ENTRY,
    NVCC_FLAGS,
    build_cubin,
    cubin_sha256,
    cuda_sources,
    cuda_sources_sha256,
    find_nvcc,
)


@pytest.fixture(scope="module")
def product_cubin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The product's cubin, built once for the tests that read it (a build takes about 15 s on 2 cores)."""
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    return build_cubin(tmp_path_factory.mktemp("product"))


def test_cubin_builds_with_every_kernel(product_cubin: Path) -> None:
    kernels = read_kernels(product_cubin)
    for kernel in (
        "embed_gather",
        "rmsnorm",
        "gemv_bf16",
        "gemv_swiglu_bf16",
        "gemv_stream_bf16",
        "gemv_stream_swiglu_bf16",
        "gemm_bf16",
        "gemm_mma16_bf16",
        "gemm_mma8_bf16",
        "gemm_mma16h_bf16",
        "gemm_mma16r32_bf16",
        "gemm_mma8r32_bf16",
        "gemm_mma16r128_bf16",
        "gemm_mma8r128_bf16",
        "gemm_mma16w_bf16",
        "gemm_mma8w_bf16",
        "gemm_mma_cluster1_bf16",
        "gemm_mma_cluster2_bf16",
        "gemm_mma_cluster3_bf16",
        "rope_table",
        "qk_norm_rope_cache",
        "attention",
        "attention_prefill_hd128",
        "attention_prefill_hd64",
        "attention_decode",
        "attention_decode_cluster",
        "decode_persistent",
        "swiglu",
        "residual_add",
        "argmax",
    ):
        assert kernel in kernels, f"kernel {kernel} missing from the cubin"
        assert kernels[kernel].code, f"kernel {kernel} has no machine code"


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("probe", ["gpu_sync_cost", "gpu_stream_probe", "gpu_handover_probe"])
def test_bench_probe_compiles_to_sm90_machine_code(probe: str, tmp_path: Path) -> None:
    # The probes run only on the GPU machine (bench/gpu_forward.py builds them there); a build error would surface
    # there as a skipped study, so catch it here.
    source = Path(__file__).resolve().parents[4] / "bench" / f"{probe}.cu"
    cubin = tmp_path / f"{probe}.cubin"
    built = subprocess.run(
        [str(find_nvcc()), "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-o", str(cubin), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    assert cubin.read_bytes()[:4] == b"\x7fELF"


def test_cubin_is_the_same_from_another_checkout(product_cubin: Path, tmp_path: Path) -> None:
    """The same sources give the same cubin wherever they lie, so a cubin hash names the machine code a GPU result
    was measured on; a source edit that changes the code changes the hash."""
    copy = tmp_path / "elsewhere" / "cuda"
    copy.mkdir(parents=True)
    for source in cuda_sources():
        (copy / source.name).write_bytes(source.read_bytes())
    here = cubin_sha256(product_cubin)
    assert cubin_sha256(build_cubin(tmp_path / "there", cuda_dir=copy)) == here
    entry = copy / ENTRY
    entry.write_text(entry.read_text() + '\nextern "C" __global__ void probe_kernel(int* p) { *p = 1; }\n')
    assert cubin_sha256(build_cubin(tmp_path / "changed", cuda_dir=copy)) != here


def test_attention_trace_names_every_probe() -> None:
    """bench/gpu_trace_attention.py reads ATTN_TRACE_PROBES timestamp slots per decode attention block and names
    them in order; the kernel's probes must number exactly that many."""
    from bench.gpu_trace_attention import ATTN_PROBES

    source = (CUDA_DIR / "attention_decode.cuh").read_text()
    declared = int(re.search(r"#define ATTN_TRACE_PROBES (\d+)", source).group(1))
    marks = {0} | {int(n) for n in re.findall(r"TT_MARK\(mark \+ (\d+)\)", source)}
    assert marks == set(range(declared)), sorted(marks)
    assert len(ATTN_PROBES) == declared


def test_sources_hash_covers_every_source(tmp_path: Path) -> None:
    (tmp_path / "a.cuh").write_text("// a\n")
    (tmp_path / "b.cu").write_text("// b\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    before = cuda_sources_sha256(tmp_path)
    assert [p.name for p in cuda_sources(tmp_path)] == ["a.cuh", "b.cu"]
    (tmp_path / "notes.txt").write_text("changed\n")
    assert cuda_sources_sha256(tmp_path) == before
    (tmp_path / "a.cuh").write_text("// a changed\n")
    assert cuda_sources_sha256(tmp_path) != before


def test_cuda_unavailable_gives_a_reason() -> None:
    ok, reason = cuda_available()
    if ok:
        pytest.skip(f"a CUDA device is present ({reason})")
    assert isinstance(reason, str) and reason


def test_bf16_rounding_is_nearest_even() -> None:
    # 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even mantissa (1.0);
    # 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6 and goes up to the even one.
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf, np.nan], dtype=np.float32)
    back = bf16_bits_to_float32(to_bf16_bits(values))
    np.testing.assert_array_equal(back[:5], [1.0, 1.0, 1 + 2**-6, -2.5, np.inf])
    assert np.isnan(back[5])


def test_unsupported_head_dim_is_rejected_with_the_fix() -> None:
    cfg = ModelConfig("llama", 100, 96, 64, 1, 2, 1, 48, 1e-5, 1e4, 64, True)
    with pytest.raises(ValueError, match="head_dim 48"):
        check_config(cfg)


def ptxas_static_shared(tmp_path: Path) -> dict[str, int]:
    """{kernel: static shared memory bytes} as ptxas reports them for the product's cubin."""
    cmd = [find_nvcc(), *NVCC_FLAGS, "-Xptxas", "-v", "-o", str(tmp_path / "verbose.cubin"), ENTRY]
    report = subprocess.run(cmd, cwd=CUDA_DIR, capture_output=True, text=True, check=True).stderr
    shared, kernel = {}, None
    for line in report.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            kernel = m.group(1)
        elif kernel and (m := re.search(r"Used \d+ registers.*?(?:(\d+) bytes smem)?$", line)):
            shared[kernel] = int(m.group(1) or 0)
    return shared


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
def test_host_shared_memory_constants_cover_the_kernels(tmp_path: Path) -> None:
    """The host sizes launches from these constants: the streaming GEMV's and the persistent decode kernel's ring
    depths assume their static shared memory, and the prefill attention's limit on max_context assumes attention's."""
    shared = ptxas_static_shared(tmp_path)
    assert shared["decode_persistent"] <= PDEC_STATIC_SHARED
    assert shared["gemv_stream_bf16"] <= GSTREAM_STATIC_SHARED
    assert shared["gemv_stream_swiglu_bf16"] <= GSTREAM_STATIC_SHARED
    assert shared["gemv_stream_chain_bf16"] <= GSTREAM_CHAIN_STATIC_SHARED
    assert shared["gemv_stream_chain_swiglu_bf16"] <= GSTREAM_CHAIN_STATIC_SHARED
    assert shared["gemv_stream_chain16_bf16"] <= GSTREAM_CHAIN_WIDE_STATIC_SHARED
    assert shared["gemv_stream_chain16_swiglu_bf16"] <= GSTREAM_CHAIN_WIDE_STATIC_SHARED
    assert shared["attention"] <= ATTN_STATIC_SHARED
    for head_dim in ATTN_COMPILED_HEAD_DIMS:  # the grouped prefill attention's tiles beside its static memory
        assert shared[f"attention_prefill_hd{head_dim}"] + prefill_attention_shared(head_dim) <= MAX_SHARED_PER_BLOCK
