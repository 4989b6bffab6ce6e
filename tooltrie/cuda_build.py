"""Build tooltrie's kernels (``cuda/*.cu``, ``cuda/*.cuh``) into one sm_90 cubin, and fingerprint the sources.

The build is reproducible: fixed flags, one translation unit (``cuda/tooltrie.cu`` includes every kernel
family), and the source hash covers every file under ``cuda/`` in sorted order.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import click

CUDA_DIR = Path(__file__).resolve().parent.parent / "cuda"
ENTRY = "tooltrie.cu"
CUBIN_NAME = "tooltrie.cubin"
DEFAULT_OUT = CUDA_DIR / "build"
# No fast math: kernels must match the fp32 reference to rounding. No -lineinfo: it embeds the build
# directory, and the cubin must depend on the sources alone (add it by hand when profiling).
NVCC_FLAGS = ("-cubin", "-arch=sm_90", "-O3", "-std=c++17")


def cuda_sources(cuda_dir: Path = CUDA_DIR) -> list[Path]:
    """Every kernel source, sorted by name so the hash and the build see one order."""
    return sorted(p for p in cuda_dir.iterdir() if p.is_file() and p.suffix in (".cu", ".cuh"))


def cuda_sources_sha256(cuda_dir: Path = CUDA_DIR) -> str:
    """sha256 over (name, length, bytes) of each source; results files record it to tie numbers to code."""
    h = hashlib.sha256()
    for path in cuda_sources(cuda_dir):
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def cubin_sha256(cubin: Path | str) -> str:
    """sha256 of a built cubin. The build is reproducible, so two source trees whose cubins hash alike run the same
    machine code: a change that leaves it unchanged (a refactor) leaves every GPU result standing."""
    return hashlib.sha256(Path(cubin).read_bytes()).hexdigest()


def find_nvcc() -> str | None:
    """The nvcc on PATH, else the usual toolkit location, else None."""
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def build_cubin(out_dir: Path | str = DEFAULT_OUT, cuda_dir: Path = CUDA_DIR) -> Path:
    """Compile ``cuda_dir/tooltrie.cu`` into ``out_dir/tooltrie.cubin`` and return its path."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found on PATH or in /usr/local/cuda/bin; install the CUDA toolkit (12.4 or newer)")
    entry = cuda_dir / ENTRY
    if not entry.exists():
        raise FileNotFoundError(f"kernel entry point {entry} is missing; it must #include every kernel header")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out.resolve() / CUBIN_NAME
    # Compile from inside cuda/ with a relative entry so no checkout path reaches the output: the same
    # sources give the same cubin wherever they are built.
    cmd = [nvcc, *NVCC_FLAGS, "-o", str(target), ENTRY]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cuda_dir)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return target


@click.command("build")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default="cuda/build",
    help="Folder that receives tooltrie.cubin.",
)
def cuda_build_command(out_dir: Path) -> None:
    """Compile the CUDA kernels into one sm_90 cubin."""
    try:
        path = build_cubin(out_dir)
    except (RuntimeError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{path} (sources sha256 {cuda_sources_sha256()}, cubin sha256 {cubin_sha256(path)})")
