"""Runs a real registry on a real socket for the tests, in-process or as a child process."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from registry_service.server import RegistryConfig, RegistryServer
from registry_service.validation import CatalogLimits
from tooltrie.client import RegistryClient


@dataclass
class RunningRegistry:
    server: RegistryServer
    address: str
    tokens: dict[str, str] = field(default_factory=dict)  # name -> token

    def client(self, token_name: str | None = "alice", **kwargs: object) -> RegistryClient:
        client = RegistryClient(self.address, token=self.tokens[token_name] if token_name else None, **kwargs)  # type: ignore[arg-type]
        if token_name is None:
            client.token = None  # anonymous: no fallback to $TOOLTRIE_TOKEN or a local admin token
        return client


def make_tokens(*names: str) -> dict[str, str]:
    return {name: secrets.token_urlsafe(24) for name in names}


def write_tokens_file(path: Path, tokens: dict[str, str]) -> Path:
    path.write_text("".join(f"{name}:{token}\n" for name, token in tokens.items()))
    return path


def start_registry(
    db_url: str,
    tmp_path: Path,
    limits: CatalogLimits | None = None,
    listen: str = "127.0.0.1:0",
    tokens: dict[str, str] | None = None,
    **config: object,
) -> RunningRegistry:
    tokens = tokens or make_tokens("alice", "bob")
    server = RegistryServer(
        RegistryConfig(
            db_url=db_url,
            listen=listen,
            tokens_file=write_tokens_file(tmp_path / "tokens", tokens),
            limits=limits or CatalogLimits(),
            db_check_seconds=0.2,
            **config,  # type: ignore[arg-type]
        )
    )
    server.start()
    running = RunningRegistry(server, f"127.0.0.1:{server.port}", tokens)
    with running.client() as client:
        client.channel_ready(timeout=60)
    return running


class RegistryProcess:
    """`tooltrie registry serve` as a child process, for tests that kill it."""

    def __init__(self, db_url: str, tmp_path: Path, tokens: dict[str, str]) -> None:
        tokens_file = write_tokens_file(tmp_path / "tokens", tokens)
        env = {**os.environ, "TOOLTRIE_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tooltrie.cli.main",
                "registry",
                "serve",
                "--db",
                db_url,
                "--listen",
                "127.0.0.1:0",
                "--tokens-file",
                str(tokens_file),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if not match:
            self.process.kill()
            raise RuntimeError(f"registry did not start: {line!r}")
        self.address = match.group(1)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
