"""Message limits shared by every tooltrie client and server.

gRPC's default 4 MB receive limit would fail on a catalog of 100,000 tools or a compiled trie of tens of MB,
so both ends raise it explicitly to the same value.
"""

from __future__ import annotations

# 1 GiB: well above a 100,000-tool catalog (about 60 MB with schemas) and far below gRPC's 2 GiB hard cap.
MAX_MESSAGE_BYTES = 1 << 30

DEFAULT_REGISTRY_ADDRESS = "127.0.0.1:50151"
DEFAULT_DECODER_ADDRESS = "127.0.0.1:50152"


# Error details ride in trailing metadata; servers keep them under 8 KiB, clients accept more to be safe.
MAX_METADATA_BYTES = 64 * 1024


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ]
