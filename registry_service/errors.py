"""Domain errors of the registry; the gRPC layer maps each to one status code."""

from __future__ import annotations

from tooltrie.rpc_status import FieldViolation


class RegistryError(Exception):
    """Base class: the message is shown to the caller as is."""


class InvalidArgument(RegistryError):
    def __init__(self, message: str, violations: list[FieldViolation]) -> None:
        super().__init__(message)
        self.violations = violations


class NotFound(RegistryError):
    pass


class FailedPrecondition(RegistryError):
    pass


class Aborted(RegistryError):
    """A compare-and-set lost: the caller should re-read and retry."""

    def __init__(self, message: str, current_version: int) -> None:
        super().__init__(message)
        self.current_version = current_version


class Unavailable(RegistryError):
    pass


class DeadlineExceeded(RegistryError):
    pass
