"""Binding a server's address: a busy port, a half TLS setup and a file that is not PEM each fail with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tls import self_signed_cert
from tooltrie.grpc_listen import bind, new_server


def test_a_busy_port_is_refused_not_shared() -> None:
    """gRPC's default SO_REUSEPORT would let a second server bind the port and take a share of its calls."""
    first, second = new_server(1, "first"), new_server(1, "second")
    port = bind(first, "127.0.0.1:0", None, None)
    first.start()
    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: it is in use"):
            bind(second, f"127.0.0.1:{port}", None, None)
    finally:
        first.stop(grace=None)


def test_tls_needs_both_files_and_pem_in_each(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    with pytest.raises(ValueError, match="TLS needs both --tls-cert and --tls-key"):
        bind(new_server(1, "t"), "127.0.0.1:0", cert, None)
    text = tmp_path / "notes.txt"
    text.write_text("not a certificate")
    with pytest.raises(ValueError, match=f"--tls-cert {text} holds no PEM certificate"):
        bind(new_server(1, "t"), "127.0.0.1:0", text, key)
    with pytest.raises(ValueError, match=f"--tls-key {cert} holds no PEM private key"):
        bind(new_server(1, "t"), "127.0.0.1:0", cert, cert)  # the certificate given as the key
    assert bind(new_server(1, "t"), "127.0.0.1:0", cert, key) > 0
