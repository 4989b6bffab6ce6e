"""Push throughput and latency of the registry over real gRPC, on SQLite and PostgreSQL.

Each push carries distinct content (one description differs), so every push writes a new version.
PostgreSQL runs as a private server with fsync on; SQLite runs in WAL mode with synchronous=NORMAL.
Usage: python bench/registry_push.py [--sizes 40,1000,10000] [--out bench/results/registry_push.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402
from tests.support.catalogs import synthetic_tools  # noqa: E402
from tests.support.postgres import PostgresServer, find_pg_bin  # noqa: E402
from tests.support.registry import start_registry  # noqa: E402

PUSHES = {40: 60, 1000: 20, 10000: 6}


def bench_backend(name: str, db_url: str, sizes: list[int], scratch: Path) -> list[dict[str, object]]:
    registry = start_registry(db_url, scratch)
    rows = []
    try:
        with registry.client(timeout=600) as client:
            for size in sizes:
                tools = synthetic_tools(size)
                pushes = PUSHES.get(size, 10)
                latencies = []
                for i in range(pushes):
                    tools[0]["description"] = f"variant {i}"
                    payload = json.dumps({"tools": tools}).encode()
                    start = time.perf_counter()
                    response = client.push(f"bench{size}", payload)
                    latencies.append(time.perf_counter() - start)
                    assert response.created
                rows.append(
                    {
                        "backend": name,
                        "tools": size,
                        "pushes": pushes,
                        "payload_bytes": len(payload),
                        "pushes_per_s": pushes / sum(latencies),
                        "p50_ms": 1000 * machine.percentile(latencies, 0.5),
                        "p99_ms": 1000 * machine.percentile(latencies, 0.99),
                    }
                )
                print(format_row(rows[-1]), flush=True)
    finally:
        registry.server.stop(grace=1)
    return rows


def format_row(row: dict[str, object]) -> str:
    return (
        f"{row['backend']:9} {row['tools']:>7} {row['pushes']:>6} {row['payload_bytes']:>12} "
        f"{row['pushes_per_s']:>10.1f} {row['p50_ms']:>9.1f} {row['p99_ms']:>9.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="40,1000,10000")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "registry_push.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    info = machine.describe()
    print(f"registry push benchmark on {info['cpu']} ({info['cores']} cores), commit {info['commit']}")
    print(f"{'backend':9} {'tools':>7} {'pushes':>6} {'bytes':>12} {'pushes/s':>10} {'p50 ms':>9} {'p99 ms':>9}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        rows += bench_backend("sqlite", f"sqlite:///{scratch}/bench.db", sizes, Path(scratch))
        bin_dir = find_pg_bin()
        if bin_dir is None:
            print("postgresql: binaries not found, skipped")
        else:
            server = PostgresServer(bin_dir, fsync=True)
            try:
                rows += bench_backend("postgres", server.create_database("bench"), sizes, Path(scratch))
            finally:
                server.destroy()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": info, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
