"""The decode step as one persistent kernel (cuda/decode_persistent.cuh): which models it serves, its plan in device
memory, and its launch.

One block per SM runs every layer's phases, with no grid-wide barrier: each phase's outputs go from block to block
as tagged words, and a block starts a phase once its input is complete. One producer thread per block streams the
block's weight tiles for the whole step into a block-wide ring of 16 KB slots, holding at most ``in_flight`` copies in
flight, so the weights of the next phase arrive while the block's 8 consumer warps wait for an input or work on
attention. Its results are the layered launch list's bits (the same row sums, the same attention chunks and merge);
the GPU tests compare the two step for step. It is opt-in (``TOOLTRIE_DECODE_KERNEL=persistent``): on an H200 it
measured slower than the layered list (docs/cuda-speed-notes.md #108), as did its earlier forms with grid barriers
(#58-#62, #105, #107).
"""

from __future__ import annotations

import os
import struct

import numpy as np

from decoder_service.engines.cuda.driver import Stream, multiprocessor_count
from decoder_service.engines.cuda.memory import DeviceBuffer
from decoder_service.engines.cuda.module import MAX_SHARED_PER_BLOCK, Launch, Module
from decoder_service.engines.cuda.weights import ModelWeights
from decoder_service.engines.env import env_int
from decoder_service.models.config import ModelConfig

PDEC_THREADS = 288  # 8 consumer warps and the producer warp
SLOT_BYTES = 16_384  # PDEC_SLOT_BYTES: whole rows of one weight stream
SLOT_ELEMS = SLOT_BYTES // 2
MAX_STAGES = 12  # PDEC_MAX_STAGES: the ring barriers the kernel has
# Slot s is reduced by warp s % 8, so a ring of 8 slots gives every warp the same share of the tiles.
DEFAULT_STAGES = 8
MIN_STAGES = 2  # a shallower ring leaves nothing in flight while a tile is reduced
DEFAULT_IN_FLIGHT = 3  # copies in flight a block (docs/cuda-speed-notes.md #107)
DEFAULT_POLL_NS = 1000  # a poll's sleep after a miss: spinning polls slowed the stores they waited for (#107)
# The kernel's static shared memory (ptxas -v reports 8,192 bytes; a build test checks this bound).
PDEC_STATIC_SHARED = 8_704
# The decode attention merge (cuda/attention_decode.cuh): chunk values an output element's thread loads together,
# and the most chunks the serial merge takes (its table, then up to a batch of values a thread handed over).
ATTN_MERGE_BATCH = 16
ATTN_MERGE_SPLIT = 2 * ATTN_MERGE_BATCH
ONE_WARP_ROW_MAX_K = 8192  # GEMV_SPLIT_MIN_K in forward.py: longer rows take two warps, which this kernel lacks
DECODE_KERNEL_ENV = "TOOLTRIE_DECODE_KERNEL"
DECODE_KERNELS = ("layers", "persistent")
STAGES_ENV = "TOOLTRIE_PERSISTENT_STAGES"
IN_FLIGHT_ENV = "TOOLTRIE_PERSISTENT_IN_FLIGHT"
POLL_NS_ENV = "TOOLTRIE_PERSISTENT_POLL_NS"

# struct PdecLayer and struct PdecPlan of cuda/decode_persistent.cuh, field for field (a test parses the header).
LAYER_FIELDS = (
    ("qkv", "ptr"),
    ("qkv_bias", "ptr"),
    ("input_norm", "ptr"),
    ("q_norm", "ptr"),
    ("k_norm", "ptr"),
    ("o", "ptr"),
    ("post_norm", "ptr"),
    ("gate_up", "ptr"),
    ("down", "ptr"),
    ("k_cache", "ptr"),
    ("v_cache", "ptr"),
)
PLAN_FIELDS = (
    ("layers", "ptr"),
    ("x", "ptr"),
    ("words", "ptr"),
    ("partial", "ptr"),
    ("rope", "ptr"),
    ("done", "ptr"),
    ("finished", "ptr"),
    ("epoch", "ptr"),
    ("n_layers", "i32"),
    ("hidden", "i32"),
    ("q_width", "i32"),
    ("kv_width", "i32"),
    ("intermediate", "i32"),
    ("n_heads", "i32"),
    ("n_kv_heads", "i32"),
    ("head_dim", "i32"),
    ("max_chunks", "i32"),
    ("stages", "i32"),
    ("in_flight", "i32"),
    ("poll_ns", "i32"),
    ("eps", "f32"),
    ("scale", "f32"),
)
_CODES = {"ptr": "Q", "i32": "i", "f32": "f"}
LAYER_FORMAT = "<" + "".join(_CODES[kind] for _, kind in LAYER_FIELDS)
PLAN_FORMAT = "<" + "".join(_CODES[kind] for _, kind in PLAN_FIELDS)


def tagged_words(config: ModelConfig) -> int:
    """Tagged words the kernel hands activations over in: x, q|k|v, attention's output and the SwiGLU output."""
    c = config
    q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return c.hidden_size + q_width + 2 * kv_width + q_width + c.intermediate_size


def staging_floats(config: ModelConfig, max_chunks: int) -> int:
    """Floats of the kernel's staging area: the widest GEMV input row, or the attention merge's table of (weight, l)
    pairs, which the serial merge (up to ATTN_MERGE_SPLIT chunks) follows with the values handed over for its second
    batch (attn_merge_serial in cuda/attention_decode.cuh)."""
    c = config
    serial_merge = 2 * ATTN_MERGE_SPLIT + ATTN_MERGE_BATCH * c.head_dim
    return max(c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size, 2 * max_chunks, serial_merge)


def persistent_stages(config: ModelConfig, max_chunks: int, cap: int = DEFAULT_STAGES) -> int:
    """The deepest ring (at most ``cap``) that fits one block's shared memory beside the staging area; below
    MIN_STAGES the model does not fit (0)."""
    room = MAX_SHARED_PER_BLOCK - PDEC_STATIC_SHARED - 4 * staging_floats(config, max_chunks)
    stages = min(cap, room // SLOT_BYTES)
    return stages if stages >= MIN_STAGES else 0


def persistent_shared_bytes(config: ModelConfig, max_chunks: int, stages: int) -> int:
    """Dynamic shared memory of a block: the ring, then the staging area."""
    return stages * SLOT_BYTES + 4 * staging_floats(config, max_chunks)


def unsupported_reason(config: ModelConfig, max_chunks: int) -> str | None:
    """Why the persistent kernel cannot run this model (None: it can)."""
    c = config
    widths = {"hidden_size": c.hidden_size, "num_heads * head_dim": c.num_heads * c.head_dim}
    widths["intermediate_size"] = c.intermediate_size
    for name, k in widths.items():
        if k >= ONE_WARP_ROW_MAX_K:
            return f"{name} {k} is at least {ONE_WARP_ROW_MAX_K}: such rows are shared by two warps"
    if 2 * c.hidden_size > SLOT_ELEMS:
        return f"hidden_size {c.hidden_size} is over {SLOT_ELEMS // 2}: a ring slot holds a gate and an up row"
    if 256 % c.head_dim:
        return f"head_dim {c.head_dim} does not divide the attention block of 256 threads"
    if persistent_stages(config, max_chunks) == 0:
        return "the weight rings and the staged input do not fit one block's shared memory"
    return None


def decode_kernel_choice(config: ModelConfig, max_chunks: int, requested: str | None = None) -> str:
    """'persistent' or 'layers' for this model: ``requested``, else $TOOLTRIE_DECODE_KERNEL, else 'layers'.

    The layered launch list is the default: on an H200 the persistent kernel measured slower
    (docs/cuda-speed-notes.md #58-#62, #108). Asking for the persistent kernel where it cannot run is an error.
    """
    choice = requested if requested is not None else os.environ.get(DECODE_KERNEL_ENV) or "layers"
    if choice not in DECODE_KERNELS:
        raise ValueError(f"decode kernel {choice!r} is not one of {', '.join(DECODE_KERNELS)}")
    reason = unsupported_reason(config, max_chunks) if choice == "persistent" else None
    if reason:
        raise ValueError(f"the persistent decode kernel cannot run this model: {reason}")
    return choice


class PersistentDecode:
    """The plan of one model's persistent decode step (device memory) and the launch that runs it."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        buffers: dict[str, int],
        k_caches: list[int],
        v_caches: list[int],
        max_chunks: int,
        module: Module,
        stream: Stream,
    ) -> None:
        c = config
        cap = env_int(STAGES_ENV, DEFAULT_STAGES, MIN_STAGES, MAX_STAGES)
        self.stages = persistent_stages(config, max_chunks, cap)
        if self.stages == 0:
            raise ValueError(unsupported_reason(config, max_chunks) or f"{STAGES_ENV}={cap} is too shallow")
        # At or past the ring's depth the cap is off (the ring alone bounds the copies in flight).
        self.in_flight = env_int(IN_FLIGHT_ENV, DEFAULT_IN_FLIGHT, 1, MAX_STAGES)
        # A poll that finds a word not yet written sleeps this long before it tries again (0: it spins).
        self.poll_ns = env_int(POLL_NS_ENV, DEFAULT_POLL_NS, 0, 100_000)
        self.shared_bytes = persistent_shared_bytes(config, max_chunks, self.stages)
        self.grid = multiprocessor_count()  # one block per SM: all resident at once, as the hand-overs need
        rows = []
        weight_fields = [name for name, _ in LAYER_FIELDS if name not in ("k_cache", "v_cache")]
        for lw, kc, vc in zip(weights.layers, k_caches, v_caches, strict=True):
            ptrs = [getattr(lw, name) for name in weight_fields]  # LayerWeights names its buffers as the struct does
            rows.append(struct.pack(LAYER_FORMAT, *(b.ptr if b is not None else 0 for b in ptrs), kc, vc))
        self.layers = DeviceBuffer.from_array(np.frombuffer(b"".join(rows), dtype=np.uint8), stream)
        # Tags start at epoch 1, so the zeroed words carry none of them; the counter of finished blocks starts at 0.
        self.words = DeviceBuffer.from_array(np.zeros(tagged_words(config), dtype=np.uint64), stream)
        self.counters = DeviceBuffer.from_array(np.array([0, 1], dtype=np.uint32), stream)  # finished, epoch
        plan = struct.pack(
            PLAN_FORMAT,
            self.layers.ptr,
            buffers["x"],
            self.words.ptr,
            *(buffers[name] for name in ("partial", "rope", "done")),
            self.counters.ptr,
            self.counters.ptr + 4,
            c.num_layers,
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.intermediate_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            max_chunks,
            self.stages,
            self.in_flight,
            self.poll_ns,
            float(c.rms_norm_eps),
            1.0 / float(np.sqrt(c.head_dim)),
        )
        self.plan = DeviceBuffer.from_array(np.frombuffer(plan, dtype=np.uint8), stream)
        self.kernel = module.kernel("decode_persistent")
        self.kernel.set_max_dynamic_shared(self.shared_bytes)
        self.kernel.prefer_max_shared()

    def launch(self, pos_ptr: int, pos: int) -> Launch:
        """The step's launch: position from ``pos_ptr`` (device memory), or the host value ``pos`` when it is 0
        (argument 2, which ``CudaModel`` rewrites before each host-driven step)."""
        return Launch(
            self.kernel,
            (self.grid, 1, 1),
            (PDEC_THREADS, 1, 1),
            [("ptr", self.plan.ptr), ("ptr", pos_ptr), ("i32", pos)],
            shared_bytes=self.shared_bytes,
            label="decode_persistent",
            cooperative=True,
        )

    def free(self) -> None:
        for buf in (self.plan, self.layers, self.words, self.counters):
            buf.free()
