"""A real decoder (tiny synthetic model, CPU engine) subscribed to a real registry, both on real sockets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from decoder_service.model_runtime import ModelRuntime, load_runtime
from decoder_service.server import DecoderConfig, DecoderServer
from tests.support.registry import RunningRegistry
from tests.support.waiting import wait_until
from tooltrie.decoder_client import DecoderClient


@dataclass
class RunningDecoder:
    server: DecoderServer
    address: str

    def client(self, timeout: float = 120.0) -> DecoderClient:
        return DecoderClient(self.address, timeout=timeout)

    def wait_for(self, catalog: str, version: int, seconds: float = 60.0) -> None:
        store = self.server.store
        wait_until(
            lambda: store.active().get(catalog) == version, f"the decoder to serve {catalog} v{version}", seconds
        )


def start_decoder(
    registry: RunningRegistry, runtime: ModelRuntime, node_id: str = "decoder-a", **config: object
) -> RunningDecoder:
    server = DecoderServer(
        DecoderConfig(
            registry=registry.address,
            registry_token=registry.tokens["alice"],
            listen="127.0.0.1:0",
            node_id=node_id,
            **config,  # type: ignore[arg-type]
        ),
        runtime,
    )
    server.start()
    return RunningDecoder(server, f"127.0.0.1:{server.port}")


def tiny_runtime(model_dir: Path, head: str = "sparse") -> ModelRuntime:
    return load_runtime(model_dir, engine="cpu", head=head)
