"""Polling with a deadline, for conditions another thread or process makes true."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 60.0, interval: float = 0.01) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")
        time.sleep(interval)
