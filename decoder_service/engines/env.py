"""Engine settings read from the environment, checked against their range."""

from __future__ import annotations

import os


def env_int(name: str, default: int, low: int, high: int) -> int:
    """An integer setting from the environment, ``default`` when unset; out of [low, high] is an error."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise ValueError(f"{name}={value} is out of range: {low} to {high}")
    return value


FORCED_TAIL_ENV = "TOOLTRIE_FORCED_TAIL"  # 0: a forward pass after every token but the last


def forced_tail_default() -> bool:
    """Whether engines take an answer's forced tail without forward passes: $TOOLTRIE_FORCED_TAIL, else yes."""
    return env_int(FORCED_TAIL_ENV, 1, 0, 1) == 1


FORCED_CHAINS_ENV = "TOOLTRIE_FORCED_CHAINS"  # 0: a forward pass per token


def forced_chains_default() -> bool:
    """Whether engines feed the tokens the grammar forces after a chosen one through the same forward pass:
    $TOOLTRIE_FORCED_CHAINS, else yes."""
    return env_int(FORCED_CHAINS_ENV, 1, 0, 1) == 1
