"""Opaque page tokens: the last key of the previous page, as URL-safe base64 JSON."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from registry_service.errors import InvalidArgument
from tooltrie.rpc_status import FieldViolation

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(requested: int) -> int:
    """0 means the default; anything over the maximum is coerced down (AIP-158)."""
    return DEFAULT_PAGE_SIZE if requested <= 0 else min(requested, MAX_PAGE_SIZE)


def encode(key: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, sort_keys=True).encode()).decode()


def decode(token: str, expected_key: str) -> Any:
    """The key's value, or None for the first page; a token from another list is rejected."""
    if not token:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError):
        value = None
    if not isinstance(value, dict) or expected_key not in value:
        raise InvalidArgument(
            "invalid page token",
            [FieldViolation("page_token", "not a token returned by this list; pass next_page_token as given")],
        )
    return value[expected_key]
