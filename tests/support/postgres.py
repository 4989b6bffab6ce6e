"""A private PostgreSQL server for the tests: initdb into a temp dir, its own port, real restarts.

The tests own this server, so they can restart it under a running registry without touching any
PostgreSQL the machine already runs. As root, the server runs as the `postgres` user (initdb refuses root).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg


def find_pg_bin() -> Path | None:
    """Directory holding initdb and pg_ctl: $TOOLTRIE_PG_BIN, PATH, or Debian's versioned dirs."""
    if env := os.environ.get("TOOLTRIE_PG_BIN"):
        return Path(env)
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bin_dir: Path, fsync: bool = False) -> None:
        # Tests run with fsync off for speed; benchmarks turn it on to measure what production pays.
        self.fsync = fsync
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="tooltrie-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
            os.chmod(self.root, 0o700)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin_dir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode:
            raise RuntimeError(f"{tool} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}")

    def _ctl(self, action: str) -> None:
        fsync = "on" if self.fsync else "off"
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync={fsync} -c max_connections=200"
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "-m", "fast", action
        )

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        self._ctl("restart")

    def stop(self) -> None:
        self._ctl("stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
