"""Admission control: a fixed number of decodes run at once, a bounded number wait, the rest are refused."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Overloaded(RuntimeError):
    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Admission:
    def __init__(self, max_active: int, max_queued: int, retry_after: float = 0.5) -> None:
        if max_active < 1 or max_queued < 0:
            raise ValueError(f"max_active must be >= 1 and max_queued >= 0, got {max_active}, {max_queued}")
        self.max_active, self.max_queued, self.retry_after = max_active, max_queued, retry_after
        self._slots = threading.Semaphore(max_active)
        self._lock = threading.Lock()
        self._waiting = 0

    @contextmanager
    def slot(self, is_active: Callable[[], bool] = lambda: True) -> Iterator[None]:
        """Holds one of max_active slots; waits in a queue of max_queued; refuses beyond that."""
        if not self._slots.acquire(blocking=False):
            with self._lock:
                if self._waiting >= self.max_queued:
                    raise Overloaded(
                        f"decoder busy: {self.max_active} decoding and {self._waiting} queued; retry shortly",
                        self.retry_after,
                    )
                self._waiting += 1
            try:
                while not self._slots.acquire(timeout=0.1):
                    if not is_active():  # the caller cancelled or its deadline passed while queued
                        raise Overloaded("cancelled while queued", self.retry_after)
            finally:
                with self._lock:
                    self._waiting -= 1
        try:
            yield
        finally:
            self._slots.release()

    @property
    def waiting(self) -> int:
        return self._waiting
