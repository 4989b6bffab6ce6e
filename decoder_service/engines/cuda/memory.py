"""Device buffers: allocation, stream-ordered copies to and from numpy arrays, NaN poisoning for tests."""

from __future__ import annotations

import numpy as np

from decoder_service.engines.cuda import driver
from decoder_service.engines.cuda.driver import CudaError, Stream, call
from decoder_service.models.bf16 import float32_to_bf16_bits


class DeviceMemoryError(CudaError):
    """The device has too little free memory for an allocation or a model; the message says how much of each."""


def device_memory() -> tuple[int, int]:
    """(free, total) bytes of the current device's memory."""
    driver.init()
    free, total = call("cuMemGetInfo")
    return int(free), int(total)


def byte_size(n: int) -> str:
    """``n`` bytes for a message: MiB below a GiB, GiB from there."""
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def check_device_memory(what: str, parts: dict[str, int]) -> None:
    """DeviceMemoryError unless the device has the bytes of every part of ``what`` free at once; the message names
    each part and the device's free and total memory."""
    need = sum(parts.values())
    free, total = device_memory()
    if need > free:
        detail = ", ".join(f"{name} {byte_size(n)}" for name, n in parts.items())
        raise DeviceMemoryError(
            f"{what} needs {byte_size(need)} of device memory ({detail}); the device has {byte_size(free)} free of "
            f"{byte_size(total)}"
        )


class DeviceBuffer:
    """``nbytes`` of device memory; ``ptr`` is the address kernels receive."""

    def __init__(self, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"device buffer size must be positive, got {nbytes}")
        driver.init()
        self.nbytes = int(nbytes)
        result = driver.cu.cuMemAlloc(self.nbytes)
        if result[0] == driver.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            free, total = device_memory()
            raise DeviceMemoryError(
                f"cuMemAlloc of {byte_size(self.nbytes)} failed: out of device memory ({byte_size(free)} free of "
                f"{byte_size(total)})"
            )
        self.ptr = int(driver.check(result, "cuMemAlloc"))

    @classmethod
    def from_array(cls, array: np.ndarray, stream: Stream) -> DeviceBuffer:
        buf = cls(array.nbytes)
        buf.upload(array, stream)
        return buf

    def upload(self, array: np.ndarray, stream: Stream, offset: int = 0) -> None:
        """Copy a host array into the buffer at byte ``offset`` and wait for it (the host array may be freed)."""
        host = np.ascontiguousarray(array)
        if offset + host.nbytes > self.nbytes:
            raise ValueError(f"upload of {host.nbytes} bytes at offset {offset} overflows a {self.nbytes}-byte buffer")
        call("cuMemcpyHtoDAsync", self.ptr + offset, host.ctypes.data, host.nbytes, stream.handle)
        stream.synchronize()

    def download(
        self, dtype: np.dtype | type, shape: tuple[int, ...] | int, stream: Stream, offset: int = 0
    ) -> np.ndarray:
        """Wait for the stream, then copy ``shape`` elements of ``dtype`` from byte ``offset`` to a new array."""
        out = np.empty(shape, dtype=dtype)
        if offset + out.nbytes > self.nbytes:
            raise ValueError(f"download of {out.nbytes} bytes at offset {offset} overflows a {self.nbytes}-byte buffer")
        call("cuMemcpyDtoHAsync", out.ctypes.data, self.ptr + offset, out.nbytes, stream.handle)
        stream.synchronize()
        return out

    def fill_u32(self, word: int, stream: Stream) -> None:
        """Set every 32-bit word (e.g. 0x7FC00000, a quiet NaN, to catch unwritten outputs)."""
        call("cuMemsetD32Async", self.ptr, word & 0xFFFFFFFF, self.nbytes // 4, stream.handle)

    def free(self) -> None:
        if self.ptr:
            call("cuMemFree", self.ptr)
            self.ptr = 0


NAN_WORD = 0x7FC00000


def to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """Round a float array to bfloat16 (nearest, ties to even) and return the raw bits as uint16.

    uint16 input is taken as bf16 bits already; an ml_dtypes bfloat16 array is reinterpreted as its bits.
    """
    if array.dtype == np.uint16:
        return np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":
        return np.ascontiguousarray(array).view(np.uint16)
    if array.dtype.kind != "f":
        raise TypeError(f"weights must be floating point, uint16 bf16 bits or bfloat16; got {array.dtype}")
    return float32_to_bf16_bits(array)


class MappedHostBuffer:
    """Pinned host memory mapped into the device's address space: kernels write it, the host reads it while
    they run (the decode loop publishes each completed pointer here)."""

    def __init__(self, nbytes: int) -> None:
        import ctypes

        driver.init()
        self.nbytes = int(nbytes)
        flags = driver.cu.CU_MEMHOSTALLOC_DEVICEMAP if hasattr(driver.cu, "CU_MEMHOSTALLOC_DEVICEMAP") else 2
        self.host_ptr = int(call("cuMemHostAlloc", self.nbytes, flags))
        self.ptr = int(call("cuMemHostGetDevicePointer", self.host_ptr, 0))
        self.words = np.ctypeslib.as_array((ctypes.c_int32 * (self.nbytes // 4)).from_address(self.host_ptr))

    def free(self) -> None:
        if self.host_ptr:
            call("cuMemFreeHost", self.host_ptr)
            self.host_ptr = 0
