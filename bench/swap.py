"""Hot-swap latency: ActivateVersion until every decoder has ACKed the version and serves it.

Three decoders (CPU engine) subscribe to one registry (SQLite); a catalog flips between two versions with
disjoint tool names. For each flip the clock runs from the ActivateVersion call until (a) every decoder's
grammar store serves the new version and (b) the registry has recorded every ACK. All in one process over
loopback gRPC. Usage: python bench/swap.py [--decoders 3] [--swaps 20] [--model tiny|embedded|PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402
from bench.stack import bench_runtime, scratch_dir  # noqa: E402
from tests.support.catalogs import mcp_bytes, tool  # noqa: E402
from tests.support.decoder import start_decoder  # noqa: E402
from tests.support.registry import start_registry  # noqa: E402


def wait(condition, limit: float = 60.0) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start > limit:
            raise TimeoutError("swap did not complete within 60 s")
        time.sleep(0.0005)
    return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decoders", type=int, default=3)
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "swap.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    info = machine.describe()
    with scratch_dir() as scratch_name:
        scratch = Path(scratch_name)
        registry = start_registry(f"sqlite:///{scratch / 'registry.db'}", scratch)
        runtimes = [bench_runtime(args.model, scratch) for _ in range(args.decoders)]
        decoders = [start_decoder(registry, rt, node_id=f"decoder-{i}") for i, rt in enumerate(runtimes)]
        with registry.client() as client:
            client.push("cat", mcp_bytes([tool(f"alpha.tool_{i}") for i in range(40)]), activate=True)
            for d in decoders:
                d.wait_for("cat", 1)
            client.push("cat", mcp_bytes([tool(f"beta.other_{i}") for i in range(40)]))
            served, acked = [], []
            for swap in range(args.swaps):
                target = 2 if swap % 2 == 0 else 1
                start = time.perf_counter()
                client.activate("cat", target)
                all_serving = wait(lambda t=target: all(d.server.store.active()["cat"] == t for d in decoders))
                all_acked = wait(
                    lambda t=target: (
                        sorted(s.applied_version for s in client.status("cat").decoders) == [t] * len(decoders)
                    )
                )
                served.append(all_serving - start)
                acked.append(all_acked - start)
        for d in decoders:
            d.server.stop(grace=0)
        registry.server.stop(grace=0)
    result = {
        "machine": info,
        "model": args.model,
        "decoders": args.decoders,
        "swaps": args.swaps,
        "all_serving_ms": {"p50": 1000 * machine.percentile(served, 0.5), "max": 1000 * max(served)},
        "all_acked_ms": {"p50": 1000 * machine.percentile(acked, 0.5), "max": 1000 * max(acked)},
    }
    print(f"hot swap on {info['cpu']} ({info['cores']} cores), commit {info['commit']}, model {args.model}")
    print(f"{args.decoders} decoders, {args.swaps} activations alternating two 40-tool versions")
    for label, key in (("all decoders serving", "all_serving_ms"), ("all ACKs recorded", "all_acked_ms")):
        print(f"activate -> {label}: p50 {result[key]['p50']:.1f} ms, max {result[key]['max']:.1f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
