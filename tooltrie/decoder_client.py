"""Client library for the decoder: stream the pointers of one answer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from tooltrie.client import make_channel
from tooltrie.decoder.v1 import decoder_pb2 as pb
from tooltrie.decoder.v1 import decoder_pb2_grpc
from tooltrie.grpc_limits import DEFAULT_DECODER_ADDRESS

DECODER_ENV = "TOOLTRIE_DECODER"


class DecoderClient:
    def __init__(
        self, address: str | None = None, tls_ca: Path | None = None, timeout: float = 300.0, token: str | None = None
    ) -> None:
        self.address = address or os.environ.get(DECODER_ENV) or DEFAULT_DECODER_ADDRESS
        self.channel = make_channel(self.address, tls_ca)
        self.stub = decoder_pb2_grpc.DecoderStub(self.channel)
        self.timeout = timeout
        self.metadata = [("authorization", f"Bearer {token}")] if token else []

    def decode(self, catalog: str, intent: str, k: int, version: int = 0) -> Iterator[pb.DecodeResponse]:
        """Yields each pointer as the decoder streams it, then the summary."""
        request = pb.DecodeRequest(catalog=catalog, intent=intent, k=k, version=version)
        yield from self.stub.Decode(request, timeout=self.timeout, metadata=self.metadata)

    def status(self) -> pb.GetStatusResponse:
        return self.stub.GetStatus(pb.GetStatusRequest(), timeout=self.timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> DecoderClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
