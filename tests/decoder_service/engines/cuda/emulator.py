"""A CPU stand-in for ``cuda.bindings.driver``: device memory is a numpy heap, and each kernel launch is
decoded from its packed argument array with the parameter names and types parsed from ``cuda/*.cuh``,
then executed by the numpy references. It checks the runtime's plumbing (argument order, pointer
offsets, buffer layouts, launch shapes) without a GPU; the kernels' own arithmetic is checked on the GPU."""

from __future__ import annotations

import ctypes
import re
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from decoder_service.engines.cuda.forward import (
    ATTN_CHUNK,
    ATTN_CLUSTER,
    ATTN_PREFILL_QUERIES,
    SHORT_ATTENTION_POSITIONS,
    gemm_mma_halves_shared,
    gemm_mma_shared,
    prefill_attention_shared,
)
from decoder_service.engines.cuda.gemm_cluster import cluster_shared
from decoder_service.engines.cuda.persistent import LAYER_FIELDS, LAYER_FORMAT, PLAN_FIELDS, PLAN_FORMAT
from decoder_service.models.bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from tests.decoder_service.engines.cuda import reference as ref

CUDA_DIR = Path(__file__).resolve().parents[4] / "cuda"
_SIGNATURE = re.compile(
    r'extern "C" __global__ void(?: __cluster_dims__\([^)]*\))?(?: __launch_bounds__\([^)]*\))?\s+(\w+)\s*\(([^)]*)\)',
    re.S,
)


# A parameter list shared by several kernels: `#define NAME_PARAMS` and its continued lines.
_PARAM_MACRO = re.compile(r"^#define (\w+_PARAMS)\s((?:.*\\\n)*.*)$", re.M)


def kernel_signatures(cuda_dir: Path = CUDA_DIR) -> dict[str, list[tuple[str, str]]]:
    """{kernel: [(parameter name, 'ptr' | 'i32' | 'f32'), ...]} from the sources."""
    sources = [path.read_text() for path in sorted(cuda_dir.glob("*.cuh"))]
    macros = {name: body.replace("\\\n", " ") for text in sources for name, body in _PARAM_MACRO.findall(text)}
    sigs = {}
    for text in sources:
        for name, params in _SIGNATURE.findall(text):
            params = macros.get(params.strip(), params)
            parsed = []
            for param in params.split(","):
                words = param.replace("*", " * ").split()
                kind = "ptr" if "*" in words else {"int": "i32", "float": "f32", "long": "u64"}[words[-2]]
                parsed.append((words[-1], kind))
            sigs[name] = parsed
    return sigs


class _Ok:
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_READY = 600


def install_fake_driver(monkeypatch: Any, heap_bytes: int = 64 << 20) -> FakeDriver:
    """Stand a FakeDriver in for ``cuda.bindings.driver`` for one test (``monkeypatch`` undoes it)."""
    from decoder_service.engines.cuda import driver

    fake = FakeDriver(heap_bytes=heap_bytes)
    monkeypatch.setattr(driver, "cu", fake)
    monkeypatch.setattr(driver, "_context", None)
    return fake


class StickyFailure:
    """A driver whose context met a sticky error (an illegal address, a trapped kernel): from now on every call
    returns ``err``, as a real context's calls do until the process ends; error names, enums and constants still
    answer."""

    def __init__(self, fake: FakeDriver, err: int) -> None:
        self._fake, self._err = fake, err

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fake, name)
        if name.startswith("cu") and callable(value) and name not in ("cuGetErrorName", "cuGetErrorString"):
            return lambda *args: (self._err, None)
        return value


class FakeDriver:
    """The subset of cuda.bindings.driver the engine calls, every call returning (CUresult, values...)."""

    CUresult = _Ok
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUevent_flags = SimpleNamespace(CU_EVENT_DEFAULT=0)
    CUfunction_attribute = SimpleNamespace(
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT=9
    )
    CUdevice_attribute = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT=16,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR=81,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
    )
    CU_MEMHOSTALLOC_DEVICEMAP = 2
    BASE = 1 << 32

    def __init__(self, heap_bytes: int = 64 << 20) -> None:
        self.heap = np.zeros(heap_bytes, dtype=np.uint8)
        self.top = 0
        self.sigs = kernel_signatures()
        self.launches: list[str] = []
        self.programmatic_launches = 0
        self.cooperative_launches = 0
        self.sm_count = 132  # an H200's SMs (cuDeviceGetAttribute below)
        self.live: set[int] = set()  # device allocations not yet freed
        self.sizes: dict[int, int] = {}  # the live allocations' bytes
        self.scratch: dict[tuple[int, ...], list[int]] = {}  # emulated kernels' own working memory
        self.live_host: set[int] = set()  # mapped host allocations not yet freed

    # -- memory ---------------------------------------------------------------------------------------
    def view(self, ptr: int, dtype: type, count: int) -> np.ndarray:
        if ptr == 0:
            raise AssertionError("kernel dereferenced a null pointer")
        off = ptr - self.BASE
        nbytes = count * np.dtype(dtype).itemsize
        if off < 0 or off + nbytes > self.top:
            raise AssertionError(f"access of {nbytes} bytes at offset {off} is outside allocated memory")
        return self.heap[off : off + nbytes].view(dtype)

    def _fits(self, n: int) -> bool:
        return (self.top + n + 255) // 256 * 256 <= self.heap.size

    def _allocate(self, n: int) -> int:
        """A device address of ``n`` fresh bytes of the heap (freed bytes are not reused)."""
        if not self._fits(n):
            raise MemoryError("emulated heap exhausted")
        off = self.top
        self.top = (off + n + 255) // 256 * 256
        return self.BASE + off

    def cuMemAlloc(self, n: int) -> tuple:
        if not self._fits(n):
            return self.CUresult.CUDA_ERROR_OUT_OF_MEMORY, 0
        ptr = self._allocate(n)
        self.live.add(ptr)
        self.sizes[ptr] = n
        return 0, ptr

    def cuMemFree(self, ptr: int) -> tuple:
        if ptr not in self.live:
            raise AssertionError(f"cuMemFree of {ptr:#x}, which is not a live allocation")
        self.live.remove(ptr)
        del self.sizes[ptr]
        return (0,)

    def cuMemGetInfo(self) -> tuple:
        """(free, total): the heap past its top, which a bump allocator can still give."""
        return 0, self.heap.size - self.top, self.heap.size

    def cuMemcpyHtoDAsync(self, dst: int, src: int, n: int, stream: Any) -> tuple:
        host = (ctypes.c_uint8 * n).from_address(src)
        self.view(dst, np.uint8, n)[:] = np.frombuffer(host, dtype=np.uint8)
        return (0,)

    def cuMemcpyDtoHAsync(self, dst: int, src: int, n: int, stream: Any) -> tuple:
        ctypes.memmove(dst, self.view(src, np.uint8, n).ctypes.data, n)
        return (0,)

    def cuMemcpyDtoH(self, dst: int, src: int, n: int) -> tuple:
        return self.cuMemcpyDtoHAsync(dst, src, n, None)

    def cuMemcpyHtoD(self, dst: int, src: int, n: int) -> tuple:
        return self.cuMemcpyHtoDAsync(dst, src, n, None)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, n: int, stream: Any) -> tuple:
        self.view(dst, np.uint8, n)[:] = self.view(src, np.uint8, n)
        return (0,)

    def cuMemHostAlloc(self, n: int, flags: int) -> tuple:
        """Mapped host memory: a slice of the heap whose host address is the heap's own storage."""
        host = self.heap.ctypes.data + (self._allocate(n) - self.BASE)
        self.live_host.add(host)
        return 0, host

    def cuMemHostGetDevicePointer(self, host: int, flags: int) -> tuple:
        return 0, self.BASE + (host - self.heap.ctypes.data)

    def cuMemFreeHost(self, host: int) -> tuple:
        if host not in self.live_host:
            raise AssertionError(f"cuMemFreeHost of {host:#x}, which is not a live host allocation")
        self.live_host.remove(host)
        return (0,)

    def cuModuleGetGlobal(self, mod: Any, name: bytes) -> tuple:
        if name != b"tt_trie_const":
            return 500, None, 0
        if not hasattr(self, "const_ptr"):
            self.const_ptr = self._allocate(65536)  # the module's own memory, not the program's to free
        return 0, self.const_ptr, 65536

    def cuStreamQuery(self, stream: Any) -> tuple:
        return (0,)

    def cuMemsetD32Async(self, dst: int, word: int, count: int, stream: Any) -> tuple:
        self.view(dst, np.uint32, count)[:] = word
        return (0,)

    # -- context, module, stream ----------------------------------------------------------------------
    def cuInit(self, flags: int) -> tuple:
        return (0,)

    def cuDeviceGet(self, i: int) -> tuple:
        return 0, i

    def cuCtxGetDevice(self) -> tuple:
        return 0, 0

    def cuDeviceGetCount(self) -> tuple:
        return 0, 1

    def cuDeviceGetName(self, n: int, dev: int) -> tuple:
        return 0, b"Emulated H200\0"

    def cuDeviceGetAttribute(self, attr: int, dev: int) -> tuple:
        return 0, {75: 9, 16: self.sm_count, 81: 228 * 1024}.get(attr, 0)  # compute capability 9.x, an H200's SMs

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple:
        return 0, "ctx"

    def cuCtxSynchronize(self) -> tuple:
        return (0,)

    def cuCtxSetCurrent(self, ctx: Any) -> tuple:
        return (0,)

    def cuModuleLoadData(self, image: bytes) -> tuple:
        return 0, "module"

    def cuModuleGetFunction(self, mod: Any, name: bytes) -> tuple:
        if name.decode() not in self.sigs:
            return 500, None
        return 0, name.decode()

    def cuFuncSetAttribute(self, f: Any, attr: Any, value: int) -> tuple:
        return (0,)

    def cuStreamCreate(self, flags: int) -> tuple:
        return 0, "stream"

    def cuStreamDestroy(self, stream: Any) -> tuple:
        return (0,)

    def cuStreamSynchronize(self, stream: Any) -> tuple:
        return (0,)

    def cuGetErrorName(self, err: int) -> tuple:
        return 0, f"EMULATED_ERROR_{err}".encode()

    def cuGetErrorString(self, err: int) -> tuple:
        return 0, b"emulated failure"

    # -- launches -------------------------------------------------------------------------------------
    def cuLaunchKernel(
        self,
        f: str,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shared: int,
        stream: Any,
        params: int,
        extra: int,
    ) -> tuple:
        sig = self.sigs[f]
        slots = (ctypes.c_void_p * len(sig)).from_address(params)
        ctype = {"ptr": ctypes.c_uint64, "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "f32": ctypes.c_float}
        args = {name: ctype[kind].from_address(slots[i]).value for i, (name, kind) in enumerate(sig)}
        if self.capturing is not None:  # a graph keeps the arguments as they were at capture
            self.graphs[self.capturing].append((f, args, (gx, gy, gz), (bx, by, bz), shared))
            return (0,)
        self._run(f, args, (gx, gy, gz), (bx, by, bz), shared)
        return (0,)

    # Programmatic dependent launches: the emulator runs kernels one after another, which is what the kernels'
    # own waits make of them on the GPU, so the attribute is checked and otherwise ignored.
    # Cooperative launches (every block resident at once) are likewise checked: only the persistent decode kernel,
    # whose grid barriers need them, asks for them.
    CUlaunchAttributeID = SimpleNamespace(
        CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=6, CU_LAUNCH_ATTRIBUTE_COOPERATIVE=2
    )

    class CUlaunchAttribute:
        def __init__(self) -> None:
            self.id = None
            self.value = SimpleNamespace(programmaticStreamSerializationAllowed=0, cooperative=0)

    class CUlaunchConfig:
        pass

    def cuOccupancyMaxActiveClusters(self, f: str, config: Any) -> tuple:
        return (_Ok.CUDA_SUCCESS, self.sm_count // 4)  # clusters of 4 blocks, one an SM

    def cuLaunchKernelEx(self, config: Any, f: str, params: int, extra: int) -> tuple:
        attrs = {a.id: a.value for a in config.attrs}
        assert config.numAttrs == len(config.attrs) == len(attrs) >= 1
        assert set(attrs) <= {2, 6}, f"unexpected launch attributes {sorted(attrs)}"
        if 6 in attrs:
            assert attrs[6].programmaticStreamSerializationAllowed == 1
            self.programmatic_launches += 1
        if 2 in attrs:
            assert attrs[2].cooperative == 1
            assert f == "decode_persistent", f"{f} has no grid barrier and asks for no cooperative launch"
            self.cooperative_launches += 1
        grid, block = (
            (config.gridDimX, config.gridDimY, config.gridDimZ),
            (config.blockDimX, config.blockDimY, config.blockDimZ),
        )
        return self.cuLaunchKernel(f, *grid, *block, config.sharedMemBytes, config.hStream, params, extra)

    def _run(self, f: str, args: dict, grid: tuple, block: tuple, shared: int) -> None:
        self.launches.append(f)
        a = SimpleNamespace(**args)
        compiled = re.fullmatch(r"(attention_decode\w*|attention_prefill)_hd(\d+)", f)
        if compiled:  # a form compiled for one head_dim: the generic kernel's values, for that head_dim only
            if not hasattr(a, "head_dim"):  # attention_prefill_hd*: the head_dim is the compiled one alone
                a.head_dim = int(compiled[2])
            assert a.head_dim == int(compiled[2]), f"{f} launched for head_dim {a.head_dim}"
            f = compiled[1]
        getattr(self, "k_" + f)(a, grid, block, shared)

    # -- graphs: a list of launches per graph; a WHILE node runs its body while its handle's value is set ----
    CU_GRAPH_COND_ASSIGN_DEFAULT = 1
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)
    CUgraphNodeType = SimpleNamespace(CU_GRAPH_NODE_TYPE_CONDITIONAL=11)
    CUgraphConditionalNodeType = SimpleNamespace(CU_GRAPH_COND_TYPE_IF=0, CU_GRAPH_COND_TYPE_WHILE=1)
    CUstreamUpdateCaptureDependencies_flags = SimpleNamespace(CU_STREAM_SET_CAPTURE_DEPENDENCIES=1)
    capturing: int | None = None

    class CUgraphNodeParams:
        def __init__(self) -> None:
            self.type = None
            self.conditional = SimpleNamespace(handle=None, type=None, size=0, ctx=None, phGraph_out=[])

    def _new_graph(self) -> int:
        if not hasattr(self, "graphs"):
            self.graphs: dict[int, list] = {}
            self.cond_values: dict[int, int] = {}
        gid = len(self.graphs) + 1
        self.graphs[gid] = []
        return gid

    def cuGraphCreate(self, flags: int) -> tuple:
        return 0, self._new_graph()

    def cuGraphConditionalHandleCreate(self, graph: int, ctx: Any, default: int, flags: int) -> tuple:
        handle = 1000 + len(self.cond_values)
        self.cond_values[handle] = default
        self.graphs[graph].append(("default", handle, default))
        return 0, handle

    def cuStreamBeginCaptureToGraph(self, stream: Any, graph: int, deps: Any, data: Any, n: int, mode: Any) -> tuple:
        assert self.capturing is None, "nested capture"
        self.capturing = graph
        return (0,)

    def cuStreamGetCaptureInfo(self, stream: Any) -> tuple:
        return 0, 1, 1, self.capturing, [], [], 0

    def cuGraphAddNode(self, graph: int, deps: Any, data: Any, n: int, params: Any) -> tuple:
        c = params.conditional
        assert (c.type, c.size) in ((1, 1), (0, 1), (0, 2)), "WHILE nodes with one body, IF nodes with one or two"
        bodies = [self._new_graph() for _ in range(c.size)]
        c.phGraph_out = bodies
        self.graphs[graph].append(("while" if c.type == 1 else "if", c.handle, bodies))
        return 0, ("node", bodies[0])

    def cuStreamUpdateCaptureDependencies(self, stream: Any, nodes: Any, data: Any, n: int, flags: Any) -> tuple:
        return (0,)

    def cuStreamEndCapture(self, stream: Any) -> tuple:
        graph, self.capturing = self.capturing, None
        return 0, graph

    def cuGraphInstantiate(self, graph: int, flags: int) -> tuple:
        return 0, graph

    def cuGraphLaunch(self, graph: int, stream: Any) -> tuple:
        self._replay(graph)
        return (0,)

    def _replay(self, graph: int) -> None:
        for item in self.graphs[graph]:
            if item[0] == "default":
                self.cond_values[item[1]] = item[2]
            elif item[0] == "while":
                while self.cond_values[item[1]]:
                    self._replay(item[2][0])
            elif item[0] == "if":
                if self.cond_values[item[1]]:
                    self._replay(item[2][0])
                elif len(item[2]) > 1:
                    self._replay(item[2][1])
            else:
                f, args, grid, block, shared = item
                self._run(f, dict(args), grid, block, shared)

    def cuGraphExecDestroy(self, graph: int) -> tuple:
        return (0,)

    def cuGraphDestroy(self, graph: int) -> tuple:
        return (0,)

    def _kv_store(self, ptr: int, row0: int, rows: np.ndarray) -> None:
        """rows ([n, kv heads, head_dim] floats) into a KV cache from row0 on, rounded to bf16 as the kernels store
        them (cuda/kv_cache.cuh)."""
        bits = float32_to_bf16_bits(np.asarray(rows, dtype=np.float32))
        self.view(ptr + 2 * row0 * bits[0].size, np.uint16, bits.size)[:] = bits.ravel()

    def _kv_values(self, ptr: int, rows: int, kv: int, hd: int) -> np.ndarray:
        """A KV cache's first ``rows`` rows as the kernels read them (bf16 widened to fp32, exactly)."""
        return bf16_bits_to_float32(self.view(ptr, np.uint16, rows * kv * hd)).reshape(rows, kv, hd)

    def _bf16(self, ptr: int, count: int) -> np.ndarray:
        return (self.view(ptr, np.uint16, count).astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    def _pos(self, a: SimpleNamespace) -> int:
        return int(self.view(a.pos_ptr, np.int32, 1)[0]) if a.pos_ptr else a.pos_host

    def k_embed_gather(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        n = grid[0]
        tokens = self.view(a.tokens, np.int32, n) if a.tokens else np.array([a.token_host])
        table = self._bf16(a.table, a.vocab * a.hidden).reshape(a.vocab, a.hidden)
        self.view(a.out, np.float32, n * a.hidden)[:] = ref.embed(table, tokens).ravel()

    def k_rmsnorm(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        rows = grid[0]
        x = self.view(a.x, np.float32, rows * a.n).reshape(rows, a.n)
        y = ref.rmsnorm(x, self._bf16(a.w, a.n), a.eps)
        self.view(a.out, np.float32, rows * a.n)[:] = y.ravel()

    def _linear(self, a: SimpleNamespace, m: int, x: np.ndarray, out: int, w: np.ndarray | None = None) -> None:
        w = self._bf16(a.W, a.N * a.K).reshape(a.N, a.K) if w is None else w
        bias = self._bf16(a.bias, a.N) if a.bias else None
        res = self.view(a.residual, np.float32, m * a.N).reshape(m, a.N).copy() if a.residual else None
        self.view(out, np.float32, m * a.N)[:] = ref.linear(x, w, bias, res).ravel()

    def k_gemv_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        m, x = self._gemv_input(a, grid, shared, -(-a.N // (8 // a.warps_per_row)))
        self._linear(a, m, x, a.y)

    def k_gemv_swiglu_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert a.N % 2 == 0, "the SwiGLU output needs gate|up rows, an even count"
        m, x = self._gemv_input(a, grid, shared, -(-(a.N // 2) // (8 // a.warps_per_row)))
        self._swiglu_linear(a, m, x)

    def k_gemv_stream_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        m, x = self._gemv_stream_input(a, grid, block, shared, a.N)
        self._linear(a, m, x, a.y)

    def k_gemv_stream_swiglu_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert a.N % 2 == 0, "the SwiGLU output needs gate|up rows, an even count"
        m, x = self._gemv_stream_input(a, grid, block, shared, a.N // 2)
        self._swiglu_linear(a, m, x)

    def _chain_rows(
        self, a: SimpleNamespace, block: tuple, shared: int, out_width: int, warps: int
    ) -> list[SimpleNamespace]:
        """A chain-form streaming GEMV's tokens, each as a single-token launch's arguments (rows t of x, residual
        and y), so that every token is emulated exactly as a step of its own."""
        count = int(self.view(a.count, np.int32, 1)[0])
        assert 2 <= count <= 4, f"a chain of {count} tokens; the kernel takes 2 to 4"
        assert block == (32 * warps, 1, 1), f"a chain GEMV block of this kernel is {warps} warps"
        assert shared >= a.stages * warps * 4096 + 4 * 4 * a.K, "the ring and four input rows"
        if warps == 16 and a.x_mode == 1:
            assert a.K <= 4096, "the 16-warp chain GEMV normalises rows of at most 4,096 values"
        rows = []
        for t in range(count):
            r = SimpleNamespace(**vars(a))
            r.x = a.x + 4 * t * a.K
            r.y = a.y + 4 * t * out_width
            if getattr(a, "residual", 0):
                r.residual = a.residual + 4 * t * a.N
            r.warps = warps
            rows.append(r)
        return rows

    def k_gemv_stream_chain_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        for r in self._chain_rows(a, block, shared, a.N, 8):
            self.k_gemv_stream_bf16(r, grid, block, shared)

    def k_gemv_stream_chain_swiglu_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        for r in self._chain_rows(a, block, shared, a.N // 2, 8):
            self.k_gemv_stream_swiglu_bf16(r, grid, block, shared)

    def k_gemv_stream_chain16_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        for r in self._chain_rows(a, block, shared, a.N, 16):
            self.k_gemv_stream_bf16(r, grid, block, shared)

    def k_gemv_stream_chain16_swiglu_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        for r in self._chain_rows(a, block, shared, a.N // 2, 16):
            self.k_gemv_stream_swiglu_bf16(r, grid, block, shared)

    def k_gemv_stream_fp8(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        m, x = self._gemv_stream_input(a, grid, block, shared, a.N, weight_bytes=1)
        self._linear(a, m, x, a.y, self._e4m3_rows(a))

    def k_gemv_stream_swiglu_fp8(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert a.N % 2 == 0, "the SwiGLU output needs gate|up rows, an even count"
        m, x = self._gemv_stream_input(a, grid, block, shared, a.N // 2, weight_bytes=1)
        self._swiglu_linear(a, m, x, self._e4m3_rows(a))

    def _e4m3_rows(self, a: SimpleNamespace) -> np.ndarray:
        """The e4m3 bytes at a.W decoded (sign, exponent bias 7, 3 mantissa bits) times each row's scale."""
        assert a.K % 16 == 0, "FP8 rows are copied in 16-byte pieces"
        codes = self.view(a.W, np.uint8, a.N * a.K).reshape(a.N, a.K).astype(np.int64)
        exponent, mantissa = (codes >> 3) & 15, codes & 7
        assert not np.any((exponent == 15) & (mantissa == 7)), "e4m3 NaN in the weights"
        magnitude = np.where(exponent == 0, mantissa / 8.0 * 2.0**-6, (1 + mantissa / 8.0) * 2.0 ** (exponent - 7))
        scales = self.view(a.scale, np.float32, a.N).astype(np.float64)
        assert np.all(np.frexp(scales)[0] == 0.5), "FP8 row scales are powers of two"
        return np.where(codes >> 7, -magnitude, magnitude) * scales[:, None]

    def _swiglu_linear(self, a: SimpleNamespace, m: int, x: np.ndarray, w: np.ndarray | None = None) -> None:
        """y = silu(gate) * up of the fused gate|up rows (the SwiGLU-output GEMVs); ``w``: the rows, when not bf16
        at a.W."""
        w = self._bf16(a.W, a.N * a.K).reshape(a.N, a.K) if w is None else w
        bias = self._bf16(a.bias, a.N) if a.bias else None
        self.view(a.y, np.float32, m * a.N // 2)[:] = ref.swiglu(ref.linear(x, w, bias, None)).ravel()

    def _gemv_stream_input(
        self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int, out_rows: int, weight_bytes: int = 2
    ) -> tuple[int, np.ndarray]:
        """Check a streaming GEMV launch (cuda/gemv_stream.cuh; a chain form's token carries its block's warps);
        return its token count and input rows."""
        warps = getattr(a, "warps", 8)
        assert block == (32 * warps, 1, 1), f"a streaming GEMV block of this kernel is {warps} warps"
        assert 1 <= a.stages <= 6, f"{a.stages} ring stages; the kernel has barriers for 1 to 6"
        slot = 4096 if weight_bytes == 2 else min(4096, a.K * weight_bytes)  # gstream_slot_bytes
        assert shared >= a.stages * warps * slot + 4 * a.K, "the ring and the input row need more shared memory"
        a.warps_per_row = 1
        return self._gemv_input(a, grid, shared, -(-out_rows // warps))

    def _gemv_input(self, a: SimpleNamespace, grid: tuple, shared: int, groups: int) -> tuple[int, np.ndarray]:
        """Check a GEMV launch; return its token count and transformed input rows."""
        assert a.warps_per_row == 1 or (a.warps_per_row in (2, 4, 8) and 256 * a.warps_per_row <= a.K), "bad split"
        assert 1 <= grid[0] <= groups, "GEMV grid must have between 1 and one block per row group"
        assert shared >= 4 * a.K, "GEMV needs K floats of dynamic shared memory for its input row"
        m = grid[1]
        x = self.view(a.x, np.float32, m * a.K).reshape(m, a.K).astype(np.float64)
        if a.x_mode == 1:
            return m, ref.rmsnorm(x, self._bf16(a.norm_w, a.K), a.eps)
        assert a.x_mode == 0, f"unknown GEMV input mode {a.x_mode}"
        return m, x

    def k_gemm_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert grid[0] * 64 >= a.N and grid[1] * 64 >= a.M, "GEMM grid does not cover the output"
        self._linear(a, a.M, self.view(a.A, np.float32, a.M * a.K).reshape(a.M, a.K), a.C)

    def _gemm_mma(
        self,
        a: SimpleNamespace,
        grid: tuple,
        block: tuple,
        tokens: int,
        shared: int,
        need: int,
        rows: int = 64,
        wide: bool = False,
    ) -> None:
        """A tensor-core prefill GEMM launch (cuda/gemm.cuh): ``tokens`` a block, row groups of ``rows``, ``need``
        bytes of shared memory for the staged rows and the K-quarter partials."""
        assert block == (512 if wide else 256, 1, 1), "a tensor-core GEMM block is eight warps (sixteen: the w forms)"
        assert a.K % 32 == 0, "the tensor-core GEMM walks K in steps of 32"
        assert grid[0] * tokens >= a.M, "tensor-core GEMM token groups do not cover the tokens"
        assert 1 <= grid[1] <= -(-a.N // rows), "tensor-core GEMM needs between 1 and one block per row group"
        assert shared >= need, "the staged tokens' rows and the K-quarter partials need more room"
        self._linear(a, a.M, self.view(a.A, np.float32, a.M * a.K).reshape(a.M, a.K), a.C)

    def k_gemm_mma16_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 16, shared, gemm_mma_shared(16, a.K))

    def k_gemm_mma8_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 8, shared, gemm_mma_shared(8, a.K))

    def k_gemm_mma16h_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 16, shared, gemm_mma_halves_shared(a.K))

    def k_gemm_mma16w_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 16, shared, gemm_mma_shared(16, a.K), wide=True)

    def k_gemm_mma8w_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 8, shared, gemm_mma_shared(8, a.K), wide=True)

    def k_gemm_mma16r32_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 16, shared, gemm_mma_shared(16, a.K, 32), 32)

    def k_gemm_mma8r32_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 8, shared, gemm_mma_shared(8, a.K, 32), 32)

    def k_gemm_mma16r128_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 16, shared, gemm_mma_shared(16, a.K, 128), 128)

    def k_gemm_mma8r128_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma(a, grid, block, 8, shared, gemm_mma_shared(8, a.K, 128), 128)

    def _gemm_mma_cluster(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int, tiles: int) -> None:
        """The cluster prefill GEMM (cuda/gemm_cluster.cuh): 16 * ``tiles`` tokens a cluster of four blocks."""
        assert block == (256, 1, 1), "a cluster GEMM block is eight warps"
        assert a.K % 32 == 0, "the cluster GEMM walks K in steps of 32"
        assert grid[1] % 4 == 0, f"{grid[1]} blocks are not whole clusters of 4"
        assert grid[0] * 16 * tiles >= a.M, "cluster GEMM token groups do not cover the tokens"
        assert 2 <= a.depth <= 8, f"ring depth {a.depth}: the kernel waits for 2 to 8"
        need = cluster_shared(tiles, a.K, a.depth)
        assert shared >= need, "the staged quarter, the partials and the ring need more room"
        self._linear(a, a.M, self.view(a.A, np.float32, a.M * a.K).reshape(a.M, a.K), a.C)

    def k_gemm_mma_cluster1_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma_cluster(a, grid, block, shared, 1)

    def k_gemm_mma_cluster2_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma_cluster(a, grid, block, shared, 2)

    def k_gemm_mma_cluster3_bf16(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self._gemm_mma_cluster(a, grid, block, shared, 3)

    def k_rope_table(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert block[0] >= a.head_dim // 2, "rope_table takes a thread per frequency"
        table = ref.rope_table(grid[0], a.head_dim, a.theta)
        self.view(a.table, np.float32, table.size)[:] = table.ravel()

    def _rope_rows(self, a: SimpleNamespace, positions: int) -> np.ndarray:
        """The first ``positions`` rows of the launch's rope table (cuda/rope.cuh)."""
        return self.view(a.rope, np.float32, positions * a.head_dim).reshape(positions, a.head_dim)

    def k_qk_norm_rope_cache(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        t, hd, h, kv = grid[0], a.head_dim, a.n_heads, a.n_kv_heads
        assert grid[1] == h + kv and block[0] == max(32, hd)
        width = (h + 2 * kv) * hd
        qkv = self.view(a.qkv, np.float32, t * width).reshape(t, width)
        pos0 = self._pos(a)
        qn = self._bf16(a.q_norm, hd) if a.q_norm else None
        kn = self._bf16(a.k_norm, hd) if a.k_norm else None
        q, k, v = ref.qk_norm_rope(qkv, qn, kn, pos0, h, kv, hd, self._rope_rows(a, pos0 + t), a.eps)
        qkv[:, : h * hd] = q.reshape(t, h * hd)
        self._kv_store(a.k_cache, pos0, k)
        self._kv_store(a.v_cache, pos0, v)

    def k_attention(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        h, t, hd, kv = a.n_heads, grid[1], a.head_dim, a.n_kv_heads
        assert grid[0] == h
        pos0 = self._pos(a)
        assert shared >= 4 * (pos0 + t), "attention's shared memory cannot hold every score"
        assert abs(a.scale - hd**-0.5) < 1e-6
        width = (h + 2 * kv) * hd
        q = self.view(a.qkv, np.float32, t * width).reshape(t, width)[:, : h * hd].reshape(t, h, hd)
        kc, vc = self._kv_values(a.k_cache, pos0 + t, kv, hd), self._kv_values(a.v_cache, pos0 + t, kv, hd)
        self.view(a.out, np.float32, t * h * hd)[:] = ref.attention(q.astype(np.float64), kc, vc, pos0).ravel()

    def k_attention_prefill(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        """attention_prefill_hd*: `attention`'s values (the GPU test holds it within 1e-4 of float64), with the grid
        and tile it needs: a block per kv head and tokens_per_block tokens, their queries within one block."""
        group = a.n_heads // a.n_kv_heads
        assert grid == (a.n_kv_heads, -(-a.n_tokens // a.tokens_per_block), 1) and block[0] == 256
        assert a.tokens_per_block * group <= ATTN_PREFILL_QUERIES
        assert shared >= prefill_attention_shared(a.head_dim), "its K and V tiles do not fit the shared memory"
        self.k_attention(a, (a.n_heads, a.n_tokens, 1), block, 4 * (self._pos(a) + a.n_tokens))

    def k_attention_decode(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert grid[0] == a.n_heads and block[0] == 256
        assert abs(a.scale - a.head_dim**-0.5) < 1e-6
        self._decode_attention(a, self._pos(a), a.k_cache, a.v_cache, a.q_norm, a.k_norm, a.out)

    def k_attention_chain_rows(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        hd, h, kv = a.head_dim, a.n_heads, a.n_kv_heads
        assert grid[0] == 4 and grid[1] == kv and block[0] == max(32, hd)
        count, pos0 = int(self.view(a.count, np.int32, 1)[0]), self._pos(a)
        width = (h + 2 * kv) * hd
        qkv = self.view(a.qkv, np.float32, count * width).reshape(count, width)
        kn = self._bf16(a.k_norm, hd) if a.k_norm else None
        _, k, v = ref.qk_norm_rope(qkv, kn, kn, pos0, h, kv, hd, self._rope_rows(a, pos0 + count), a.eps)
        self._kv_store(a.k_cache, pos0, k)
        self._kv_store(a.v_cache, pos0, v)

    def k_attention_decode_chain(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        """Token t of the chain as attention_decode at its position, with its own records and counters."""
        assert grid[0] == a.n_heads and grid[2] == 4 and block[0] == 256
        hd, h, kv = a.head_dim, a.n_heads, a.n_kv_heads
        count, pos0 = int(self.view(a.count, np.int32, 1)[0]), self._pos(a)
        for t in range(count):
            r = SimpleNamespace(**vars(a))
            r.qkv = a.qkv + 4 * t * (h + 2 * kv) * hd
            r.partial = a.partial + 4 * t * h * a.max_chunks * (hd + 2)
            r.done = a.done + 4 * t * h
            self._decode_attention(r, pos0 + t, a.k_cache, a.v_cache, a.q_norm, a.k_norm, a.out + 4 * t * h * hd)

    def k_attention_decode_chain_cluster(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert grid[1] % ATTN_CLUSTER == 0, f"{grid[1]} blocks a head are not whole clusters of {ATTN_CLUSTER}"
        self.k_attention_decode_chain(a, grid, block, shared)

    def k_rmsnorm_last(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert grid == (1, 1, 1)
        last = int(self.view(a.count, np.int32, 1)[0]) - 1
        x = self.view(a.x + 4 * last * a.n, np.float32, a.n).reshape(1, a.n)
        self.view(a.out, np.float32, a.n)[:] = ref.rmsnorm(x, self._bf16(a.w, a.n), a.eps).ravel()

    def k_attention_decode_short(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        """attention_decode's arithmetic, within ATTN_MERGE_SPLIT chunks (the kernel traps past them)."""
        assert self._pos(a) < SHORT_ATTENTION_POSITIONS, f"position {self._pos(a)} is past the short form's contexts"
        self.k_attention_decode(a, grid, block, shared)

    def k_attention_decode_cluster(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        """attention_decode's arithmetic; its compile-time clusters need a grid of whole clusters a head."""
        assert grid[1] % ATTN_CLUSTER == 0, f"{grid[1]} blocks a head are not whole clusters of {ATTN_CLUSTER}"
        self.k_attention_decode(a, grid, block, shared)

    def _decode_attention(
        self, a: SimpleNamespace, pos: int, k_cache: int, v_cache: int, q_norm: int, k_norm: int, out: int
    ) -> None:
        """The new token's q/k norm and rotary embedding, its cache row, and its attention over the cache; ``a``
        names the buffers and shapes (attention_decode's arguments, or the persistent kernel's plan)."""
        h, hd, kv = a.n_heads, a.head_dim, a.n_kv_heads
        assert 256 % hd == 0, "the attention block's 256 threads take whole heads"
        assert -(-(pos + 1) // ATTN_CHUNK) <= a.max_chunks, "more chunks than the partial buffer holds"
        assert not self.view(a.done, np.int32, h).any(), "merge counters must start at zero"
        self.view(a.partial, np.float32, h * a.max_chunks * (hd + 2))  # the split records fit the buffer
        qkv = self.view(a.qkv, np.float32, (h + 2 * kv) * hd).reshape(1, -1)
        qn = self._bf16(q_norm, hd) if q_norm else None
        kn = self._bf16(k_norm, hd) if k_norm else None
        q, k, v = ref.qk_norm_rope(qkv, qn, kn, pos, h, kv, hd, self._rope_rows(a, pos + 1), a.eps)
        self._kv_store(k_cache, pos, k)
        self._kv_store(v_cache, pos, v)
        kc, vc = self._kv_values(k_cache, pos + 1, kv, hd), self._kv_values(v_cache, pos + 1, kv, hd)
        self.view(out, np.float32, h * hd)[:] = ref.attention(q, kc, vc, pos).ravel()

    def k_decode_persistent(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        """Every layer of a decode step, phase by phase as the layered launches compute them (the same numpy
        references, each phase's output stored as fp32), from the plan the host packed."""
        size = struct.calcsize(PLAN_FORMAT)
        values = struct.unpack(PLAN_FORMAT, self.view(a.plan, np.uint8, size).tobytes())
        p = SimpleNamespace(**dict(zip((name for name, _ in PLAN_FIELDS), values, strict=True)))
        assert grid == (self.sm_count, 1, 1) and block == (288, 1, 1), "one block per SM: 8 consumer warps, a producer"
        assert 2 <= p.stages <= 12, f"{p.stages} ring stages; the kernel has barriers for 1 to 12"
        assert 1 <= p.in_flight <= 12, "the producer's cap"
        assert 2 * p.hidden <= 8192, "a ring slot of 16 KB holds a gate and an up row"
        staging = max(p.hidden, p.q_width, p.intermediate, 2 * p.max_chunks)
        assert shared >= p.stages * 16384 + 4 * staging, "the ring and the staging area need more shared memory"
        finished, epoch = self.view(p.finished, np.uint32, 1), self.view(p.epoch, np.uint32, 1)
        assert finished[0] == 0 and epoch[0] >= 1, "the count of finished blocks starts at zero, the epoch at one"
        words = p.hidden + 2 * p.q_width + 2 * p.kv_width + p.intermediate
        assert not self.view(p.words, np.uint64, words).any() or epoch[0] > 1, "the tagged words start at zero"
        # The kernel hands activations over as tagged words; emulated, they are fp32 scratch rows of its own.
        p.qkv, p.attn, p.act = self._scratch(p.q_width + 2 * p.kv_width, p.q_width, p.intermediate)
        assert abs(p.scale - p.head_dim**-0.5) < 1e-6
        pos, d = self._pos(a), p.hidden
        layer_size = struct.calcsize(LAYER_FORMAT)
        for i in range(p.n_layers):
            raw = self.view(p.layers + i * layer_size, np.uint8, layer_size).tobytes()
            names = (name for name, _ in LAYER_FIELDS)
            lw = SimpleNamespace(**dict(zip(names, struct.unpack(LAYER_FORMAT, raw), strict=True)))
            qkv_rows = p.q_width + 2 * p.kv_width
            x = self.view(p.x, np.float32, d).reshape(1, d).astype(np.float64)
            xn = ref.rmsnorm(x, self._bf16(lw.input_norm, d), p.eps)
            self._gemv_rows(lw.qkv, qkv_rows, d, xn, lw.qkv_bias, 0, p.qkv)
            self._decode_attention(p, pos, lw.k_cache, lw.v_cache, lw.q_norm, lw.k_norm, p.attn)
            attn = self.view(p.attn, np.float32, p.q_width).reshape(1, -1)
            self._gemv_rows(lw.o, d, p.q_width, attn, 0, p.x, p.x)
            x = self.view(p.x, np.float32, d).reshape(1, d).astype(np.float64)
            xn = ref.rmsnorm(x, self._bf16(lw.post_norm, d), p.eps)
            w = self._bf16(lw.gate_up, 2 * p.intermediate * d).reshape(2 * p.intermediate, d)
            self.view(p.act, np.float32, p.intermediate)[:] = ref.swiglu(ref.linear(xn, w, None, None)).ravel()
            act = self.view(p.act, np.float32, p.intermediate).reshape(1, -1)
            self._gemv_rows(lw.down, d, p.intermediate, act, 0, p.x, p.x)
        epoch[0] += 1  # as the kernel's last block leaves it

    def _scratch(self, *floats: int) -> list[int]:
        """Device addresses of fp32 rows of the given lengths, kept from call to call (an emulated kernel's own
        working memory, never freed by the host)."""
        key = tuple(floats)
        if key not in self.scratch:
            self.scratch[key] = [self._allocate(4 * n) for n in floats]
        return self.scratch[key]

    def _gemv_rows(self, W: int, N: int, K: int, x: np.ndarray, bias: int, residual: int, y: int) -> None:
        """y = x @ W.T (+ bias) (+ residual) for one token, stored as fp32 (residual may alias y)."""
        a = SimpleNamespace(W=W, N=N, K=K, bias=bias, residual=residual)
        self._linear(a, 1, x, y)

    def k_swiglu(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        gu = self.view(a.gate_up, np.float32, a.n_tokens * 2 * a.inter).reshape(a.n_tokens, 2 * a.inter)
        self.view(a.out, np.float32, a.n_tokens * a.inter)[:] = ref.swiglu(gu).ravel()

    def k_residual_add(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        s = self.view(a.a, np.float32, a.n).astype(np.float64) + self.view(a.b, np.float32, a.n)
        self.view(a.out, np.float32, a.n)[:] = s

    def k_argmax(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        self.view(a.out_token, np.int32, 1)[0] = ref.argmax(self.view(a.logits, np.float32, a.n))

    # -- the grammar step (cuda/trie_step.cuh), decision for decision -----------------------------------
    def _ctl(self, ptr: int) -> np.ndarray:
        return self.view(ptr, np.int32, 64)

    def _trie(self, ctl: np.ndarray) -> tuple[np.ndarray, int, int, int]:
        """(image words, n_nodes, offset of node_terminal, offset of the edges)."""
        g = int(ctl[14:16].view(np.uint64)[0])
        ptr = g or self.const_ptr
        head = self.view(ptr, np.int32, 8)
        n_nodes, n_edges = int(head[2]), int(head[3])
        term = 8 + (n_nodes + 3 + 3) // 4 * 4
        edges = term + (n_nodes + 2 + 3) // 4 * 4
        return self.view(ptr, np.int32, edges + 4 * n_edges), n_nodes, term, edges

    def _live(self, ctl: np.ndarray, w: np.ndarray, n_nodes: int, term: int, edges: int, node: int, e: int) -> bool:
        _, child, lo, hi = (int(v) for v in w[edges + 4 * e : edges + 4 * e + 4])
        spent = ctl[32 : 32 + ctl[4]].tolist()
        n_allowed = int(ctl[8])
        allowed = self.view(int(ctl[16:18].view(np.uint64)[0]), np.int32, n_allowed) if n_allowed > 0 else []
        if child < n_nodes:
            avail = hi - lo if n_allowed < 0 else int(np.sum((np.asarray(allowed) >= lo) & (np.asarray(allowed) < hi)))
            return avail > sum(lo <= p < hi for p in spent)
        p = int(w[term + node])
        if p < 0 or p in spent or (n_allowed >= 0 and p not in list(allowed)):
            return False
        return int(ctl[3]) > 1 if child == n_nodes else int(ctl[3]) == 1

    def k_trie_mask(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert grid == (1, 1, 1) and block[0] == 256
        self._mask(a, self._ctl(a.ctl))

    def _mask(self, a: SimpleNamespace, ctl: np.ndarray) -> None:
        """trie_mask_block: the live edges of ctl's node into cand."""
        if ctl[5] or ctl[6]:
            return
        w, n_nodes, term, edges = self._trie(ctl)
        node = int(ctl[2])
        cand = self.view(a.cand, np.int32, 2 * a.cand_cap)
        edge_range = range(int(w[8 + node]), int(w[8 + node + 1]))
        live = [e for e in edge_range if self._live(ctl, w, n_nodes, term, edges, node, e)]
        for j, e in enumerate(live[: a.cand_cap]):
            cand[j], cand[a.cand_cap + j] = w[edges + 4 * e], e
        ctl[9] = min(len(live), a.cand_cap)
        if not live:
            ctl[6], ctl[12] = 1, node

    def k_sparse_head(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert grid[0] == 256 and shared >= 4 * a.K
        ctl = self._ctl(a.ctl)
        if ctl[5] or ctl[6]:
            return
        n = int(ctl[9])
        rows = self.view(a.cand, np.int32, max(n, 1))[:n]
        if a.norm_w:  # the final norm of the forward pass's last row, ctl[NCHAIN] - 1
            row = max(int(ctl[20]), 1) - 1
            x = self.view(a.x + 4 * row * a.K, np.float32, a.K).reshape(1, a.K)
            x = ref.rmsnorm(x, self._bf16(a.norm_w, a.K), a.eps).ravel().astype(np.float32).astype(np.float64)
        else:
            x = self.view(a.x, np.float32, a.K).astype(np.float64)
        vocab = int(rows.max()) + 1 if n else 1
        bits = self.view(a.W, np.uint16, vocab * a.K).reshape(vocab, a.K)[rows[:256]]
        w = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        self.view(a.cand_logit, np.float32, 256)[: min(n, 256)] = (w @ x).astype(np.float32)

    def k_trie_step(self, a: SimpleNamespace, grid: tuple, block: tuple, shared: int) -> None:
        assert grid == (1, 1, 1) and block[0] == 256
        ctl = self._ctl(a.ctl)
        out = self.view(a.out, np.int32, 8 + 16 * 136)
        if not (ctl[5] or ctl[6]):
            self._step(a, ctl, out)
            self._mask(a, ctl)  # the next node's, before the loop predicate
        out[3], out[2], out[1] = ctl[7], ctl[6], int(bool(ctl[5] or ctl[6]))
        go = not (ctl[5] or ctl[6])
        if a.cond_loop:
            self.cond_values[a.cond_loop] = int(go)
        if a.cond_chain:
            self.cond_values[a.cond_chain] = int(go and ctl[20] > 1)

    def _step(self, a: SimpleNamespace, ctl: np.ndarray, out: np.ndarray) -> None:
        n = int(ctl[9])
        if not a.dense and n > 256:
            ctl[6], ctl[12] = 6, ctl[2]
            return
        cand = self.view(a.cand, np.int32, 2 * a.cand_cap)
        if a.dense:
            vals = self.view(a.logits, np.float32, int(cand[:n].max()) + 1)[cand[:n]]
        else:
            vals = self.view(a.logits, np.float32, n).copy()
        if n == 0 or not np.isfinite(vals).all():
            ctl[6], ctl[12] = 3, ctl[2]
            return
        win = int(np.argmax(vals))
        top = vals[win]
        z = np.sum(np.exp(vals - top), dtype=np.float32)
        logprob = np.float32(top - np.float32(top + np.log(z)))
        token, edge = int(cand[win]), int(cand[a.cand_cap + win])
        trie = self._trie(ctl)
        first_pos = int(ctl[1]) + 1
        ctl[20] = 1
        self._take(a, ctl, out, trie, edge, token, int(np.float32(top).view(np.int32)), logprob)
        if ctl[6] or ctl[5]:
            return
        tail = bool(ctl[18] & 1) and self._tail_is_forced(ctl, trie)
        if not tail and not ctl[18] & 2:
            return
        chain = [token]
        while not (ctl[5] or ctl[6]) and (tail or len(chain) < 4):  # no logits, log-prob 0
            edge = self._sole_live_edge(ctl, trie)
            if edge < 0 and not tail:
                break
            token = int(trie[0][trie[3] + 4 * edge]) if edge >= 0 else -1
            self._take(a, ctl, out, trie, edge, token, 0x7FC00000, np.float32(0.0))
            ctl[19] += 1
            if not tail:
                chain.append(token)
        if not tail and len(chain) > 1:
            ctl[20], ctl[21] = len(chain), first_pos
            ctl[24 : 24 + len(chain)] = chain

    def _sole_live_edge(self, ctl: np.ndarray, trie: tuple[np.ndarray, int, int, int]) -> int:
        w, node = trie[0], int(ctl[2])
        live = [e for e in range(int(w[8 + node]), int(w[9 + node])) if self._live(ctl, *trie, node, e)]
        return live[0] if len(live) == 1 else -1

    def _tail_is_forced(self, ctl: np.ndarray, trie: tuple[np.ndarray, int, int, int]) -> bool:
        w, n_nodes, term, edges = trie
        probe = ctl.copy()  # node, owed and spent walked on a copy
        for _ in range(int(ctl[13] - ctl[7])):
            edge = self._sole_live_edge(probe, trie)
            if edge < 0:
                return False
            child = int(w[edges + 4 * edge + 1])
            if child == n_nodes + 1:
                return True
            if child < n_nodes:
                probe[2] = child
            else:
                probe[32 + probe[4]], probe[4], probe[3], probe[2] = w[term + probe[2]], probe[4] + 1, probe[3] - 1, 0
        return False

    def _take(
        self,
        a: SimpleNamespace,
        ctl: np.ndarray,
        out: np.ndarray,
        trie: tuple[np.ndarray, int, int, int],
        edge: int,
        token: int,
        logit_bits: int,
        logprob: np.float32,
    ) -> None:
        w, n_nodes, term, edges = trie
        node, ns = int(ctl[2]), int(ctl[4])
        if not (
            w[8 + node] <= edge < w[8 + node + 1]
            and w[edges + 4 * edge] == token
            and self._live(ctl, w, n_nodes, term, edges, node, edge)
        ):
            ctl[6], ctl[12] = 2, node
            return
        child = int(w[edges + 4 * edge + 1])
        rec = out[8 + ns * 136 : 8 + (ns + 1) * 136]
        if child < n_nodes:
            rec[4 + ctl[10]] = token
            ctl[10] += 1
            ctl[11] = np.float32(ctl[11:12].view(np.float32)[0] + logprob).view(np.int32)
            ctl[2] = child
        else:
            rec[0], rec[1], rec[2], rec[3] = w[term + node], ctl[10], ctl[11], ctl[7]
            out[0] = ns + 1
            ctl[32 + ns], ctl[4], ctl[3] = w[term + node], ns + 1, ctl[3] - 1
            ctl[2] = ctl[10] = ctl[11] = 0
            if child == n_nodes + 1:
                ctl[5] = 1
        steps = int(ctl[7])
        if a.trace:
            self.view(a.trace, np.int32, 3 * (steps + 1))[3 * steps :] = [token, logit_bits, logprob.view(np.int32)]
        ctl[0], ctl[1], ctl[7] = token, ctl[1] + 1, steps + 1
        if steps + 1 >= ctl[13] and not ctl[5]:
            ctl[6] = 5
