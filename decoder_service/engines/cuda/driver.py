"""A thin, checked layer over ``cuda.bindings.driver``: every CUresult is checked and raised with the call's name.

Importing this module does not load libcuda; the first ``init()`` does, so the package imports on machines
without a GPU driver and ``cuda_available()`` can report why it cannot run.
"""

from __future__ import annotations

from typing import Any

try:
    from cuda.bindings import driver as cu
except ImportError:  # the cuda extra is not installed
    cu = None  # type: ignore[assignment]


class CudaError(RuntimeError):
    """A driver call failed; the message names the call and the CUresult."""


def _require_bindings() -> Any:
    if cu is None:
        raise CudaError("cuda.bindings is not installed; install the cuda extra (pip install 'tooltrie[cuda]')")
    return cu


def check(result: tuple, call: str) -> Any:
    """Raise CudaError unless result[0] is CUDA_SUCCESS; return the remaining value(s)."""
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(err)
        text = text.decode() if isinstance(text, bytes) else ""
        raise CudaError(f"{call} failed: {name} ({text})")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def call(name: str, *args: Any) -> Any:
    """Call ``cuda.bindings.driver.<name>(*args)`` and check its CUresult."""
    return check(getattr(_require_bindings(), name)(*args), name)


_context: Any = None


def context_usable() -> bool:
    """Whether the current context still runs work. After a sticky error (an illegal address, a kernel that
    trapped) every call on it fails until the process ends."""
    try:
        call("cuCtxSynchronize")
    except CudaError:
        return False
    return True


def init(device_ordinal: int = 0) -> Any:
    """Initialise the driver and make the device's primary context current (idempotent); return the context."""
    global _context
    if _context is None:
        _require_bindings()
        try:
            call("cuInit", 0)
        except CudaError:  # a CUresult failure already names the call and the error
            raise
        except Exception as exc:  # missing libcuda surfaces as a loader error, not a CUresult
            raise CudaError(f"cuInit failed: the CUDA driver library could not be loaded ({exc})") from exc
        device = call("cuDeviceGet", device_ordinal)
        _context = call("cuDevicePrimaryCtxRetain", device)
    call("cuCtxSetCurrent", _context)
    return _context


def cuda_available() -> tuple[bool, str]:
    """(True, device name) when a CUDA device can be used here, else (False, the reason)."""
    if cu is None:
        return False, "cuda.bindings is not installed (install the cuda extra)"
    try:
        init()
        count = call("cuDeviceGetCount")
        name = device_name()
    except Exception as exc:  # any failure means "not usable here"; the reason is the message
        return False, str(exc)
    if count < 1:
        return False, "the CUDA driver reports no device"
    return True, name


def device_name() -> str:
    """The current device's name, such as "NVIDIA H200"."""
    return call("cuDeviceGetName", 256, call("cuCtxGetDevice")).split(b"\0", 1)[0].decode()


def _device_attribute(name: str) -> int:
    """One CU_DEVICE_ATTRIBUTE_<name> of the current device."""
    attr = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(call("cuDeviceGetAttribute", attr, call("cuCtxGetDevice")))


def compute_capability() -> tuple[int, int]:
    """(major, minor) of the current device."""
    return _device_attribute("COMPUTE_CAPABILITY_MAJOR"), _device_attribute("COMPUTE_CAPABILITY_MINOR")


def multiprocessor_count() -> int:
    """Streaming multiprocessors of the current device."""
    return _device_attribute("MULTIPROCESSOR_COUNT")


def shared_memory_per_multiprocessor() -> int:
    """Bytes of shared memory one SM of the current device offers its resident blocks together."""
    return _device_attribute("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR")


class Stream:
    """A non-blocking stream; every engine launch and copy goes through one, so ordering is explicit."""

    def __init__(self) -> None:
        init()
        self.handle = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)

    def synchronize(self) -> None:
        call("cuStreamSynchronize", self.handle)

    def destroy(self) -> None:
        if self.handle is not None:
            call("cuStreamDestroy", self.handle)
            self.handle = None


class Event:
    """A timing event; ``elapsed_ms(start, end)`` reads the GPU time between two recorded events."""

    def __init__(self) -> None:
        self.handle = call("cuEventCreate", cu.CUevent_flags.CU_EVENT_DEFAULT)

    def record(self, stream: Stream) -> None:
        call("cuEventRecord", self.handle, stream.handle)

    def synchronize(self) -> None:
        call("cuEventSynchronize", self.handle)

    @staticmethod
    def elapsed_ms(start: Event, end: Event) -> float:
        return float(call("cuEventElapsedTime", start.handle, end.handle))
