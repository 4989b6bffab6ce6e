"""The model on the GPU: weights, KV cache, activations, and the launch sequences of prefill and decode.

Prefill (many tokens, tiled GEMM) and decode (one token, GEMV) are separate launch lists with different
shapes. The decode list is packed once; a step only rewrites the position argument, and the token comes
from device memory (the previous step's argmax), so the same list can later be captured into a graph.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from decoder_service.engines.base import CHAIN_TOKENS
from decoder_service.engines.cuda.driver import Stream, multiprocessor_count, shared_memory_per_multiprocessor
from decoder_service.engines.cuda.gemm_cluster import (
    CLUSTER_BLOCKS,
    CLUSTER_TILES,
    cluster_grid,
    cluster_max_tokens,
    cluster_plan,
    gemm_mma_stride,
)
from decoder_service.engines.cuda.memory import DeviceBuffer, check_device_memory
from decoder_service.engines.cuda.module import MAX_SHARED_PER_BLOCK, Launch, Module
from decoder_service.engines.cuda.persistent import ATTN_MERGE_SPLIT, PersistentDecode, decode_kernel_choice
from decoder_service.engines.cuda.weights import Fp8Weight, ModelWeights, resident_weight_bytes, upload_weights
from decoder_service.engines.env import env_int
from decoder_service.models.config import ModelConfig

F32 = 4
# The KV cache holds bf16 entries (cuda/kv_cache.cuh): keys and values rounded as they are stored.
KV_ENTRY_BYTES = 2
THREADS = 256
GEMV_WARPS = 8  # warps per GEMV block (cuda/gemv.cuh)
# Rows at least this long are shared by two warps, in gemv_bf16 (cuda/gemv.cuh); shorter rows take one warp each,
# in the streaming GEMV below. Measured on an H200 with the Qwen3-1.7B shape, the MLP down GEMV (6,144-wide rows)
# is faster with one warp per row; longer rows are unmeasured and keep two.
GEMV_SPLIT_MIN_K = 8192
# gemv_bf16's blocks loop over row groups: two resident 256-thread blocks (at most 128 registers a thread) on each
# of an H200's 132 SMs; 264 blocks measured fastest against 132, 396 and 528 (docs/cuda-speed-notes.md). The grid
# changes no result, only how the rows are spread over the SMs.
GEMV_MAX_BLOCKS = 2 * 132
# Decode GEMVs with one warp per row stream their weights through shared memory (cuda/gemv_stream.cuh): each warp
# keeps a ring of row pieces (up to 2,048 columns, 4 KB) in flight, issued by the copy unit before the kernel ahead
# has finished. Measured on an H200 (docs/cuda-speed-notes.md): two blocks per SM for the plain GEMVs, each with as
# deep a ring as two blocks' shared memory allows (3 pieces per warp for 2,048-wide rows, 2 for the 6,144-wide down
# projection), and three for the SwiGLU-output gate|up GEMV (rings of 2), each count lowered where it would leave a
# ring shallower than 2. TOOLTRIE_GEMV_BLOCKS_PER_SM (one count for all) and TOOLTRIE_GEMV_STAGES (a cap on the
# depth) override them, to tune another GPU.
GSTREAM_THREADS = GEMV_WARPS * 32
GSTREAM_TILE_K = 2048  # columns of a row piece (cuda/gemv_stream.cuh)
GSTREAM_PIECE_BYTES = GSTREAM_TILE_K * 2  # one warp's row piece: a ring stage is one per warp of the block
GSTREAM_MAX_STAGES = 6  # cuda/gemv_stream.cuh
GSTREAM_STATIC_SHARED = 512  # its static shared memory (ptxas -v): the ring's barriers and a reduction scratch
GSTREAM_CHAIN_STATIC_SHARED = 896  # the chain forms', whose scratch holds every token's block reduction
GSTREAM_CHAIN_WIDE_STATIC_SHARED = 1280  # the 16-warp chain forms' (twice the barriers)
GSTREAM_BLOCKS_PER_SM = 2
GSTREAM_SWIGLU_BLOCKS_PER_SM = 3  # gate|up (a gate and an up piece per group): measured faster so
GSTREAM_MIN_STAGES = 2  # a ring below which a GEMV takes fewer blocks per SM
# The FP8 forms (weight_format 'fp8'): rings of 2 pieces and more blocks per SM, four for the plain GEMVs and three for
# gate|up. Measured on an H200 with the Qwen3-1.7B shape (bench/gpu_forward.py --weights fp8 --sweeps fp8layout,
# docs/cuda-speed-notes.md #96): the step took 1.115 ms with the bf16 forms' layout (deeper rings), 1.093 with the
# 2,048-wide plain rows at four a SM, 1.068 with gate|up at three, each with rings of 2.
GSTREAM_FP8_BLOCKS_PER_SM = 4
GSTREAM_FP8_SWIGLU_BLOCKS_PER_SM = 3
GSTREAM_FP8_MAX_STAGES = 2
# A forced chain's forward pass (cuda/trie_step.cuh's TT_FLAG_CHAINS) takes up to CHAIN_TOKENS tokens: the GEMVs'
# chain forms stage every token's input row and reduce each weight piece against all of them (GSTREAM_CHAIN_TOKENS).
# They run as one block of 16 warps an SM (gemv_stream_chain16_*), which stages the tokens' rows once for all 16
# warps where two 8-warp blocks stage them twice, give the ring that room, and reduce a warp's rows in pairs where its
# ring of 2 holds two of them (docs/cuda-speed-notes.md #85, #89). That takes RMSNorm rows that one batch
# of 256 threads normalises (the wide block's halves normalise the tokens as 8-warp blocks do, for the same bits):
# wider models keep 8-warp blocks. TOOLTRIE_CHAIN_GEMV_WARPS=8 asks for those everywhere.
GSTREAM_WIDE_WARPS = 16
GSTREAM_WIDE_MAX_NORM_K = 4 * 4 * THREADS  # GEMV_STAGE_BATCH float4s for each of an 8-warp block's threads
SM_RESERVED_SHARED = 1024  # shared memory the hardware keeps per resident block
GEMM_TILE = 64  # GEMM_BM == GEMM_BN in cuda/gemm.cuh
# Prefill GEMMs run on the tensor cores (cuda/gemm.cuh, gemm_mma16_bf16 / gemm_mma8_bf16): a block stages 16 tokens
# (8 where 16 rows of its input do not fit shared memory) and takes row groups of 64 output rows; one block per SM.
GEMM_MMA_ROWS = 64
GEMM_MMA_TOKENS = (16, 8)
GEMM_MMA_RED_PAD = 4  # GMMA_RED_PAD: floats past a group's rows in a token row of the K-quarter partials
GEMM_MMA_BATCH = 4  # GMMA_BATCH: steps of 32 columns a warp's batch of weights covers (the 64-row form)
# The same kernels with row groups of 32 and 128 rows (gemm_mma16r32_bf16, gemm_mma8r128_bf16, ...; the same bits):
# rows a group -> (the kernel name's suffix, a block's time for one group against the 64-row form's, measured on
# an H100 at 512 tokens: docs/cuda-speed-notes.md #148). gemm_mma_rows picks the form whose busiest block finishes
# first by these costs; $TOOLTRIE_GEMM_ROWS=32, 64 or 128 takes that form wherever its shared memory fits (0, the
# default: the choice).
GEMM_MMA_ROW_FORMS = {32: ("r32", 0.65), 64: ("", 1.0), 128: ("r128", 1.8)}
GEMM_ROWS_ENV = "TOOLTRIE_GEMM_ROWS"
# gemm_mma16h_bf16 stages 16 tokens where gemm_mma8_bf16 stages 8, each K-quarter's rows in two phases (the same
# bits). It takes prefills of 17 to GEMM_HALVES_TOKENS tokens ($TOOLTRIE_GEMM_HALVES_TOKENS; 0: none): on an H200
# it was faster there and slower at 16 tokens (one token group leaves the down rows 32 blocks, where gemm_mma8_bf16's
# two take 64) and at 512 (docs/cuda-speed-notes.md #142).
GEMM_HALVES_ENV = "TOOLTRIE_GEMM_HALVES_TOKENS"
GEMM_HALVES_TOKENS = 128
# The 64-row forms gemm_mma16_bf16 and gemm_mma8_bf16 run on sixteen warps, a warp with two n8 tiles
# (gemm_mma16w_bf16, gemm_mma8w_bf16; the same bits); $TOOLTRIE_GEMM_WARPS=8 keeps them on eight. In context on an
# H100 the sixteen-warp forms took a 36-token suffix's prefill from 4.36 to 4.22 ms and a 64-token one from 4.60 to
# 4.57, and left suffixes of 8 to 256 tokens no slower (docs/cuda-speed-notes.md #149).
GEMM_WARPS_ENV = "TOOLTRIE_GEMM_WARPS"
GEMM_WARPS = 16
ATTN_THREADS = 256
ATTN_CHUNK = 32  # positions per partial of the decode attention (cuda/attention_decode.cuh)
ATTN_SPLIT_BLOCKS = 24  # blocks per head of the decode attention; each takes every 24th chunk (three fit an SM)
# attention_decode_cluster: clusters of 8 blocks, which merge a head's chunks in shared memory while its context
# holds at most 8 chunks (cuda/attention_decode.cuh)
ATTN_CLUSTER = 8
# A forced chain's decode attention (global merge) shares ATTN_CHAIN_BLOCKS blocks per head out among its tokens
# (attention_decode_chain), so its working blocks fit one wave on an H200 whatever the chain's length (the grid's
# other blocks leave at once).
# TOOLTRIE_CHAIN_ATTENTION_BLOCKS overrides the count, to tune another GPU (the bits never depend on it).
ATTN_CHAIN_BLOCKS = 24
CLUSTER_ATTENTION_POSITIONS = ATTN_CLUSTER * ATTN_CHUNK
ATTN_COMPILED_HEAD_DIMS = (64, 128)  # attention_decode_hd128, attention_decode_cluster_hd64, ...
# attention_decode_short_hd128 / _hd64: contexts of at most ATTN_MERGE_SPLIT chunks, without the split merge
SHORT_ATTENTION_POSITIONS = ATTN_MERGE_SPLIT * ATTN_CHUNK
# A single token's decode attention: "global" (attention_decode: per-head counter and merge, any context),
# "cluster" (attention_decode_cluster, within CLUSTER_ATTENTION_POSITIONS), "short" (attention_decode_short, within
# SHORT_ATTENTION_POSITIONS, compiled head_dims only). The same bits in every form; a forced chain's attention
# takes the cluster form or else the global one.
AttentionForm = Literal["global", "cluster", "short"]
# Prefill attention: attention_prefill_hd128 / _hd64 serve up to ATTN_PREFILL_QUERIES (token, q head) queries of
# one kv head a block on the tensor cores (queries and weights split into bf16 hi and lo terms, fp32 sums: not
# `attention`'s bits, within 4e-6 of them); other head_dims, or groups past that, take `attention` itself.
# $TOOLTRIE_PREFILL_ATTENTION=0 keeps `attention` everywhere (the benchmarks' comparison).
ATTN_PREFILL_QUERIES = 8
ATTN_PREFILL_ROWS = 256  # positions a tile (cuda/attention.cuh)
PREFILL_ATTENTION_ENV = "TOOLTRIE_PREFILL_ATTENTION"
ATTN_STATIC_SHARED = 33_920  # attention's static shared memory (ptxas -v)
ARGMAX_THREADS = 1024
DEFAULT_SHARED_LIMIT = 48 * 1024
GEMV_IN_PLAIN, GEMV_IN_RMSNORM = 0, 1  # input transforms of cuda/gemv.cuh
# Prefill launch lists kept, by (tokens, first position). Requests on one catalog version share the prefix length
# and their suffixes have a few dozen lengths, so the same lists recur; building one (~250 launches) took 2-3.6 ms
# of host time on an H200 machine's CPU (bench/gpu_forward.py's prefill study).
PREFILL_LISTS_KEPT = 64


def gemm_mma_shared(tokens: int, k_in: int, rows: int = GEMM_MMA_ROWS) -> int:
    """Dynamic shared memory of a tensor-core prefill GEMM block (cuda/gemm.cuh) with row groups of ``rows``: its
    tokens' hi and lo bf16 rows, each padded to gemm_mma_stride, then a row group's four K-quarter partials (rows +
    GMMA_RED_PAD floats a token)."""
    return 2 * tokens * gemm_mma_stride(k_in) * 2 + 4 * tokens * (rows + GEMM_MMA_RED_PAD) * F32


def gemm_mma_halves_shared(k_in: int) -> int:
    """gemm_mma16h_bf16's dynamic shared memory: 16 tokens' hi and lo rows of one phase (half of each K-quarter's
    steps, rounded up to whole batches, the four quarters side by side), then the partials."""
    quarter_steps = math.ceil(k_in // 32 / 4)
    phase_steps = math.ceil(math.ceil(quarter_steps / 2) / GEMM_MMA_BATCH) * GEMM_MMA_BATCH
    cols = 4 * phase_steps * 32
    return 2 * 16 * gemm_mma_stride(cols) * 2 + 4 * 16 * (GEMM_MMA_ROWS + GEMM_MMA_RED_PAD) * F32


def gemm_mma_kernel(k_in: int, m: int = 0, halves_tokens: int = 0) -> tuple[str, int, int]:
    """The tensor-core GEMM for m tokens of inputs ``k_in`` wide: (kernel, tokens a block, dynamic shared memory);
    gemm_mma16h_bf16 where 16 tokens' rows fit only in halves and 16 < m <= ``halves_tokens``; ("", 0, 0) where
    none applies (the tiled GEMM)."""
    tokens = gemm_mma_tokens(k_in)
    if tokens == 8 and 16 < m <= halves_tokens and gemm_mma_halves_shared(k_in) <= MAX_SHARED_PER_BLOCK:
        return "gemm_mma16h_bf16", 16, gemm_mma_halves_shared(k_in)
    return (f"gemm_mma{tokens}_bf16", tokens, gemm_mma_shared(tokens, k_in)) if tokens else ("", 0, 0)


def gemm_mma_grid(m: int, n_out: int, tokens: int, sms: int, rows: int = GEMM_MMA_ROWS) -> tuple[int, int, int]:
    """A tensor-core prefill GEMM's grid: a block per ``tokens`` tokens and group of ``rows`` rows, as many blocks as
    SMs (each token group's blocks take every grid.y-th row group; the results do not depend on the grid)."""
    token_groups = -(-m // tokens)
    return (token_groups, min(-(-n_out // rows), max(1, sms // token_groups)), 1)


def gemm_mma_rows(m: int, n_out: int, k_in: int, tokens: int, sms: int, rows: int = 0) -> int:
    """Rows a group for a GEMM of m tokens, n_out rows, tokens a block: ``rows`` where given and its shared memory
    fits; else, of the forms whose shared memory fits, the one whose busiest block (its groups times the form's
    cost in GEMM_MMA_ROW_FORMS) finishes first, ties to 64."""

    def busiest(rows: int) -> float:
        groups, blocks = -(-n_out // rows), gemm_mma_grid(m, n_out, tokens, sms, rows)[1]
        return -(-groups // blocks) * GEMM_MMA_ROW_FORMS[rows][1]

    fits = gemm_mma_fitting_rows(tokens, k_in)
    return rows if rows in fits else min(fits, key=lambda r: (busiest(r), r != GEMM_MMA_ROWS))


def gemm_mma_fitting_rows(tokens: int, k_in: int) -> list[int]:
    """The row-group forms whose shared memory fits a block, for ``tokens`` a block of inputs ``k_in`` wide."""
    return [r for r in GEMM_MMA_ROW_FORMS if gemm_mma_shared(tokens, k_in, r) <= MAX_SHARED_PER_BLOCK]


class GemmMmaLaunch(NamedTuple):
    """A tensor-core prefill GEMM as the engine launches it."""

    kernel: str
    shared: int
    grid: tuple[int, int, int]
    threads: int = THREADS


def gemm_mma_launch(
    k_in: int, m: int, n_out: int, sms: int, halves_tokens: int = 0, rows: int = 0, warps: int = GEMM_WARPS
) -> GemmMmaLaunch | None:
    """The engine's tensor-core GEMM for m tokens, n_out rows of inputs ``k_in`` wide: gemm_mma_kernel's kernel, in
    the row-group form gemm_mma_rows picks (``rows``: that form where it fits; gemm_mma16h_bf16 has the 64-row form
    only), a 64-row form on ``warps`` warps (8 or 16); None where the tiled GEMM takes it."""
    name, tokens, shared = gemm_mma_kernel(k_in, m, halves_tokens)
    if not name:
        return None
    if name == "gemm_mma16h_bf16":
        return GemmMmaLaunch(name, shared, gemm_mma_grid(m, n_out, tokens, sms))
    rows = gemm_mma_rows(m, n_out, k_in, tokens, sms, rows)
    shared, grid = gemm_mma_shared(tokens, k_in, rows), gemm_mma_grid(m, n_out, tokens, sms, rows)
    if rows == GEMM_MMA_ROWS and warps == 16:
        return GemmMmaLaunch(gemm_mma_wide_kernel(tokens), shared, grid, 2 * THREADS)
    return GemmMmaLaunch(gemm_mma_row_kernel(tokens, rows), shared, grid)


def gemm_mma_wide_kernel(tokens: int) -> str:
    """The 64-row tensor-core GEMM of ``tokens`` a block on sixteen warps: gemm_mma16w_bf16 or gemm_mma8w_bf16."""
    return f"gemm_mma{tokens}w_bf16"


def gemm_mma_row_kernel(tokens: int, rows: int) -> str:
    """The plain tensor-core GEMM of ``tokens`` a block and row groups of ``rows``: gemm_mma16_bf16, gemm_mma8r32_bf16,
    ..."""
    return f"gemm_mma{tokens}{GEMM_MMA_ROW_FORMS[rows][0]}_bf16"


def gemm_mma_forms(k_in: int, halves_tokens: int) -> Iterator[tuple[str, int]]:
    """Every (kernel, dynamic shared memory) the engine may launch for inputs ``k_in`` wide."""
    tokens = gemm_mma_tokens(k_in)
    if not tokens:
        return
    for rows in gemm_mma_fitting_rows(tokens, k_in):
        yield gemm_mma_row_kernel(tokens, rows), gemm_mma_shared(tokens, k_in, rows)
        if rows == GEMM_MMA_ROWS:
            yield gemm_mma_wide_kernel(tokens), gemm_mma_shared(tokens, k_in, rows)
    name, _, shared = gemm_mma_kernel(k_in, halves_tokens, halves_tokens)
    if name == "gemm_mma16h_bf16":
        yield name, shared


def gemm_mma_tokens(k_in: int) -> int:
    """Tokens a tensor-core prefill GEMM block stages for inputs k_in wide: 16, or 8 where 16 rows do not fit shared
    memory; 0 where the kernel does not apply (k_in not a multiple of 32, or 8 rows too wide)."""
    if k_in % 32:
        return 0
    return next((t for t in GEMM_MMA_TOKENS if gemm_mma_shared(t, k_in) <= MAX_SHARED_PER_BLOCK), 0)


def attention_blocks_per_head(max_chunks: int, cluster: bool = False) -> int:
    """Decode attention blocks per head: one per chunk up to ATTN_SPLIT_BLOCKS; attention_decode_cluster's rounded
    up to whole clusters (blocks past the last chunk leave at once)."""
    blocks = min(max_chunks, ATTN_SPLIT_BLOCKS)
    return -(-blocks // ATTN_CLUSTER) * ATTN_CLUSTER if cluster else blocks


def decode_attention_kernel(head_dim: int, form: AttentionForm = "global", chain: bool = False) -> str:
    """The decode attention kernel a launch takes: attention_decode[_chain][_cluster], compiled for the model's
    head_dim where it is one of ATTN_COMPILED_HEAD_DIMS (``_hd128``, ``_hd64``: the same bits, fewer instructions);
    a single token's short form, attention_decode_short_hd128 or _hd64 (a chain's is the global one)."""
    if form == "short" and head_dim not in ATTN_COMPILED_HEAD_DIMS:
        raise ValueError(f"no short decode attention for head_dim {head_dim} (compiled: {ATTN_COMPILED_HEAD_DIMS})")
    if form == "short" and not chain:
        return f"attention_decode_short_hd{head_dim}"
    name = "attention_decode" + ("_chain" if chain else "") + ("_cluster" if form == "cluster" else "")
    return f"{name}_hd{head_dim}" if head_dim in ATTN_COMPILED_HEAD_DIMS else name


def prefill_attention_kernel(head_dim: int, group: int, grouped: bool = True) -> str:
    """The prefill attention kernel for this geometry: the grouped form (grouped and a compiled head_dim and a kv
    group within ATTN_PREFILL_QUERIES), else `attention`, a block per (head, token)."""
    if grouped and head_dim in ATTN_COMPILED_HEAD_DIMS and group <= ATTN_PREFILL_QUERIES:
        return f"attention_prefill_hd{head_dim}"
    return "attention"


def prefill_attention_shared(head_dim: int) -> int:
    """attention_prefill_hd*'s dynamic shared memory (attn_prefill_shared in cuda/attention.cuh): two tiles of K
    rows and one of V rows, each row padded by 16 bytes."""
    return ATTN_PREFILL_ROWS * 3 * (head_dim * KV_ENTRY_BYTES + 16)


def prefill_tokens_per_block(group: int) -> int:
    """Tokens a block of the grouped prefill attention takes: as many as its ATTN_PREFILL_QUERIES queries hold, so
    that every K and V row it reads serves as many queries as it can. Fewer tokens a block, for more blocks, was
    slower: a block takes most of an SM's shared memory at head_dim 128, so blocks past the SMs form a second wave
    (on an H100, 36 tokens after 4,249 positions: 92 µs a layer at 4 tokens a block, 94 at 3, 177 at 2, 261 at 1)."""
    return max(1, ATTN_PREFILL_QUERIES // group)


def short_attention_fits(head_dim: int, positions: int) -> bool:
    """Whether a request whose every step stays within ``positions`` can take the short form."""
    return head_dim in ATTN_COMPILED_HEAD_DIMS and positions <= SHORT_ATTENTION_POSITIONS


def chain_attention_blocks(max_chunks: int, cluster: bool) -> int:
    """Blocks per head of a forced chain's decode attention launch: the cluster form's are a single token's (whole
    clusters for every token); the global-merge form's, ATTN_CHAIN_BLOCKS (or TOOLTRIE_CHAIN_ATTENTION_BLOCKS),
    are shared out among the chain's tokens, never more than CHAIN_TOKENS single-token grids."""
    if cluster:
        return attention_blocks_per_head(max_chunks, cluster=True)
    most = CHAIN_TOKENS * attention_blocks_per_head(max_chunks)
    return min(env_int("TOOLTRIE_CHAIN_ATTENTION_BLOCKS", ATTN_CHAIN_BLOCKS, 1, CHAIN_TOKENS * ATTN_SPLIT_BLOCKS), most)


def gemv_warps_per_row(n_out: int, k_in: int) -> int:
    """Warps that share one GEMV row: two for rows of 8,192 and longer, else one.

    A function of the shape alone, so a matrix is always reduced the same way whatever the batch or call
    site. Measured on an H200: splitting short rows over more warps (more, smaller blocks) was slower.
    """
    return 2 if k_in >= GEMV_SPLIT_MIN_K else 1


def gemv_groups(n_out: int, warps_per_row: int, swiglu_out: bool = False, warps: int = GEMV_WARPS) -> int:
    """Row groups of a GEMV (cuda/gemv.cuh); a grid of this many blocks gives each block one group.

    A group is ``warps`` // warps_per_row rows; for gemv_swiglu_bf16, as many gate rows (each taken with its up
    row).
    """
    rows = warps // warps_per_row
    if swiglu_out:
        if n_out % 2:
            raise ValueError(f"a SwiGLU-output GEMV needs gate|up rows, an even count, not {n_out}")
        return -(-(n_out // 2) // rows)
    return -(-n_out // rows)


def gstream_slot_bytes(k_in: int, weight_bytes: int = 2) -> int:
    """A ring slot's bytes for ``k_in``-wide rows of ``weight_bytes``-byte weights (cuda/gemv_stream.cuh): a full
    piece for bf16, the row itself where an e4m3 row is shorter than a piece."""
    return GSTREAM_PIECE_BYTES if weight_bytes == 2 else min(k_in * weight_bytes, GSTREAM_PIECE_BYTES)


def gemv_stream_shared(
    k_in: int, stages: int, tokens: int = 1, warps: int = GEMV_WARPS, slot_bytes: int = GSTREAM_PIECE_BYTES
) -> int:
    """Dynamic shared memory of a streaming GEMV block of ``warps`` warps: its ring of weight pieces (``slot_bytes``
    each) and its staged input rows (one per token: CHAIN_TOKENS for the chain forms)."""
    return stages * warps * slot_bytes + tokens * k_in * F32


def _ring_room(
    k_in: int,
    blocks_per_sm: int,
    sm_shared: int,
    tokens: int = 1,
    warps: int = GEMV_WARPS,
    slot_bytes: int = GSTREAM_PIECE_BYTES,
) -> int:
    """Ring stages that fit each of ``blocks_per_sm`` streaming GEMV blocks of ``k_in``-wide rows (``tokens`` input
    rows staged, ``warps`` warps, slots of ``slot_bytes``) in one SM's ``sm_shared`` bytes of shared memory (0 or
    less: not even the input rows fit)."""
    if tokens == 1:
        static = GSTREAM_STATIC_SHARED
    else:
        static = GSTREAM_CHAIN_WIDE_STATIC_SHARED if warps == GSTREAM_WIDE_WARPS else GSTREAM_CHAIN_STATIC_SHARED
    per_block = sm_shared // blocks_per_sm - SM_RESERVED_SHARED - static - tokens * k_in * F32
    return per_block // (warps * slot_bytes)


def gemv_stream_stages(
    k_in: int,
    blocks_per_sm: int,
    sm_shared: int,
    cap: int = GSTREAM_MAX_STAGES,
    tokens: int = 1,
    warps: int = GEMV_WARPS,
    slot_bytes: int = GSTREAM_PIECE_BYTES,
) -> int:
    """The deepest ring (at most ``cap``) with which ``blocks_per_sm`` streaming GEMV blocks of ``k_in``-wide rows
    fit in one SM's ``sm_shared`` bytes of shared memory."""
    stages = min(cap, _ring_room(k_in, blocks_per_sm, sm_shared, tokens, warps, slot_bytes))
    if stages < 1:
        raise ValueError(
            f"{blocks_per_sm} streaming GEMV blocks of {k_in}-wide rows do not fit in {sm_shared} bytes of shared "
            "memory per SM; lower TOOLTRIE_GEMV_BLOCKS_PER_SM"
        )
    return stages


def gemv_stream_layout(
    k_in: int,
    sm_shared: int,
    max_blocks: int,
    fixed_blocks: int | None = None,
    cap: int = GSTREAM_MAX_STAGES,
    tokens: int = 1,
    warps: int = GEMV_WARPS,
    slot_bytes: int = GSTREAM_PIECE_BYTES,
) -> tuple[int, int]:
    """(blocks per SM, ring depth) of a streaming GEMV of ``k_in``-wide rows: the most blocks, up to ``max_blocks``,
    whose rings still hold GSTREAM_MIN_STAGES pieces per warp (or ``cap``, if lower), each with the deepest ring
    that fits; ``fixed_blocks`` (TOOLTRIE_GEMV_BLOCKS_PER_SM) sets the count instead. ``tokens``: input rows a block
    stages (CHAIN_TOKENS for the chain forms); ``warps``: a block's warps; ``slot_bytes``: a ring slot's bytes."""
    if fixed_blocks is not None:
        return fixed_blocks, gemv_stream_stages(k_in, fixed_blocks, sm_shared, cap, tokens, warps, slot_bytes)
    want = min(GSTREAM_MIN_STAGES, cap)
    fits = (b for b in range(max_blocks, 1, -1) if _ring_room(k_in, b, sm_shared, tokens, warps, slot_bytes) >= want)
    blocks = next(fits, 1)
    return blocks, gemv_stream_stages(k_in, blocks, sm_shared, cap, tokens, warps, slot_bytes)


def gemv_chain_layout(
    k_in: int,
    swiglu: bool,
    sm_shared: int,
    max_blocks: int,
    fixed_blocks: int | None = None,
    cap: int = GSTREAM_MAX_STAGES,
    warps: int = GEMV_WARPS,
) -> tuple[int, int]:
    """(blocks per SM, ring depth) of a streaming GEMV's chain form: gemv_stream_layout with CHAIN_TOKENS input rows,
    a SwiGLU ring of whole-row pieces cut to an even depth, so that it holds gate|up pairs (the kernel then reads
    each staged input once for both rows). Blocks of GSTREAM_WIDE_WARPS warps: one an SM, with rings of
    GSTREAM_MIN_STAGES, which leave room beside a qkv block for the chain's K/V row kernel after it (a ring of 3 for
    the 2,048-wide rows measured slower on an H200, docs/cuda-speed-notes.md #85)."""
    if warps == GSTREAM_WIDE_WARPS:
        max_blocks, fixed_blocks, cap = 1, None, min(cap, GSTREAM_MIN_STAGES)
    blocks, stages = gemv_stream_layout(k_in, sm_shared, max_blocks, fixed_blocks, cap, CHAIN_TOKENS, warps)
    if swiglu and stages > 2 and k_in <= GSTREAM_TILE_K:
        stages -= stages % 2
    return blocks, stages


def chain_gemv_warps(hidden_size: int) -> int:
    """Warps of a chain-form GEMV block: GSTREAM_WIDE_WARPS where the wide block's halves can normalise the inputs
    (RMSNorm rows of at most GSTREAM_WIDE_MAX_NORM_K values) and TOOLTRIE_CHAIN_GEMV_WARPS does not ask for 8."""
    wanted = env_int("TOOLTRIE_CHAIN_GEMV_WARPS", GSTREAM_WIDE_WARPS, GEMV_WARPS, GSTREAM_WIDE_WARPS)
    if wanted not in (GEMV_WARPS, GSTREAM_WIDE_WARPS):
        raise ValueError(f"TOOLTRIE_CHAIN_GEMV_WARPS is {wanted}; it takes {GEMV_WARPS} or {GSTREAM_WIDE_WARPS}")
    return GSTREAM_WIDE_WARPS if wanted == GSTREAM_WIDE_WARPS and hidden_size <= GSTREAM_WIDE_MAX_NORM_K else GEMV_WARPS


def chain_gemv_kernels(warps: int) -> tuple[str, str]:
    """The chain-form streaming GEMVs (plain, SwiGLU output) with blocks of ``warps`` warps."""
    if warps == GSTREAM_WIDE_WARPS:
        return "gemv_stream_chain16_bf16", "gemv_stream_chain16_swiglu_bf16"
    return "gemv_stream_chain_bf16", "gemv_stream_chain_swiglu_bf16"


def check_config(config: ModelConfig) -> None:
    """Reject shapes the kernels do not cover, naming the value and what is accepted."""
    c = config
    if not (c.head_dim == 16 or c.head_dim % 32 == 0) or not 16 <= c.head_dim <= 256:
        raise ValueError(
            f"head_dim {c.head_dim} is not supported; use 16 or a multiple of 32 up to 256 (16, 64 and 128 tested)"
        )
    for name, k in (
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_heads * head_dim", c.num_heads * c.head_dim),
    ):
        if k % 8:
            raise ValueError(f"{name} {k} must be a multiple of 8 (GEMV reads 16-byte rows)")


def model_buffer_bytes(config: ModelConfig, max_context: int, max_prefill: int) -> dict[str, int]:
    """The bytes of each of a CudaModel's buffers besides its weights, by attribute name: a prefill chunk's
    activations, the logits, the ids, a layer's K (and V) cache, the rotary table, decode attention's chunk records."""
    c, t = config, max_prefill
    q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return {
        "x": t * c.hidden_size * F32,  # residual stream
        "xn": t * c.hidden_size * F32,  # normalised input of a block
        "qkv": t * (q_width + 2 * kv_width) * F32,
        "attn": t * q_width * F32,
        "gate_up": t * 2 * c.intermediate_size * F32,
        "act": t * c.intermediate_size * F32,
        "logits": c.vocab_size * F32,
        "tokens": t * 4,  # prompt ids of a prefill chunk
        "token": 4,  # argmax output; the next decode step's input
        "layer_cache": max_context * kv_width * KV_ENTRY_BYTES,  # one layer's K, or its V
        "rope": max_context * c.head_dim * F32,
        # one set per token of a forced chain; a single-token step uses the first
        "attn_partial": CHAIN_TOKENS * c.num_heads * -(-max_context // ATTN_CHUNK) * (c.head_dim + 2) * F32,
        "attn_done": CHAIN_TOKENS * c.num_heads * 4,
    }


def model_device_bytes(config: ModelConfig, max_context: int, max_prefill: int, weight_format: str) -> dict[str, int]:
    """What a CudaModel keeps on the device, by part: its weights (resident_weight_bytes), the KV cache of
    ``max_context`` positions, and its other buffers (model_buffer_bytes). A persistent decode kernel adds its own
    plan and flags."""
    buffers = model_buffer_bytes(config, max_context, max_prefill)
    kv_cache = 2 * config.num_layers * buffers.pop("layer_cache")
    return {
        "weights": resident_weight_bytes(config, weight_format),
        "KV cache": kv_cache,
        "buffers": sum(buffers.values()),
    }


class CudaModel:
    """One sequence's forward pass on the GPU (batch 1).

    ``decode_kernel``: how a decode step runs: 'layers' (a launch list of kernels per layer, the default) or
    'persistent' (every layer in one kernel, cuda/decode_persistent.cuh); None reads $TOOLTRIE_DECODE_KERNEL, else
    'layers'. Both forms give the same bits; prefill always runs the layered kernels.
    ``weight_format``: 'bf16', or 'fp8' for weights whose layer projections are e4m3 rows with power-of-two scales
    (``decoder_service.models.fp8.quantize_weights``): the single-token GEMVs of the layered step then read e4m3
    bytes (gemv_stream_fp8, gemv_stream_swiglu_fp8), with the bits of the bf16 kernels on the same weights.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, np.ndarray],
        module: Module,
        max_context: int = 4096,
        max_prefill: int = 512,
        stream: Stream | None = None,
        decode_kernel: str | None = None,
        weight_format: str = "bf16",
    ) -> None:
        try:
            self._setup(config, weights, module, max_context, max_prefill, stream, decode_kernel, weight_format)
        except BaseException:
            self.free()  # a refused setting or a failed allocation leaves nothing on the device
            raise

    def _setup(
        self,
        config: ModelConfig,
        weights: dict[str, np.ndarray],
        module: Module,
        max_context: int,
        max_prefill: int,
        stream: Stream | None,
        decode_kernel: str | None,
        weight_format: str,
    ) -> None:
        check_config(config)
        self.config = config
        self.module = module
        self.stream = stream or Stream()
        self.max_context = max_context
        self.max_prefill = max_prefill
        self.weight_format = weight_format
        # Refused before the upload, which would otherwise fail part of the way in.
        check_device_memory(
            f"the model ({weight_format} weights, a KV cache of {max_context} positions)",
            model_device_bytes(config, max_context, max_prefill, weight_format),
        )
        self.weights: ModelWeights = upload_weights(config, weights, self.stream, weight_format)
        c = config
        self.q_width = c.num_heads * c.head_dim
        self.kv_width = c.num_kv_heads * c.head_dim
        self.qkv_width = self.q_width + 2 * self.kv_width
        size = model_buffer_bytes(config, max_context, max_prefill)
        self.x = DeviceBuffer(size["x"])
        self.xn = DeviceBuffer(size["xn"])
        self.qkv = DeviceBuffer(size["qkv"])
        self.attn = DeviceBuffer(size["attn"])
        self.gate_up = DeviceBuffer(size["gate_up"])
        self.act = DeviceBuffer(size["act"])
        self.logits = DeviceBuffer(size["logits"])
        self.tokens = DeviceBuffer(size["tokens"])
        self.token = DeviceBuffer(size["token"])
        self.k_cache = [DeviceBuffer(size["layer_cache"]) for _ in range(c.num_layers)]
        self.v_cache = [DeviceBuffer(size["layer_cache"]) for _ in range(c.num_layers)]
        # Every position's rotary cosines and sines, computed once on the device (cuda/rope.cuh): prefill and
        # decode read the same values, and decode attention computes no powf, cosf or sinf.
        self.rope = DeviceBuffer(size["rope"])
        Launch(
            module.kernel("rope_table"),
            (max_context, 1, 1),
            (max(32, c.head_dim // 2), 1, 1),
            [("ptr", self.rope.ptr), ("i32", c.head_dim), ("f32", float(c.rope_theta))],
        )(self.stream)
        self.attn_shared = max_context * F32  # one score per cached position (prefill attention)
        self.max_chunks = -(-max_context // ATTN_CHUNK)
        # Decode attention's chunk records and per-head merge counters (the kernel leaves them at 0), one set per
        # token of a forced chain; a single-token step uses the first.
        self.attn_partial = DeviceBuffer(size["attn_partial"])
        self.attn_done = DeviceBuffer(size["attn_done"])
        self.attn_done.upload(np.zeros(CHAIN_TOKENS * c.num_heads, dtype=np.int32), self.stream)
        if self.attn_shared + ATTN_STATIC_SHARED > MAX_SHARED_PER_BLOCK:
            limit = (MAX_SHARED_PER_BLOCK - ATTN_STATIC_SHARED) // F32
            raise ValueError(f"max_context {max_context} needs more shared memory than a block has; at most {limit}")
        if self.attn_shared + ATTN_STATIC_SHARED > DEFAULT_SHARED_LIMIT:
            module.kernel("attention").set_max_dynamic_shared(self.attn_shared)
        grouped = env_int(PREFILL_ATTENTION_ENV, 1, 0, 1) == 1
        self.prefill_attention = prefill_attention_kernel(c.head_dim, c.num_heads // c.num_kv_heads, grouped)
        self.prefill_attention_shared = prefill_attention_shared(c.head_dim)
        if self.prefill_attention != "attention":
            module.kernel(self.prefill_attention).set_max_dynamic_shared(self.prefill_attention_shared)
        gemv_shared = max(c.hidden_size, self.q_width, c.intermediate_size) * F32  # the staged input row
        if gemv_shared > DEFAULT_SHARED_LIMIT - 1024:
            if gemv_shared > MAX_SHARED_PER_BLOCK - 1024:
                raise ValueError(
                    f"GEMV inputs of {gemv_shared // F32} values exceed shared memory; at most "
                    f"{(MAX_SHARED_PER_BLOCK - 1024) // F32}"
                )
            for name in ("gemv_bf16", "gemv_swiglu_bf16"):
                module.kernel(name).set_max_dynamic_shared(gemv_shared)
        fixed_blocks = env_int("TOOLTRIE_GEMV_BLOCKS_PER_SM", 0, 1, 4) or None  # unset: the rule above
        stage_cap = env_int("TOOLTRIE_GEMV_STAGES", GSTREAM_MAX_STAGES, 1, GSTREAM_MAX_STAGES)
        sm_shared, sms = shared_memory_per_multiprocessor(), multiprocessor_count()
        # (grid cap, ring depth) per (input width, SwiGLU output) of the streaming GEMVs (rows of one warp); longer
        # rows go to gemv_bf16 and need no ring.
        kinds = {(k, False) for k in (c.hidden_size, self.q_width, c.intermediate_size)} | {(c.hidden_size, True)}
        self.gemv_layout: dict[tuple[int, bool], tuple[int, int]] = {}
        self.gemv_chain_layout: dict[tuple[int, bool], tuple[int, int]] = {}  # the chain forms'
        self.gemv_fp8_layout: dict[tuple[int, bool], tuple[int, int]] = {}  # the FP8 forms' (weight_format 'fp8')
        self.chain_warps = chain_gemv_warps(c.hidden_size)
        for k, swiglu in kinds:
            if gemv_warps_per_row(0, k) == 1:
                most = GSTREAM_SWIGLU_BLOCKS_PER_SM if swiglu else GSTREAM_BLOCKS_PER_SM
                blocks, stages = gemv_stream_layout(k, sm_shared, most, fixed_blocks, stage_cap)
                self.gemv_layout[(k, swiglu)] = (blocks * sms, stages)
                chain = gemv_chain_layout(k, swiglu, sm_shared, most, fixed_blocks, stage_cap, self.chain_warps)
                self.gemv_chain_layout[(k, swiglu)] = (chain[0] * sms, chain[1])
                if weight_format == "fp8":
                    most = GSTREAM_FP8_SWIGLU_BLOCKS_PER_SM if swiglu else GSTREAM_FP8_BLOCKS_PER_SM
                    cap = min(stage_cap, GSTREAM_FP8_MAX_STAGES)
                    slot = gstream_slot_bytes(k, 1)
                    fp8 = gemv_stream_layout(k, sm_shared, most, fixed_blocks, cap, slot_bytes=slot)
                    self.gemv_fp8_layout[(k, swiglu)] = (fp8[0] * sms, fp8[1])
        for layout, tokens, warps, names, weight_bytes in (
            (self.gemv_layout, 1, GEMV_WARPS, ("gemv_stream_bf16", "gemv_stream_swiglu_bf16"), 2),
            (self.gemv_chain_layout, CHAIN_TOKENS, self.chain_warps, chain_gemv_kernels(self.chain_warps), 2),
            (self.gemv_fp8_layout, 1, GEMV_WARPS, ("gemv_stream_fp8", "gemv_stream_swiglu_fp8"), 1),
        ):
            if layout:
                most_shared = max(
                    gemv_stream_shared(k, s, tokens, warps, gstream_slot_bytes(k, weight_bytes))
                    for (k, _), (_, s) in layout.items()
                )
                for name in names:
                    module.kernel(name).set_max_dynamic_shared(most_shared)
        for name in (
            "gemv_stream_bf16",
            "gemv_stream_swiglu_bf16",
            *(("gemv_stream_fp8", "gemv_stream_swiglu_fp8") if weight_format == "fp8" else ()),
            *chain_gemv_kernels(self.chain_warps),
            "attention_decode",
            "attention_decode_cluster",
            "attention_decode_chain",
            "attention_decode_chain_cluster",
        ):  # not the compiled _hd forms: no faster with it (docs/cuda-speed-notes.md #82)
            module.kernel(name).prefer_max_shared()
        self.sms = sms
        mma_shared: dict[str, int] = {}  # each tensor-core GEMM kernel's most shared memory over the model's widths
        self.gemm_halves_tokens = env_int(GEMM_HALVES_ENV, GEMM_HALVES_TOKENS, 0, 1 << 20)
        self.gemm_rows = env_int(GEMM_ROWS_ENV, 0, 0, max(GEMM_MMA_ROW_FORMS))
        if self.gemm_rows and self.gemm_rows not in GEMM_MMA_ROW_FORMS:
            raise ValueError(f"{GEMM_ROWS_ENV}={self.gemm_rows}: the row-group forms are {sorted(GEMM_MMA_ROW_FORMS)}")
        self.gemm_warps = env_int(GEMM_WARPS_ENV, GEMM_WARPS, 8, 16)
        if self.gemm_warps not in (8, 16):
            raise ValueError(f"{GEMM_WARPS_ENV}={self.gemm_warps}: the tensor-core GEMMs run on 8 or 16 warps")
        for k in (c.hidden_size, self.q_width, c.intermediate_size):
            for name, shared in gemm_mma_forms(k, self.gemm_halves_tokens):
                mma_shared[name] = max(mma_shared.get(name, 0), shared)
        for name, shared in mma_shared.items():
            if shared > DEFAULT_SHARED_LIMIT:
                module.kernel(name).set_max_dynamic_shared(shared)
        # $TOOLTRIE_GEMM_CLUSTER_TOKENS: short prefills on the cluster GEMM (each weight read once; gemm_mma16_bf16's
        # bits), its shape per launch.
        self.gemm_cluster_tokens = cluster_max_tokens()
        for tiles in CLUSTER_TILES if self.gemm_cluster_tokens else ():
            module.kernel(f"gemm_mma_cluster{tiles}_bf16").set_max_dynamic_shared(MAX_SHARED_PER_BLOCK)
        self._max_clusters: dict[tuple[str, int], int] = {}
        # The decode step: one launch list of kernels per layer, or every layer in one persistent kernel; both give
        # the same bits.
        self.decode_kernel = decode_kernel_choice(config, self.max_chunks, decode_kernel)
        self.persistent: PersistentDecode | None = None
        if self.decode_kernel == "persistent":
            self.persistent = self.persistent_decode()
        self.length = 0  # positions held in the KV cache
        self._decode, self._decode_pos_args = self._build(1, tokens_ptr=self.token.ptr, pos=0)
        self._prefill_lists: OrderedDict[tuple[int, int], list[Launch]] = OrderedDict()

    def persistent_decode(self) -> PersistentDecode:
        """A persistent decode step over this model's weights, activations and KV cache (its ring depth, copies in
        flight and poll sleep from $TOOLTRIE_PERSISTENT_STAGES, _IN_FLIGHT and _POLL_NS as they are now); the caller
        frees it."""
        buffers = {
            "x": self.x.ptr,
            "partial": self.attn_partial.ptr,
            "rope": self.rope.ptr,
            "done": self.attn_done.ptr,
        }
        k_caches, v_caches = [buf.ptr for buf in self.k_cache], [buf.ptr for buf in self.v_cache]
        return PersistentDecode(
            self.config, self.weights, buffers, k_caches, v_caches, self.max_chunks, self.module, self.stream
        )

    # -- launch lists -------------------------------------------------------------------------------------
    def _build(
        self, n: int, tokens_ptr: int, pos: int, **options: Any
    ) -> tuple[list[Launch], list[tuple[Launch, int]]]:
        """``_build_parts``' launches and position arguments, whole."""
        launches: list[Launch] = []
        pos_args: list[tuple[Launch, int]] = []
        for part, part_pos_args in self._build_parts(n, tokens_ptr, pos, **options):
            launches += part
            pos_args += part_pos_args
        return launches, pos_args

    def _build_parts(
        self,
        n: int,
        tokens_ptr: int,
        pos: int,
        pos_ptr: int = 0,
        head: bool = True,
        attention: AttentionForm = "global",
        final_norm: bool = True,
    ) -> Iterator[tuple[list[Launch], list[tuple[Launch, int]]]]:
        """Launches for ``n`` tokens at positions pos..pos+n-1, then the final norm of the last token into
        ``xn`` (without ``head``, only with ``final_norm``) and, with ``head``, the dense head and argmax; in parts as
        they are built (the embedding, each layer's, then the tail), so that a caller can launch the first layers
        while the rest are built. Each part comes with the (launch, argument index) pairs that carry its host
        position.

        ``pos_ptr``: device address of the position (0: the host value ``pos``). ``attention``: the single
        token's decode attention form (AttentionForm; ``CudaEngine`` takes the cluster form for requests within
        CLUSTER_ATTENTION_POSITIONS, else the short one within SHORT_ATTENTION_POSITIONS).
        """
        c, w, k = self.config, self.weights, self.module.kernel
        eps = float(c.rms_norm_eps)
        embed = self._embed(n, tokens_ptr)
        if n == 1 and self.persistent is not None:  # every layer in one launch (cuda/decode_persistent.cuh)
            step = self.persistent.launch(pos_ptr, pos)
            yield [embed, step], [(step, 2)]
            yield self._tail(n, head, final_norm), []
            return
        yield [embed], []
        for i, lw in enumerate(w.layers):
            # Decode (n == 1) fuses each RMSNorm into the GEMV that consumes it and the SwiGLU into the gate|up
            # GEMV that produces it; prefill runs them as separate kernels around the tiled GEMM.
            if n == 1:
                layer = self._decode_layer(i, pos_ptr, pos, attention)
                yield layer, [(layer[1], 9)]  # decode attention's host position
                continue
            launches = [self._rmsnorm(self.x.ptr, lw.input_norm.ptr, self.xn.ptr, n, eps)]
            launches.append(
                self._gemm(
                    lw.qkv.ptr, self.xn.ptr, _ptr(lw.qkv_bias), 0, self.qkv.ptr, n, self.qkv_width, c.hidden_size
                )
            )
            rope = Launch(
                k("qk_norm_rope_cache"),
                (n, c.num_heads + c.num_kv_heads, 1),
                (max(32, c.head_dim), 1, 1),  # whole warps: the block sum folds warps
                [
                    ("ptr", self.qkv.ptr),
                    ("ptr", _ptr(lw.q_norm)),
                    ("ptr", _ptr(lw.k_norm)),
                    ("ptr", self.k_cache[i].ptr),
                    ("ptr", self.v_cache[i].ptr),
                    ("ptr", pos_ptr),
                    ("i32", pos),
                    ("i32", c.num_heads),
                    ("i32", c.num_kv_heads),
                    ("i32", c.head_dim),
                    ("ptr", self.rope.ptr),
                    ("f32", eps),
                ],
            )
            attn = self._prefill_attention(i, n, pos_ptr, pos)
            launches += [rope, attn]
            total = n * c.intermediate_size
            launches += [
                self._gemm(lw.o.ptr, self.attn.ptr, 0, self.x.ptr, self.x.ptr, n, c.hidden_size, self.q_width),
                self._rmsnorm(self.x.ptr, lw.post_norm.ptr, self.xn.ptr, n, eps),
                self._gemm(
                    lw.gate_up.ptr, self.xn.ptr, 0, 0, self.gate_up.ptr, n, 2 * c.intermediate_size, c.hidden_size
                ),
                Launch(
                    k("swiglu"),
                    (min(4096, -(-total // THREADS)), 1, 1),
                    (THREADS, 1, 1),
                    [("ptr", self.gate_up.ptr), ("ptr", self.act.ptr), ("i32", n), ("i32", c.intermediate_size)],
                ),
                self._gemm(lw.down.ptr, self.act.ptr, 0, self.x.ptr, self.x.ptr, n, c.hidden_size, c.intermediate_size),
            ]
            yield launches, [(rope, 6), (attn, 5)]
        yield self._tail(n, head, final_norm), []

    def _tail(self, n: int, head: bool, final_norm: bool) -> list[Launch]:
        """What follows the last layer: the final norm, head and argmax; the final norm alone; or nothing."""
        return self._head(n) if head else self._head(n)[:1] if final_norm else []

    def _embed(self, n: int, tokens_ptr: int) -> Launch:
        """The embedding rows of the ``n`` tokens at ``tokens_ptr`` (0: the host argument 2) into ``x``."""
        c = self.config
        return Launch(
            self.module.kernel("embed_gather"),
            (n, 1, 1),
            (THREADS, 1, 1),
            [
                ("ptr", self.weights.embed.ptr),
                ("ptr", tokens_ptr),
                ("i32", 0),
                ("ptr", self.x.ptr),
                ("i32", c.hidden_size),
                ("i32", c.vocab_size),
            ],
        )

    def _decode_layer(
        self, i: int, pos_ptr: int, pos: int, attention: AttentionForm, count_ptr: int = 0
    ) -> list[Launch]:
        """Layer ``i`` of a decode step: the q|k|v GEMV (RMSNorm staged), decode attention (its host position at
        argument 9), the o GEMV with the residual, the gate|up GEMV writing silu(gate) * up, the down GEMV with the
        residual. With ``count_ptr``, a forced chain's: every launch in its chain form, the chain's K/V rows written
        before attention."""
        c, lw = self.config, self.weights.layers[i]
        fp8 = lw.fp8 or {}  # the e4m3 rows, with the FP8 weight format
        gemv = self._gemv
        launches = [
            gemv(
                lw.qkv.ptr,
                self.x.ptr,
                GEMV_IN_RMSNORM,
                lw.input_norm.ptr,
                _ptr(lw.qkv_bias),
                0,
                self.qkv.ptr,
                self.qkv_width,
                c.hidden_size,
                "qkv",
                count_ptr=count_ptr,
                fp8=fp8.get("qkv"),
            ),
            self._decode_attention(i, pos_ptr, pos, attention, count_ptr),
            gemv(
                lw.o.ptr,
                self.attn.ptr,
                GEMV_IN_PLAIN,
                0,
                0,
                self.x.ptr,
                self.x.ptr,
                c.hidden_size,
                self.q_width,
                "o",
                count_ptr=count_ptr,
                fp8=fp8.get("o"),
            ),
            gemv(
                lw.gate_up.ptr,
                self.x.ptr,
                GEMV_IN_RMSNORM,
                lw.post_norm.ptr,
                0,
                0,
                self.act.ptr,
                2 * c.intermediate_size,
                c.hidden_size,
                "gate_up",
                swiglu_out=True,
                count_ptr=count_ptr,
                fp8=fp8.get("gate_up"),
            ),
            gemv(
                lw.down.ptr,
                self.act.ptr,
                GEMV_IN_PLAIN,
                0,
                0,
                self.x.ptr,
                self.x.ptr,
                c.hidden_size,
                c.intermediate_size,
                "down",
                count_ptr=count_ptr,
                fp8=fp8.get("down"),
            ),
        ]
        if count_ptr:  # the chain's K/V rows, which each token's attention reads from the cache
            launches.insert(
                1,
                Launch(
                    self.module.kernel("attention_chain_rows"),
                    (CHAIN_TOKENS, c.num_kv_heads, 1),
                    (max(32, c.head_dim), 1, 1),
                    [
                        ("ptr", self.qkv.ptr),
                        ("ptr", _ptr(lw.k_norm)),
                        ("ptr", self.k_cache[i].ptr),
                        ("ptr", self.v_cache[i].ptr),
                        ("ptr", pos_ptr),
                        ("ptr", count_ptr),
                        ("i32", c.num_heads),
                        ("i32", c.num_kv_heads),
                        ("i32", c.head_dim),
                        ("ptr", self.rope.ptr),
                        ("f32", float(c.rms_norm_eps)),
                    ],
                    label="attention_chain_rows",
                ),
            )
        return launches

    def _decode_attention(
        self, layer: int, pos_ptr: int, pos: int, form: AttentionForm = "global", count_ptr: int = 0
    ) -> Launch:
        """The new token's attention in one launch (cuda/attention_decode.cuh): q/k norm and rotary embedding,
        the cache write, fixed 32-position chunks split over up to 24 blocks per head, and the merge (``form``: see
        AttentionForm; the cluster form's grid is whole clusters of ATTN_CLUSTER blocks). With ``count_ptr``, the chain
        form (attention_decode_chain*): *count_ptr tokens from the position at ``pos_ptr``, a grid slice each (the
        global merge's: chain_attention_blocks per head, shared among the tokens)."""
        c, lw = self.config, self.weights.layers[layer]
        name = decode_attention_kernel(c.head_dim, form, chain=bool(count_ptr))
        cluster = form == "cluster"
        return Launch(
            self.module.kernel(name),
            (c.num_heads, chain_attention_blocks(self.max_chunks, cluster), CHAIN_TOKENS)
            if count_ptr
            else (c.num_heads, attention_blocks_per_head(self.max_chunks, cluster), 1),
            (ATTN_THREADS, 1, 1),
            [
                ("ptr", self.qkv.ptr),
                ("ptr", _ptr(lw.q_norm)),
                ("ptr", _ptr(lw.k_norm)),
                ("ptr", self.k_cache[layer].ptr),
                ("ptr", self.v_cache[layer].ptr),
                ("ptr", self.attn_partial.ptr),
                ("ptr", self.attn.ptr),
                ("ptr", self.attn_done.ptr),
                ("ptr", pos_ptr),
                ("ptr", count_ptr) if count_ptr else ("i32", pos),
                ("i32", c.num_heads),
                ("i32", c.num_kv_heads),
                ("i32", c.head_dim),
                ("f32", 1.0 / math.sqrt(c.head_dim)),
                ("ptr", self.rope.ptr),
                ("f32", float(c.rms_norm_eps)),
                ("i32", self.max_chunks),
            ],
            label=name,
        )

    def step_launches(
        self, token_ptr: int, pos_ptr: int, attention: AttentionForm = "global", final_norm: bool = True
    ) -> tuple[list[Launch], list[tuple[Launch, int]]]:
        """One decode token's forward pass up to the final norm (into ``xn``), without a head; without
        ``final_norm``, up to the last layer (the sparse head normalises the row itself).

        Device-pointer form: ``token_ptr`` and ``pos_ptr`` hold the token and its position (a captured graph).
        Host-argument form (both 0): set the embedding's argument 2 to the token and the returned position
        arguments to the position before each launch. ``attention``: as ``_build_parts`` takes it (the persistent
        decode kernel has its own attention and ignores it).
        """
        return self._build(
            1,
            tokens_ptr=token_ptr,
            pos=0,
            pos_ptr=pos_ptr,
            head=False,
            attention=attention,
            final_norm=final_norm,
        )

    @property
    def supports_chains(self) -> bool:
        """Whether a forward pass can take a forced chain of up to CHAIN_TOKENS tokens: the layered decode step with
        every GEMV in its streaming form (rows of one warp) and room for the chain's rows."""
        widths = (self.config.hidden_size, self.q_width, self.config.intermediate_size)
        return (
            self.persistent is None
            and all(gemv_warps_per_row(0, k) == 1 for k in widths)
            and self.max_prefill >= CHAIN_TOKENS
        )

    def chain_launches(
        self, tokens_ptr: int, pos_ptr: int, count_ptr: int, attention: AttentionForm, final_norm: bool = True
    ) -> list[Launch]:
        """The forward pass of a forced chain up to the final norm of its last token (into ``xn``; without
        ``final_norm``, up to the last layer, row *count_ptr - 1 of ``x`` being the last token's): the tokens at
        ``tokens_ptr``, *``count_ptr`` of them (2 to CHAIN_TOKENS), from the position at ``pos_ptr`` (device
        memory, the step's control block). Each token's values are the bits of ``step_launches`` at its position.
        ``attention``: the single token's form; "cluster" takes attention_decode_chain_cluster (the same bits), the
        others attention_decode_chain."""
        if not self.supports_chains:
            raise ValueError("this model's decode step takes no forced chains (see supports_chains)")
        c, w, k = self.config, self.weights, self.module.kernel
        eps = float(c.rms_norm_eps)
        launches = [self._embed(CHAIN_TOKENS, tokens_ptr)]  # rows past the chain's are never read
        for i in range(c.num_layers):
            launches += self._decode_layer(i, pos_ptr, 0, attention, count_ptr)
        if not final_norm:
            return launches
        launches.append(
            Launch(
                k("rmsnorm_last"),
                (1, 1, 1),
                (THREADS, 1, 1),
                [
                    ("ptr", self.x.ptr),
                    ("ptr", w.norm.ptr),
                    ("ptr", self.xn.ptr),
                    ("i32", c.hidden_size),
                    ("f32", eps),
                    ("ptr", count_ptr),
                ],
            )
        )
        return launches

    def dense_head(self) -> Launch:
        """The vocabulary GEMV of ``xn`` into ``logits`` (the dense head; the sparse head reads the same rows)."""
        return self._head(1)[1]

    def _head(self, n: int) -> list[Launch]:
        """Final norm of the last token, the dense vocabulary GEMV, then greedy argmax into ``self.token``.

        The norm runs as its own kernel here: the head GEMV has ~19,000 blocks, and a per-block norm prologue
        cost more than one extra launch (measured on an H200).
        """
        c, k = self.config, self.module.kernel
        last = self.x.ptr + (n - 1) * c.hidden_size * F32
        return [
            self._rmsnorm(last, self.weights.norm.ptr, self.xn.ptr, 1, float(c.rms_norm_eps)),
            self._gemv(
                self.weights.lm_head.ptr,
                self.xn.ptr,
                GEMV_IN_PLAIN,
                0,
                0,
                0,
                self.logits.ptr,
                c.vocab_size,
                c.hidden_size,
                "head",
            ),
            Launch(
                k("argmax"),
                (1, 1, 1),
                (ARGMAX_THREADS, 1, 1),
                [("ptr", self.logits.ptr), ("i32", c.vocab_size), ("ptr", self.token.ptr)],
            ),
        ]

    def _rmsnorm(self, x: int, w: int, out: int, rows: int, eps: float) -> Launch:
        return Launch(
            self.module.kernel("rmsnorm"),
            (rows, 1, 1),
            (THREADS, 1, 1),
            [("ptr", x), ("ptr", w), ("ptr", out), ("i32", self.config.hidden_size), ("f32", eps)],
        )

    def _gemv(
        self,
        w: int,
        x: int,
        x_mode: int,
        norm_w: int,
        bias: int,
        residual: int,
        y: int,
        n_out: int,
        k_in: int,
        label: str,
        swiglu_out: bool = False,
        count_ptr: int = 0,
        fp8: Fp8Weight | None = None,
    ) -> Launch:
        """y[n_out] = in(x) @ W.T (+ bias) (+ residual) for one token; ``x_mode`` picks the input transform.

        With ``swiglu_out`` W is the fused gate|up weight and y receives silu(gate) * up (n_out / 2 values; no
        residual). Rows of one warp go to the streaming kernels (gemv_stream_bf16, gemv_stream_swiglu_bf16), rows
        shared by several warps to gemv_bf16 and gemv_swiglu_bf16. With ``count_ptr``, the streaming kernels' chain
        forms: rows 0 .. *count_ptr - 1 of x, residual and y. ``fp8``: W's e4m3 rows, which a single token's
        streaming GEMV reads instead (the same bits); the other forms read W.
        """
        split = gemv_warps_per_row(n_out, k_in)
        if swiglu_out and residual:
            raise ValueError("the SwiGLU-output GEMV takes no residual")
        outputs = [("ptr", y)] if swiglu_out else [("ptr", residual), ("ptr", y)]
        inputs = [
            ("ptr", w),
            ("ptr", x),
            ("ptr", norm_w),
            ("i32", x_mode),
            ("f32", float(self.config.rms_norm_eps)),
            ("ptr", bias),
        ]
        if split == 1:  # the same bits as gemv_bf16 with one warp per row
            chain = [("ptr", count_ptr)] if count_ptr else []
            tokens, warps = (CHAIN_TOKENS, self.chain_warps) if count_ptr else (1, GEMV_WARPS)
            layout = self.gemv_chain_layout if count_ptr else self.gemv_layout
            blocks, stages = layout[(k_in, swiglu_out)]
            slot = GSTREAM_PIECE_BYTES
            if count_ptr:
                name = chain_gemv_kernels(warps)[int(swiglu_out)]
            elif fp8 is not None:
                name = "gemv_stream_swiglu_fp8" if swiglu_out else "gemv_stream_fp8"
                blocks, stages = self.gemv_fp8_layout[(k_in, swiglu_out)]
                slot = gstream_slot_bytes(k_in, 1)
                inputs = [("ptr", fp8.codes.ptr), ("ptr", fp8.scales.ptr), *inputs[1:]]
            else:
                name = "gemv_stream_swiglu_bf16" if swiglu_out else "gemv_stream_bf16"
            return Launch(
                self.module.kernel(name),
                (min(gemv_groups(n_out, 1, swiglu_out, warps), blocks), 1, 1),
                (warps * 32, 1, 1),
                [*inputs, *outputs, ("i32", n_out), ("i32", k_in), ("i32", stages), *chain],
                shared_bytes=gemv_stream_shared(k_in, stages, tokens, warps, slot),
                label=f"gemv:{label}",
            )
        if count_ptr:
            raise ValueError(f"{k_in}-wide rows take two warps each: no chain form (see supports_chains)")
        grid = (min(gemv_groups(n_out, split, swiglu_out), GEMV_MAX_BLOCKS), 1, 1)
        return Launch(
            self.module.kernel("gemv_swiglu_bf16" if swiglu_out else "gemv_bf16"),
            grid,
            (THREADS, 1, 1),
            [*inputs, *outputs, ("i32", n_out), ("i32", k_in), ("i32", split)],
            shared_bytes=k_in * F32,
            label=f"gemv:{label}",
        )

    def _gemm(self, w: int, x: int, bias: int, residual: int, y: int, m: int, n_out: int, k_in: int) -> Launch:
        """y[m, n_out] = x[m, k_in] @ W.T (+ bias) (+ residual) for prefill: on the tensor cores (16 or 8 tokens a
        block, as many blocks as SMs; 16 by halves of K for short prefills of rows too wide for 16, or clusters that
        read each weight once where $TOOLTRIE_GEMM_CLUSTER_TOKENS asks: the same bits), or with the tiled fp32 GEMM
        for inputs they do not take."""
        args: list[tuple[str, int | float]] = [
            ("ptr", x),
            ("ptr", w),
            ("ptr", bias),
            ("ptr", residual),
            ("ptr", y),
            ("i32", m),
            ("i32", n_out),
            ("i32", k_in),
        ]
        plan = cluster_plan(m, k_in, self.gemm_cluster_tokens)
        if plan is not None:
            kernel = self.module.kernel(plan.kernel)
            key = (plan.kernel, plan.shared)
            if key not in self._max_clusters:
                probe = (1, CLUSTER_BLOCKS, 1)
                self._max_clusters[key] = kernel.max_active_clusters(probe, (THREADS, 1, 1), plan.shared)
            grid = cluster_grid(m, n_out, plan.tokens, self._max_clusters[key])
            return Launch(kernel, grid, (THREADS, 1, 1), [*args, ("i32", plan.depth)], shared_bytes=plan.shared)
        mma = gemm_mma_launch(k_in, m, n_out, self.sms, self.gemm_halves_tokens, self.gemm_rows, self.gemm_warps)
        if mma is not None:
            return Launch(self.module.kernel(mma.kernel), mma.grid, (mma.threads, 1, 1), args, shared_bytes=mma.shared)
        grid = (-(-n_out // GEMM_TILE), -(-m // GEMM_TILE), 1)
        return Launch(self.module.kernel("gemm_bf16"), grid, (THREADS, 1, 1), args)

    # -- running ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new sequence (the cache is overwritten from position 0)."""
        self.length = 0

    def _prefill_attention(self, layer: int, n: int, pos_ptr: int, pos: int) -> Launch:
        """Layer ``layer``'s attention for ``n`` tokens from position ``pos`` (or *pos_ptr); its host position is
        argument 5 in both forms."""
        c = self.config
        caches = [("ptr", self.qkv.ptr), ("ptr", self.k_cache[layer].ptr), ("ptr", self.v_cache[layer].ptr)]
        caches += [("ptr", self.attn.ptr), ("ptr", pos_ptr), ("i32", pos)]
        scale = ("f32", 1.0 / math.sqrt(c.head_dim))
        if self.prefill_attention == "attention":
            return Launch(
                self.module.kernel("attention"),
                (c.num_heads, n, 1),
                (ATTN_THREADS, 1, 1),
                [*caches, ("i32", c.num_heads), ("i32", c.num_kv_heads), ("i32", c.head_dim), scale],
                shared_bytes=self.attn_shared,
            )
        per_block = prefill_tokens_per_block(c.num_heads // c.num_kv_heads)
        return Launch(
            self.module.kernel(self.prefill_attention),
            (c.num_kv_heads, -(-n // per_block), 1),
            (ATTN_THREADS, 1, 1),
            [*caches, ("i32", n), ("i32", per_block), ("i32", c.num_heads), ("i32", c.num_kv_heads), scale],
            shared_bytes=self.prefill_attention_shared,
        )

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the sequence in chunks of ``max_prefill``; logits and argmax of the last one follow."""
        ids = np.asarray(tokens, dtype=np.int32)
        if ids.size == 0:
            raise ValueError("prefill needs at least one token")
        if self.length + ids.size > self.max_context:
            raise ValueError(f"{self.length} cached + {ids.size} new tokens exceed max_context {self.max_context}")
        for start in range(0, ids.size, self.max_prefill):
            chunk = ids[start : start + self.max_prefill]
            self.tokens.upload(chunk, self.stream)
            self._prefill_launches(chunk.size, self.length, run=True)
            self.length += chunk.size

    def _prefill_launches(self, n: int, pos: int, run: bool = False) -> list[Launch]:
        """The launches of a prefill of ``n`` tokens (from ``self.tokens``) at positions pos..pos+n-1, built once
        and kept for the next prefill of the same shape (they hold no other per-call state); with ``run``, also
        launched. A shape's first prefill launches each part as soon as it is built, so the GPU runs the first
        layers while the host builds the rest (about 1-3 ms of Python for a 28-layer model)."""
        key = (n, pos)
        launches = self._prefill_lists.get(key)
        if launches is not None:
            self._prefill_lists.move_to_end(key)
            for launch in launches if run else ():
                launch(self.stream)
            return launches
        launches = []
        for part, _ in self._build_parts(n, tokens_ptr=self.tokens.ptr, pos=pos):
            launches += part
            for launch in part if run else ():
                launch(self.stream)
        self._prefill_lists[key] = launches
        if len(self._prefill_lists) > PREFILL_LISTS_KEPT:
            self._prefill_lists.popitem(last=False)
        return launches

    def decode(self, token: int | None = None) -> None:
        """Run one token at the next position: ``token`` if given, else the previous argmax (device memory)."""
        if self.length >= self.max_context:
            raise ValueError(f"the sequence reached max_context {self.max_context}")
        if token is not None:
            self.token.upload(np.asarray([token], dtype=np.int32), self.stream)
        self.set_decode_position(self.length)
        self.launch_decode()
        self.length += 1

    def launch_decode(self) -> None:
        """Issue the decode launch list as packed (position arguments as last set)."""
        for launch in self._decode:
            launch(self.stream)

    def read_logits(self) -> np.ndarray:
        return self.logits.download(np.float32, self.config.vocab_size, self.stream)

    def read_token(self) -> int:
        token = int(self.token.download(np.int32, 1, self.stream)[0])
        if token < 0:
            raise FloatingPointError("every logit is NaN: the forward pass produced no valid token")
        return token

    @property
    def decode_launches(self) -> list[Launch]:
        """The packed decode step, in launch order (for capture into a graph)."""
        return list(self._decode)

    def decode_step_launches(self, attention: AttentionForm) -> tuple[list[Launch], list[tuple[Launch, int]]]:
        """The packed decode step's launches with another form of decode attention (the caller keeps each context
        within that form's), and the (launch, argument index) pairs that carry the host position."""
        return self._build(1, tokens_ptr=self.token.ptr, pos=0, attention=attention)

    def set_decode_position(self, position: int) -> None:
        """Set the host position argument of the packed decode step (``decode`` does this itself)."""
        for launch, index in self._decode_pos_args:
            launch.set(index, position)

    def free(self) -> None:
        """Free the model's device memory; a model whose setup failed part way frees what it had allocated."""
        persistent = getattr(self, "persistent", None)
        if persistent is not None:
            persistent.free()
        names = ("x", "xn", "qkv", "attn", "attn_partial", "attn_done", "gate_up", "act", "logits", "tokens", "token")
        buffers = [getattr(self, name, None) for name in names]
        buffers += [*getattr(self, "k_cache", ()), *getattr(self, "v_cache", ()), getattr(self, "rope", None)]
        for buf in buffers:
            if buf is not None:
                buf.free()
        weights = getattr(self, "weights", None)
        if weights is not None:
            weights.free()


def _ptr(buf: DeviceBuffer | None) -> int:
    return buf.ptr if buf is not None else 0
