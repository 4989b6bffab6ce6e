"""Launch shapes of the cluster prefill GEMM (cuda/gemm_cluster.cuh): gemm_mma16_bf16's bits for a request suffix,
each weight read once by a cluster of four blocks (one a K-quarter) that holds up to 48 tokens."""

from __future__ import annotations

from dataclasses import dataclass

from decoder_service.engines.cuda.module import MAX_SHARED_PER_BLOCK
from decoder_service.engines.env import env_int

F32 = 4
CLUSTER_BLOCKS = 4  # GMMA_KSPLIT: a block a K-quarter
CLUSTER_TILES = (3, 2, 1)  # 16-token tiles of gemm_mma_cluster{3,2,1}_bf16, the most first
UNIT_ROWS = 32  # a warp's rows at a time (GMMC_UNIT_ROWS)
WARPS = 8
STEP_BYTES = 2048  # a warp's step of weights in the ring (GMMC_STEP_BYTES)
MIN_DEPTH, MAX_DEPTH = 4, 8  # ring steps a warp: fewer leave the stream short of bytes in flight
# Prefills of at most this many tokens take the cluster GEMM (more: gemm_mma16_bf16 / gemm_mma8_bf16, the same
# bits); $TOOLTRIE_GEMM_CLUSTER_TOKENS sets it. Off (0): on an H100 and an H200 it was slower than those kernels but
# on the down rows of a 36-token suffix (docs/cuda-speed-notes.md #141).
CLUSTER_MAX_TOKENS = 0
CLUSTER_TOKENS_ENV = "TOOLTRIE_GEMM_CLUSTER_TOKENS"


@dataclass(frozen=True)
class ClusterPlan:
    """One cluster GEMM launch's kernel, tokens a cluster, ring depth and dynamic shared memory."""

    kernel: str
    tokens: int
    depth: int
    shared: int


def gemm_mma_stride(cols: int) -> int:
    """Row stride (bf16) of ``cols`` staged columns of a tensor-core GEMM's tokens (gemm_mma_stride in
    cuda/gemm.cuh): 32 more than a multiple of 64, so the two rows a quarter warp reads fall in different banks."""
    return cols + (96 - cols % 64) % 64


def quarter_stride(k_in: int) -> int:
    """Row stride (bf16) of a block's staged quarter: gemm_mma_stride of the quarter's columns."""
    return gemm_mma_stride(-(-(k_in // 32) // CLUSTER_BLOCKS) * 32)


def cluster_shared(tiles: int, k_in: int, depth: int) -> int:
    """A block's dynamic shared memory: its tokens' hi and lo rows of one K-quarter, the warps' partials, the ring."""
    tokens = 16 * tiles
    return 2 * tokens * quarter_stride(k_in) * 2 + WARPS * tokens * UNIT_ROWS * F32 + WARPS * depth * STEP_BYTES


def cluster_max_tokens() -> int:
    return env_int(CLUSTER_TOKENS_ENV, CLUSTER_MAX_TOKENS, 0, 1 << 20)


def cluster_plan_tiles(tiles: int, k_in: int) -> ClusterPlan | None:
    """gemm_mma_cluster{tiles}_bf16 for inputs k_in wide with the deepest ring that fits beside its rows and
    partials; None where not even MIN_DEPTH steps fit, or K is not a multiple of 32."""
    if k_in % 32 or tiles not in CLUSTER_TILES:
        return None
    depth = min(MAX_DEPTH, (MAX_SHARED_PER_BLOCK - cluster_shared(tiles, k_in, 0)) // (WARPS * STEP_BYTES))
    if depth < MIN_DEPTH:
        return None
    return ClusterPlan(f"gemm_mma_cluster{tiles}_bf16", 16 * tiles, depth, cluster_shared(tiles, k_in, depth))


def cluster_plan(m: int, k_in: int, max_tokens: int | None = None) -> ClusterPlan | None:
    """The cluster GEMM for m tokens of inputs k_in wide: the fewest tiles that hold them, fewer where they do not
    fit; None past ``max_tokens`` (default: cluster_max_tokens())."""
    limit = cluster_max_tokens() if max_tokens is None else max_tokens
    if not 1 <= m <= limit:
        return None
    wanted = min(CLUSTER_TILES[0], -(-m // 16))
    plans = (cluster_plan_tiles(t, k_in) for t in CLUSTER_TILES if t <= wanted)
    return next((p for p in plans if p is not None), None)


def cluster_grid(m: int, n_out: int, tokens: int, max_clusters: int) -> tuple[int, int, int]:
    """(token groups, blocks of whole clusters, 1): as many clusters as fit the GPU at once, shared by the token
    groups, and no more than the 32-row units (the bits do not depend on the grid)."""
    token_groups = -(-m // tokens)
    units = -(-n_out // UNIT_ROWS)
    clusters = max(1, min(units, max_clusters // token_groups))
    return (token_groups, clusters * CLUSTER_BLOCKS, 1)
