"""What a benchmark ran on, for its printed table and JSON."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def gpu_missing() -> bool:
    """True, having said why on stderr, where no CUDA device is usable (the GPU benchmarks then exit 2)."""
    from decoder_service.engines.cuda.driver import cuda_available

    ok, reason = cuda_available()
    if not ok:
        print(f"no usable CUDA device: {reason}", file=sys.stderr)
    return not ok


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    """The short commit, with "-dirty" when tracked code differs from it (the numbers then belong to no commit).

    Results files are left out of the comparison: a benchmark run rewrites them."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results", ":!results"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


def describe() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def run_env(run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The lines of a scripts/gpu_run.sh folder's env.txt (date, device and toolchain first), and its ``key value``
    lines (cuda_sources_sha256, cubin_sha256) by key."""
    lines = (run_dir / "env.txt").read_text().splitlines()
    pairs = (line.split(maxsplit=1) for line in lines if " " in line)
    return lines, {key: value for key, value in pairs if key.endswith("_sha256")}


def code_identity_lines(keyed: dict[str, str]) -> list[str]:
    """The results files' lines that name the kernels' sources and, where the run recorded it, the cubin built."""
    sources = keyed.get("cuda_sources_sha256", "?")
    lines = [f"- cuda/ sources sha256: `{sources}` (`tooltrie.cuda_build.cuda_sources_sha256()`)"]
    if "cubin_sha256" in keyed:
        cubin = keyed["cubin_sha256"]
        lines.append(
            f"- cubin sha256: `{cubin}` (`tooltrie cuda build` prints it; the same hash, the same machine code)"
        )
    return lines


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (no interpolation), as the benchmark tables report it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
