"""`tooltrie up --once` from a clean data dir, as a real process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLE_CATALOG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_once_pushes_and_lists_the_example_catalog(tmp_path: Path) -> None:
    env = {**os.environ, "TOOLTRIE_HOME": str(tmp_path / "home")}
    command = [
        sys.executable,
        "-m",
        "tooltrie.cli.main",
        "up",
        "--once",
        "--registry-listen",
        f"127.0.0.1:{free_port()}",
    ]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "pushed: workplace v1  active" in first.stdout
    assert "workplace: active v1, latest v1" in first.stdout
    names = sorted(t["name"] for t in json.loads(EXAMPLE_CATALOG.read_text())["tools"])
    assert first.stdout.splitlines()[-1] == f"workplace v1: {', '.join(names)}"

    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "already there: workplace v1" in again.stdout
    assert (tmp_path / "home" / "registry" / "registry.db").exists()
