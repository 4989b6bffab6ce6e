"""Kernel-by-kernel comparison of two cubins, on cubins nvcc builds from small sources here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from tooltrie.cli.main import main
from tooltrie.cubin_kernels import compare_cubins, read_kernels
from tooltrie.cuda_build import NVCC_FLAGS, find_nvcc

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")

SCALE = 'extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }\n'
OFFSET = 'extern "C" __global__ void offset(float* x, float a) { x[threadIdx.x] += a; }\n'
OFFSET_CHANGED = 'extern "C" __global__ void offset(float* x, float a) { x[threadIdx.x] -= a; }\n'
# Its eight loads in flight take more registers than `scale`.
STAGED = """extern "C" __global__ void staged(const float* in, float* out, int n) {
    __shared__ float tile[256];
    float acc[8];
    for (int k = 0; k < 8; ++k) acc[k] = in[threadIdx.x + k * n];
    tile[threadIdx.x] = acc[0] * acc[1] + acc[2] * acc[3] + acc[4] * acc[5] + acc[6] * acc[7];
    __syncthreads();
    out[threadIdx.x] = tile[255 - threadIdx.x];
}
"""


def build(tmp_path: Path, name: str, source: str) -> Path:
    cu = tmp_path / f"{name}.cu"
    cu.write_text(source)
    cubin = tmp_path / f"{name}.cubin"
    done = subprocess.run([str(find_nvcc()), *NVCC_FLAGS, "-o", str(cubin), str(cu)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return cubin


def ptxas_registers(tmp_path: Path, source: str) -> dict[str, int]:
    cu = tmp_path / "verbose.cu"
    cu.write_text(source)
    cmd = [str(find_nvcc()), *NVCC_FLAGS, "-Xptxas", "-v", "-o", str(tmp_path / "verbose.cubin"), str(cu)]
    report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    names = re.findall(r"Compiling entry function '(\w+)'", report)
    counts = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    return dict(zip(names, counts, strict=True))


@needs_nvcc
def test_kernels_read_with_the_registers_ptxas_reports(tmp_path: Path) -> None:
    kernels = read_kernels(build(tmp_path, "a", SCALE + STAGED))
    assert sorted(kernels) == ["scale", "staged"]
    assert {name: k.registers for name, k in kernels.items()} == ptxas_registers(tmp_path, SCALE + STAGED)
    assert all(len(k.code) > 0 and len(k.code) % 16 == 0 for k in kernels.values())  # sm_90: 16-byte instructions


@needs_nvcc
def test_a_change_to_one_kernel_is_reported_for_that_kernel_alone(tmp_path: Path) -> None:
    before = build(tmp_path, "before", SCALE + OFFSET + STAGED)
    # Another kernel added ahead of them shifts the symbol table; the untouched kernels still compare the same.
    after = build(tmp_path, "after", STAGED.replace("staged", "added") + SCALE + OFFSET_CHANGED + STAGED)
    changes = {c.name: c for c in compare_cubins(before, after)}
    assert sorted(changes) == ["added", "offset", "scale", "staged"]
    assert changes["scale"].same and changes["staged"].same
    assert not changes["offset"].same and "differs" in changes["offset"].describe()
    assert changes["added"].before is None and "only in the second" in changes["added"].describe()


@needs_nvcc
def test_compare_command_exits_1_when_a_kernel_differs(tmp_path: Path) -> None:
    before = build(tmp_path, "before", SCALE + OFFSET)
    same = build(tmp_path, "same", SCALE + OFFSET)
    changed = build(tmp_path, "changed", SCALE + OFFSET_CHANGED)
    runner = CliRunner()
    result = runner.invoke(main, ["cuda", "compare", str(before), str(same)])
    assert result.exit_code == 0, result.output
    assert "2 of 2 kernels run the same code; 0 differ" in result.output
    result = runner.invoke(main, ["cuda", "compare", "--all", str(before), str(changed)])
    assert result.exit_code == 1
    assert "scale: same code" in result.output and "offset: differs" in result.output


def test_a_file_that_is_not_a_cubin_is_refused_with_what_was_expected(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.cubin"
    bogus.write_text("not an ELF file\n")
    result = CliRunner().invoke(main, ["cuda", "compare", str(bogus), str(bogus)])
    assert result.exit_code == 2  # not 1, which says that kernels differ
    assert "is not a 64-bit little-endian ELF file" in result.output


@needs_nvcc
def test_a_truncated_cubin_is_refused_not_misread(tmp_path: Path) -> None:
    whole = build(tmp_path, "whole", SCALE).read_bytes()
    cut = tmp_path / "cut.cubin"
    cut.write_bytes(whole[: len(whole) // 2])  # the section headers sit at the end
    with pytest.raises(ValueError, match="truncated or damaged"):
        read_kernels(cut)
