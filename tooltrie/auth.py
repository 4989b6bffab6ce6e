"""Bearer tokens: each token has a name (the registry records it as the author in its audit log).

The registry is secure by default: with no tokens configured, it generates an admin token on first start and
keeps it in its data dir with mode 0600, where the CLI and decoders on the same machine find it.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from tooltrie.paths import admin_token_path

log = logging.getLogger(__name__)

TOKENS_ENV = "TOOLTRIE_REGISTRY_TOKENS"
ADMIN_NAME = "admin"


class TokenConfigError(ValueError):
    pass


def parse_token_entries(entries: Sequence[str], source: str) -> dict[str, str]:
    """Parses `name:token` entries into {token: name}."""
    tokens: dict[str, str] = {}
    for number, entry in enumerate(entries, 1):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        name, sep, token = entry.partition(":")
        if not sep or not name.strip() or not token.strip():
            raise TokenConfigError(f"{source}, entry {number}: expected NAME:TOKEN, got {entry[:20]!r}...")
        if len(token.strip()) < 16:
            raise TokenConfigError(f"{source}, entry {number}: token of {name.strip()!r} is shorter than 16 characters")
        tokens[token.strip()] = name.strip()
    return tokens


def load_server_tokens(tokens_file: Path | None) -> dict[str, str]:
    """Registry tokens: --tokens-file, else $TOOLTRIE_REGISTRY_TOKENS, else the generated admin token."""
    return load_optional_tokens(tokens_file, TOKENS_ENV) or parse_token_entries(
        [ensure_admin_token()], str(admin_token_path())
    )


def load_optional_tokens(tokens_file: Path | None, env_name: str) -> dict[str, str]:
    """{token: name} from a file of NAME:TOKEN lines, else from a comma-separated environment variable, else {}."""
    if tokens_file is not None:
        return parse_token_entries(tokens_file.read_text().splitlines(), str(tokens_file))
    if env := os.environ.get(env_name):
        return parse_token_entries(env.split(","), env_name)
    return {}


def ensure_admin_token() -> str:
    """Returns `admin:TOKEN` from the data dir, creating it (mode 0600) on first use."""
    path = admin_token_path()
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = f"{ADMIN_NAME}:{secrets.token_urlsafe(32)}"
    # O_EXCL: two registries starting at once must not overwrite each other's token.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(entry + "\n")
    log.info("no tokens configured: generated an admin token in %s (mode 0600)", path)
    return entry


class Authenticator:
    def __init__(self, tokens: dict[str, str]) -> None:
        if not tokens:
            raise TokenConfigError("no tokens configured")
        self._tokens = tokens

    def identify(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        """The token's name for an `authorization: Bearer TOKEN` header, else None."""
        for key, value in metadata:
            if key != "authorization" or not isinstance(value, str):
                continue
            scheme, _, presented = value.partition(" ")
            if scheme.lower() != "bearer":
                return None
            for token, name in self._tokens.items():
                if hmac.compare_digest(token.encode(), presented.strip().encode()):
                    return name
        return None
