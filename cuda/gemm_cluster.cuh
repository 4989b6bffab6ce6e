// Prefill GEMM for a request suffix (a few dozen tokens): gemm_mma16_bf16's sums bit for bit, with each weight read
// once by one cluster instead of once by every 16-token group, and streamed through shared memory.
//
// A cluster of GMMA_KSPLIT blocks takes 16 * TT tokens (zeros past M). Block q of the cluster (its rank) owns
// K-quarter q, the steps that gemm_mma's warps of quarter q walk, and stages only those columns of its tokens as hi
// and lo rows. Its warp w takes the 32-row units u = w * clusters + c + round * 8 * clusters (c: the cluster's
// index; the same unit in the four blocks) and for each runs quarter q's chain of mmas over every token tile in
// gemm_mma's order (a step's first k16 by hi then lo, then its second), from zero: the partial that gemm_mma's warp
// (half, quarter) sums. The warps write their partials to their block's shared memory; after a cluster barrier,
// block q sums tokens q, q + 4, ... of every warp's unit over the four blocks' partials in ascending quarter order
// (through distributed shared memory), adds bias and residual as gemm_mma does and stores: the same bits, whatever
// the grid. The weights stream through a ring of `depth` steps a warp (GMMC_STEP_BYTES each) by cp.async, each lane
// copying and reading only its own pieces, a slot refilled only after its values went into mmas (cp.async has no
// order against the lane's earlier loads of the same words, docs/cuda-speed-notes.md #140).
// Requires K % 32 == 0 and 2 <= depth <= GMMC_MAX_DEPTH. Dynamic shared memory: gemm_cluster_shared() (host).
#pragma once
#include "async_copy.cuh"
#include "common.cuh"
#include "gemm.cuh"

#define GMMC_UNIT_ROWS (GMMA_TILES * 8)                        // rows a warp takes at a time: 4 n8 tiles
#define GMMC_STEP_PIECES (GMMA_TILES * TT_WARP)                // 16-byte pieces of a warp's step of weights
#define GMMC_STEP_BYTES (GMMC_STEP_PIECES * 16)                // 2 KB
#define GMMC_MAX_DEPTH 8
#define GMMC_WARPS 8
#define GMMC_REDUCE_BATCH 4  // outputs a thread sums at once in the cluster reduction

// Waits until the copies of the step `depth - 1` groups back have landed (cp.async.wait_group takes a constant).
__device__ __forceinline__ void gemm_cluster_wait(int depth) {
    switch (depth) {
        case 2: cp_async_wait<1>(); break;
        case 3: cp_async_wait<2>(); break;
        case 4: cp_async_wait<3>(); break;
        case 5: cp_async_wait<4>(); break;
        case 6: cp_async_wait<5>(); break;
        case 7: cp_async_wait<6>(); break;
        default: cp_async_wait<7>(); break;
    }
}

// Token t's row `row` of a warp's partials (T rows of 32 floats): the row's 8-float group swizzled by t % 4, so
// that a warp's float2 stores of a tile (rows 2 tig .. of 8 tokens) hit distinct banks.
__device__ __forceinline__ int gemm_cluster_part(int t, int row) { return t * GMMC_UNIT_ROWS + (row ^ ((t & 3) << 3)); }

template <int TT>
__device__ __forceinline__ void gemm_mma_cluster(const float* __restrict__ A, const bf16_t* __restrict__ W,
                                                 const bf16_t* __restrict__ bias, const float* residual, float* C,
                                                 int M, int N, int K, int depth) {
    constexpr int T = 16 * TT;
    static_assert(T % GMMA_KSPLIT == 0, "the blocks split a unit's tokens evenly");
    extern __shared__ __align__(16) unsigned char gmmc_smem[];
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP, gid = lane / 4, tig = lane % 4;
    const int q = (int)cluster_rank(), clusters = (int)gridDim.y / GMMA_KSPLIT, c = (int)blockIdx.y / GMMA_KSPLIT;
    const int t0 = blockIdx.x * T;
    const int steps = K / 32, quarter_steps = (steps + GMMA_KSPLIT - 1) / GMMA_KSPLIT, first_step = q * quarter_steps;
    const int my_steps = max(0, min(quarter_steps, steps - first_step));
    const int ld = gemm_mma_stride(quarter_steps * 32);
    const int units = (N + GMMC_UNIT_ROWS - 1) / GMMC_UNIT_ROWS, per_round = GMMC_WARPS * clusters;
    const int rounds = c < units ? (units - 1 - c) / per_round + 1 : 0;  // the same in the cluster's four blocks
    bf16_t* As = reinterpret_cast<bf16_t*>(gmmc_smem);
    float* part = reinterpret_cast<float*>(gmmc_smem + (size_t)2 * T * ld * sizeof(bf16_t));  // [warp][T][32]
    uint4* slot = reinterpret_cast<uint4*>(part + GMMC_WARPS * T * GMMC_UNIT_ROWS) + warp * depth * GMMC_STEP_PIECES;
    auto unit_of = [&](int round, int w) { return w * clusters + c + round * per_round; };
    // Step g of this warp's stream: round g / my_steps, step g % my_steps of the quarter, into slot g % depth.
    const int total = rounds * my_steps;
    auto copy = [&](int g) {
        if (g < total) {
            const int round = g / my_steps, jj = g % my_steps, u = unit_of(round, warp);
            if (u < units) {
                const int row0 = u * GMMC_UNIT_ROWS + gid;
                uint4* dst = slot + (g % depth) * GMMC_STEP_PIECES + lane;
#pragma unroll
                for (int r = 0; r < GMMA_TILES; ++r) {
                    const uint4* wrow = reinterpret_cast<const uint4*>(W + (size_t)min(row0 + r * 8, N - 1) * K);
                    cp_async16(dst + r * TT_WARP, wrow + (first_step + jj) * 4 + tig);
                }
            }
        }
        cp_async_commit();  // a group a step, empty or not, so that the wait counts steps
    };
    for (int g = 0; g < depth; ++g) copy(g);  // weights only: no kernel writes them
    pdl_enter();
    gemm_mma_stage<T>(As, A + first_step * 32, t0, M, my_steps * 32, K, ld);
    const bf16_t* hi_g = As + (size_t)gid * ld + tig * 8;  // this lane's A rows of tile 0: gid (and gid + 8)
    const bf16_t* lo_g = As + (size_t)(T + gid) * ld + tig * 8;
    float* parts[GMMA_KSPLIT];  // the four blocks' partials, by quarter
#pragma unroll
    for (int r = 0; r < GMMA_KSPLIT; ++r) parts[r] = cluster_map(part, r);
    int g = 0;
    for (int round = 0; round < rounds; ++round) {
        const bool mine = unit_of(round, warp) < units;
        float acc[TT][GMMA_TILES][4] = {};
        for (int jj = 0; jj < my_steps; ++jj, ++g) {
            gemm_cluster_wait(depth);
            if (mine) {
                const uint4* s = slot + (g % depth) * GMMC_STEP_PIECES + lane;
                uint4 w[GMMA_TILES];
#pragma unroll
                for (int r = 0; r < GMMA_TILES; ++r) w[r] = s[r * TT_WARP];
                const int col = jj * 32;
#pragma unroll
                for (int tt = 0; tt < TT; ++tt) {
                    const size_t at = (size_t)tt * 16 * ld + col;
                    const uint4 h0 = *reinterpret_cast<const uint4*>(hi_g + at);
                    const uint4 l0 = *reinterpret_cast<const uint4*>(lo_g + at);
                    const uint4 h8 = *reinterpret_cast<const uint4*>(hi_g + at + 8 * ld);
                    const uint4 l8 = *reinterpret_cast<const uint4*>(lo_g + at + 8 * ld);
#pragma unroll
                    for (int r = 0; r < GMMA_TILES; ++r) gemm_mma_step(acc[tt][r], h0, h8, l0, l8, w[r]);
                }
            }
            copy(g + depth);  // the slot's values went into the mmas above: its loads are done
        }
        if (round > 0) cluster_wait();  // every block has summed the last round's partials
        if (mine) {
            float* p = part + warp * T * GMMC_UNIT_ROWS;
#pragma unroll
            for (int tt = 0; tt < TT; ++tt)
#pragma unroll
                for (int r = 0; r < GMMA_TILES; ++r)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {  // rows gid and gid + 8 of the tile
                        const int t = tt * 16 + gid + h * 8;
                        *reinterpret_cast<float2*>(p + gemm_cluster_part(t, r * 8 + tig * 2)) =
                            make_float2(acc[tt][r][2 * h], acc[tt][r][2 * h + 1]);
                    }
        }
        cluster_arrive();
        cluster_wait();
        // This block's share: tokens q, q + 4, ... of every warp's unit, a thread a row (stores of 128 bytes), four
        // outputs' loads issued before their sums.
        constexpr int share = T / GMMA_KSPLIT, items = GMMC_WARPS * share * GMMC_UNIT_ROWS;
        for (int base = threadIdx.x; base < items; base += GMMC_REDUCE_BATCH * blockDim.x) {
            float p[GMMC_REDUCE_BATCH][GMMA_KSPLIT], res[GMMC_REDUCE_BATCH];
            int col[GMMC_REDUCE_BATCH];
            size_t o[GMMC_REDUCE_BATCH];
#pragma unroll
            for (int i = 0; i < GMMC_REDUCE_BATCH; ++i) {
                const int e = base + i * blockDim.x, row = e % GMMC_UNIT_ROWS, rest = e / GMMC_UNIT_ROWS;
                const int w = rest / share, t = (rest % share) * GMMA_KSPLIT + q;
                col[i] = unit_of(round, w) * GMMC_UNIT_ROWS + row;
                o[i] = (size_t)(t0 + t) * N + col[i];
                if (e >= items || t0 + t >= M || col[i] >= N) {
                    col[i] = -1;
                    continue;
                }
                const int at = w * T * GMMC_UNIT_ROWS + gemm_cluster_part(t, row);
#pragma unroll
                for (int r = 0; r < GMMA_KSPLIT; ++r) p[i][r] = parts[r][at];
                res[i] = residual ? residual[o[i]] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < GMMC_REDUCE_BATCH; ++i) {
                if (col[i] < 0) continue;
                float v = p[i][0];
#pragma unroll
                for (int r = 1; r < GMMA_KSPLIT; ++r) v += p[i][r];
                if (bias) v += bf16_to_float(bias[col[i]]);
                if (residual) v += res[i];
                C[o[i]] = v;
            }
        }
        cluster_arrive();
    }
    if (rounds > 0) cluster_wait();  // no block leaves while the others may still read its partials
    cp_async_wait<0>();
}

// 48, 32 or 16 tokens a cluster: the host takes the fewest tiles that hold a suffix and fit shared memory.
#define GEMM_CLUSTER_PARAMS                                                                                    \
    const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias, const float* residual, \
        float* C, int M, int N, int K, int depth

extern "C" __global__ void __cluster_dims__(1, GMMA_KSPLIT, 1) __launch_bounds__(256, 1)
    gemm_mma_cluster1_bf16(GEMM_CLUSTER_PARAMS) {
    gemm_mma_cluster<1>(A, W, bias, residual, C, M, N, K, depth);
}

extern "C" __global__ void __cluster_dims__(1, GMMA_KSPLIT, 1) __launch_bounds__(256, 1)
    gemm_mma_cluster2_bf16(GEMM_CLUSTER_PARAMS) {
    gemm_mma_cluster<2>(A, W, bias, residual, C, M, N, K, depth);
}

extern "C" __global__ void __cluster_dims__(1, GMMA_KSPLIT, 1) __launch_bounds__(256, 1)
    gemm_mma_cluster3_bf16(GEMM_CLUSTER_PARAMS) {
    gemm_mma_cluster<3>(A, W, bias, residual, C, M, N, K, depth);
}
