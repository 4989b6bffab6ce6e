"""`tooltrie up --once` from a clean data dir, as a real process: the README's main command, on embedded defaults."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLE_CATALOG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_once_runs_registry_decoder_and_example_decodes(tmp_path: Path) -> None:
    env = {**os.environ, "TOOLTRIE_HOME": str(tmp_path / "home")}
    command = [
        sys.executable, "-m", "tooltrie.cli.main", "up", "--once",
        "--registry-listen", f"127.0.0.1:{free_port()}", "--decoder-listen", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "pushed: workplace v1  active" in out
    assert re.search(r"decoder listening on \S+ \(engine \w+, model SmolLM2\S+, context 8192 positions\)", out)
    assert re.search(r"compiled for gguf:SmolLM2-135M-Instruct\.Q4_1\.gguf: \d+ trie nodes", out)
    names = {t["name"] for t in json.loads(EXAMPLE_CATALOG.read_text())["tools"]}
    answers = re.findall(r"^(\d+)\. (\S+)  \(v1, score", out, flags=re.M)
    assert [int(i) for i, _ in answers] == [1, 1, 2, 1, 2]  # k = 1, 2, 2 in the example intents
    assert {tool for _, tool in answers} <= names
    assert out.count("answered in") == 3
    assert "engine auto:" in result.stderr  # the engine choice is logged in one line
    assert (tmp_path / "home" / "registry" / "registry.db").exists()
