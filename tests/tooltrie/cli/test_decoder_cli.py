"""`tooltrie decoder serve` as a real process, as the README runs it beside a registry, then `tooltrie decode` and
`tooltrie decoder status` against it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from decoder_service.models.synth import write_synthetic_checkpoint
from tests.conftest import EXAMPLE_CATALOG
from tests.support.registry import RunningRegistry, start_registry
from tests.support.waiting import wait_until
from tests.tooltrie.cli.test_up import free_port
from tooltrie.cli.main import main
from tooltrie.decoder_client import DecoderClient

EXAMPLE_NAMES = {t["name"] for t in json.loads(EXAMPLE_CATALOG.read_text())["tools"]}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_checkpoint("tiny", 7, tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RunningRegistry]:
    running = start_registry(f"sqlite:///{tmp_path / 'registry.db'}", tmp_path)
    with running.client() as client:
        client.push("workplace", EXAMPLE_CATALOG.read_bytes(), activate=True)
    yield running
    running.server.stop(grace=1)


def serve_command(registry: RunningRegistry, checkpoint: Path, address: str, *options: str) -> list[str]:
    """`tooltrie decoder serve` on the CPU engine, as an operator types it."""
    return [
        sys.executable, "-m", "tooltrie.cli.main", "decoder", "serve", "--registry", registry.address,
        "--token", registry.tokens["alice"], "--listen", address, "--model", str(checkpoint), "--engine", "cpu",
        "--node-id", "cli-decoder", *options,
    ]  # fmt: skip


def serve(registry: RunningRegistry, checkpoint: Path, *options: str) -> tuple[subprocess.Popen[str], str]:
    """A decoder process on the CPU engine; returns it and its address once it serves workplace v1."""
    address = f"127.0.0.1:{free_port()}"
    command = serve_command(registry, checkpoint, address, *options)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def serving() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"decoder serve exited {process.returncode}: {process.stderr.read()[-3000:]}")
        try:
            with DecoderClient(address, timeout=2) as client:
                return any(c.catalog == "workplace" and c.active_version == 1 for c in client.status().catalogs)
        except grpc.RpcError:
            return False

    wait_until(serving, "the decoder process to serve workplace v1", seconds=120, interval=0.2)
    return process, address


def stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM, as an operator stops it: the process drains and exits 0; returns its log."""
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    return err


@pytest.mark.parametrize("mode", ["token", "char"])
def test_decoder_serve_answers_decode_and_status(registry: RunningRegistry, tiny_checkpoint: Path, mode: str) -> None:
    process, address = serve(registry, tiny_checkpoint, "--grammar-mode", mode, "--max-context", "3000")
    try:
        env = {"TOOLTRIE_DECODER": address}
        decoded = CliRunner().invoke(main, ["decode", "open an issue about the crash", "--catalog", "workplace",
                                            "-k", "2", "--json"], env=env, catch_exceptions=False)  # fmt: skip
        assert decoded.exit_code == 0, decoded.output
        records = [json.loads(line) for line in decoded.output.splitlines()]
        tools = [r["tool"] for r in records if "tool" in r]
        assert len(set(tools)) == 2 and set(tools) <= EXAMPLE_NAMES

        status = CliRunner().invoke(main, ["decoder", "status"], env=env, catch_exceptions=False)
        assert status.exit_code == 0, status.output
        assert re.search(
            r"node cli-decoder: engine cpu, model \S+, context 3000 positions, registry connected", status.output
        )
        assert "workplace: active v1 (held v1)" in status.output
    finally:
        log = stop(process)
    assert "SIGTERM: shutting down" in log


def test_decoder_serve_refuses_a_context_past_the_models(registry: RunningRegistry, tiny_checkpoint: Path) -> None:
    """One line naming the limit and exit 1, no traceback, nothing left running."""
    command = serve_command(registry, tiny_checkpoint, f"127.0.0.1:{free_port()}", "--max-context", "5000")
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Error: max context 5,000 positions exceeds the 4,096 the model was trained for" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_decoder_says_how_to_start_one() -> None:
    result = CliRunner().invoke(main, ["decode", "x", "--catalog", "c", "--decoder", f"127.0.0.1:{free_port()}"])
    assert result.exit_code == 1
    assert "error: UNAVAILABLE" in result.output and "start one with `tooltrie decoder serve`" in result.output
