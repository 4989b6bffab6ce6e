"""A gRPC server for the registry or a decoder: its options, and binding its address with or without TLS."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from tooltrie.grpc_limits import channel_options


def new_server(max_workers: int, thread_name_prefix: str) -> grpc.Server:
    """A server with the message limits of `channel_options` and without SO_REUSEPORT, which gRPC sets by default:
    with it a second server on a busy port starts and takes a share of the calls instead of failing to bind."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix),
        options=[*channel_options(), ("grpc.so_reuseport", 0)],
    )


def bind(server: grpc.Server, address: str, tls_cert: Path | None, tls_key: Path | None) -> int:
    """Binds ``address`` (TLS with both files given) and returns the port. ValueError names a TLS file that is
    missing or not PEM; OSError says the address cannot be listened on."""
    credentials = None
    if tls_cert or tls_key:
        if not (tls_cert and tls_key):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        cert, key = _pem(tls_cert, "--tls-cert", "CERTIFICATE"), _pem(tls_key, "--tls-key", "PRIVATE KEY")
        credentials = grpc.ssl_server_credentials([(key, cert)])
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # gRPC's "Failed to bind to address ..."
        raise OSError(f"cannot listen on {address}: it is in use, not an address of this host, or malformed") from exc
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return port


def _pem(path: Path, option: str, kind: str) -> bytes:
    """The file's bytes, if they hold a PEM block of ``kind`` (a certificate or a private key)."""
    data = path.read_bytes()
    if b"-----BEGIN " not in data or f"{kind}-----".encode() not in data:
        raise ValueError(f"{option} {path} holds no PEM {kind.lower()}")
    return data
