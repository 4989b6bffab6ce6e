"""Load tooltrie's cubin, look up kernels and globals, and launch kernels with pre-packed arguments."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from decoder_service.engines.cuda import driver
from decoder_service.engines.cuda.driver import Stream, call

# Argument kinds a kernel signature uses: device pointers travel as 64-bit integers (0 is nullptr); u64 carries
# opaque handles (a graph's conditional handle).
_CTYPES = {"ptr": ctypes.c_uint64, "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "f32": ctypes.c_float}


# Dynamic shared memory a block of an sm_90 GPU may ask for (227 KiB of the SM's 228).
MAX_SHARED_PER_BLOCK = 227 * 1024


class Kernel:
    """One ``extern "C" __global__`` function of the module. ``pdl``: launch it with programmatic stream
    serialization (see ``Module``)."""

    def __init__(self, name: str, handle: Any, pdl: bool = False) -> None:
        self.name = name
        self.handle = handle
        self.pdl = pdl

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow more than the default 48 KiB of dynamic shared memory per block."""
        attr = driver.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        call("cuFuncSetAttribute", self.handle, attr, int(nbytes))

    def max_active_clusters(self, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int) -> int:
        """How many of this kernel's clusters (its compile-time cluster shape) the GPU holds at once with ``block``
        threads and ``shared`` bytes of dynamic shared memory a block (``grid``: whole clusters)."""
        config = driver.cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = shared
        config.numAttrs = 0
        return int(call("cuOccupancyMaxActiveClusters", self.handle, config))

    def prefer_max_shared(self) -> None:
        """Ask for the SM configuration with the most shared memory (and the least L1) whenever this kernel runs,
        so that blocks of consecutive kernels that each hold a large shared-memory ring fit on one SM together
        and no SM has to drain to change its configuration between them."""
        attr = driver.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        call("cuFuncSetAttribute", self.handle, attr, 100)


class Launch:
    """A kernel launch whose arguments are packed once into ctypes storage.

    Re-launching costs one ``cuLaunchKernel`` call with an argument-pointer array already built; ``set``
    changes one argument (e.g. the position) in place for the next launch.
    """

    def __init__(
        self,
        kernel: Kernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: list[tuple[str, int | float]],
        shared_bytes: int = 0,
        label: str = "",
        cooperative: bool = False,
    ) -> None:
        if any(g <= 0 for g in grid) or any(b <= 0 for b in block):
            raise ValueError(f"{kernel.name}: grid {grid} and block {block} must be positive")
        self.kernel = kernel
        self.label = label or kernel.name  # what profiles group by (e.g. which GEMV of the layer)
        self.grid = grid
        self.block = block
        self.shared_bytes = shared_bytes
        # A cooperative launch starts only with every block resident at once, which grid-wide barriers need (a
        # barrier among blocks of which some wait for an SM would never open).
        self.cooperative = cooperative
        try:
            self._values = [_CTYPES[kind](value) for kind, value in args]
        except KeyError as exc:
            raise ValueError(f"{kernel.name}: argument kind {exc} is not one of {sorted(_CTYPES)}") from exc
        self._pointers = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(v) for v in self._values])
        self._params = ctypes.addressof(self._pointers)
        self._config: Any = None  # cuLaunchKernelEx's configuration, built on the first programmatic launch
        self._config_stream: Any = None

    def set(self, index: int, value: int | float) -> None:
        self._values[index].value = value

    def arg(self, index: int) -> int | float:
        return self._values[index].value

    def set_grid(self, grid: tuple[int, int, int]) -> None:
        """Relaunch with another grid (for kernels whose result does not depend on it, e.g. the GEMV)."""
        if any(g <= 0 for g in grid):
            raise ValueError(f"{self.kernel.name}: grid {grid} must be positive")
        self.grid, self._config = grid, None

    def __call__(self, stream: Stream) -> None:
        if self.kernel.pdl or self.cooperative:
            err = driver.cu.cuLaunchKernelEx(self._launch_config(stream), self.kernel.handle, self._params, 0)
            driver.check(err, f"cuLaunchKernelEx({self.kernel.name})")
            return
        err = driver.cu.cuLaunchKernel(
            self.kernel.handle, *self.grid, *self.block, self.shared_bytes, stream.handle, self._params, 0
        )
        driver.check(err, f"cuLaunchKernel({self.kernel.name})")

    def _launch_config(self, stream: Stream) -> Any:
        """The launch shape plus the programmatic-stream-serialization and cooperative attributes it has, kept while
        the stream is."""
        if self._config is None or self._config_stream is not stream.handle:
            cu = driver.cu
            attrs = []
            if self.kernel.pdl:
                attr = cu.CUlaunchAttribute()
                attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                attr.value.programmaticStreamSerializationAllowed = 1
                attrs.append(attr)
            if self.cooperative:
                attr = cu.CUlaunchAttribute()
                attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
                attr.value.cooperative = 1
                attrs.append(attr)
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = self.grid
            config.blockDimX, config.blockDimY, config.blockDimZ = self.block
            config.sharedMemBytes = self.shared_bytes
            config.hStream = stream.handle
            config.attrs = attrs
            config.numAttrs = len(attrs)
            self._config, self._config_stream = config, stream.handle
        return self._config


def pdl_default() -> bool:
    """Programmatic dependent launch where the device has it (compute capability 9.0 and later), unless
    ``TOOLTRIE_CUDA_PDL=0`` turns it off (to measure it, or to rule it out)."""
    if os.environ.get("TOOLTRIE_CUDA_PDL", "1") == "0":
        return False
    return driver.compute_capability()[0] >= 9


class Module:
    """A loaded cubin; kernels are looked up once and cached.

    ``pdl`` (default: ``pdl_default()``): every kernel is launched with programmatic stream serialization, so
    it may start before the kernel ahead of it on the stream has finished; each kernel waits for its
    predecessors itself before touching activations (``pdl_wait`` in cuda/common.cuh), so results are the same
    bits either way. Stream capture keeps the relation as programmatic graph edges.
    """

    def __init__(self, cubin: Path | str | bytes, pdl: bool | None = None) -> None:
        driver.init()
        image = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
        self.handle = call("cuModuleLoadData", image)
        self.pdl = pdl_default() if pdl is None else pdl
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, name: str) -> Kernel:
        if name not in self._kernels:
            handle = call("cuModuleGetFunction", self.handle, name.encode())
            self._kernels[name] = Kernel(name, handle, pdl=self.pdl)
        return self._kernels[name]

    def get_global(self, name: str) -> tuple[int, int]:
        """(device address, size in bytes) of a ``__device__`` or ``__constant__`` symbol."""
        ptr, size = call("cuModuleGetGlobal", self.handle, name.encode())
        return int(ptr), int(size)

    def unload(self) -> None:
        if self.handle is not None:
            call("cuModuleUnload", self.handle)
            self.handle = None
