// Decode GEMV with the weights streamed into shared memory by the copy unit (cp.async.bulk): the rows, sums and bits
// of gemv_bf16 (and gemv_swiglu_bf16) with one warp per row, but a weight passes through no register until it is
// used, so each warp keeps several row pieces in flight at little register cost.
//
// Why: at batch 1 each launch starts with its weight stream cold, and what a block has in flight before it may read
// its input decides how much of the launch boundary the stream hides. Warp w of a block reduces rows g * 8 + w of
// the block's row groups g; it cuts each row into pieces of up to GSTREAM_TILE_K columns (4 KB) and keeps a ring of
// `stages` pieces in shared memory. Its lane 0 fills the ring before the kernel waits for the one before (weights
// are never written by a kernel), and refills each slot with the piece `stages` ahead as soon as the warp has
// reduced it. Warps never wait for each other after staging the input.
//
// The arithmetic: lane l takes a piece's 16-byte chunks l, l + 32, ..., so across a row's pieces it visits chunks
// l, l + 32, l + 64, ... in ascending order, as gemv_bf16's lane does with one warp per row; the warp folds with the
// same butterfly, and the writer adds bias and residual (or takes silu_mul of the gate and up rows) as gemv_bf16
// (gemv_swiglu_bf16) does. Block b owns row groups b, b + gridDim.x, ... of the G groups of 8 output rows, as
// gemv_bf16's blocks do; any grid up to G covers every row once, and the grid changes no result.
// Requires K % 8 == 0, as gemv_bf16. Dynamic shared memory: stages * GSTREAM_TILE_BYTES + K * 4 bytes.
#pragma once
#include "async_copy.cuh"
#include "common.cuh"
#include "gemv.cuh"

#define GSTREAM_TILE_K 2048  // columns of a row piece (a multiple of 256, so a lane's chunks stay in order)
#define GSTREAM_TILE_BYTES (GEMV_WARPS * GSTREAM_TILE_K * 2)  // one piece per warp: the shared memory of a stage
#define GSTREAM_MAX_STAGES 6
#define GSTREAM_THREADS (GEMV_WARPS * TT_WARP)

// Which piece of which row a warp streams next: its rows are g * 8 + warp for the block's groups g, in order; a
// SwiGLU group's gate row comes before its up row; a row's pieces go left to right.
struct GstreamCursor {
    int g, p, kt;
    __device__ __forceinline__ void advance(int k_tiles, int passes) {
        if (++kt == k_tiles) {
            kt = 0;
            if (++p == passes) {
                p = 0;
                g += gridDim.x;
            }
        }
    }
};

template <bool SWIGLU>
__device__ __forceinline__ void gemv_stream(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                            const bf16_t* __restrict__ norm_w, int x_mode, float eps,
                                            const bf16_t* __restrict__ bias, const float* residual, float* y, int N,
                                            int K, int stages) {
    extern __shared__ __align__(16) unsigned char gstream_smem[];
    __shared__ __align__(8) uint64_t full[GEMV_WARPS][GSTREAM_MAX_STAGES];
    __shared__ float scratch[32];
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    const int t = blockIdx.y;
    const int out_rows = SWIGLU ? N / 2 : N;
    const int k_tiles = (K + GSTREAM_TILE_K - 1) / GSTREAM_TILE_K;
    constexpr int passes = SWIGLU ? 2 : 1;  // a group's gate row, then its up row
    stages = max(1, min(stages, GSTREAM_MAX_STAGES));  // the host sizes shared memory for its own value
    // This warp's groups: blockIdx.x, then every gridDim.x-th, up to the last that holds its row (the last group
    // may have fewer than 8 rows). At any moment the blocks read neighbouring groups, so the weight stream stays
    // spread over the whole memory rather than over as many distant regions as there are blocks.
    const int warp_groups = (out_rows - warp + GEMV_WARPS - 1) / GEMV_WARPS;
    const int my_groups = blockIdx.x < warp_groups ? (warp_groups - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int pieces = my_groups * passes * k_tiles;
    unsigned char* ring = gstream_smem + (size_t)warp * stages * (GSTREAM_TILE_K * 2);

    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(&full[warp][s], 1);  // the issuing arrival, plus the bytes
        mbar_init_fence();
    }
    __syncwarp();
    const uint64_t policy = l2_evict_first_policy();  // weights are read once per step
    GstreamCursor next{(int)blockIdx.x, 0, 0};
    auto issue = [&](int slot) {  // lane 0: the next piece into the slot
        const int row = next.p * (N / 2) + next.g * GEMV_WARPS + warp;
        const int col = next.kt * GSTREAM_TILE_K, width = min(GSTREAM_TILE_K, K - col);
        mbar_arrive_expect_tx(&full[warp][slot], (uint32_t)(width * 2));
        bulk_copy_to_shared(ring + slot * (GSTREAM_TILE_K * 2), W + (size_t)row * K + col, width * 2,
                            &full[warp][slot], policy);
        next.advance(k_tiles, passes);
    };
    // Only weights so far, which no kernel writes: the ring fills while the kernel before still runs.
    if (lane == 0)
        for (int s = 0; s < min(stages, pieces); ++s) issue(s);
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4);  // gemv_bf16's probes
    pdl_enter();
    // The writer's residual of its first row travels with the input's loads; each later row's comes while the row
    // before is reduced. A warp owns its rows, so a residual that aliases y is read before this warp writes it.
    const bool writer = lane == 0;
    auto residual_of = [&](int g) {
        return !SWIGLU && writer && residual && g < warp_groups ? residual[(size_t)t * N + g * GEMV_WARPS + warp]
                                                                : 0.0f;
    };
    float res = residual_of(blockIdx.x);

    float4* xs4 = reinterpret_cast<float4*>(gstream_smem + (size_t)stages * GSTREAM_TILE_BYTES);
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 1);
    gemv_stage_input<true>(xs4, x + (size_t)t * K, norm_w, x_mode, eps, K, scratch);
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 2);
    const float4* xa = xs4;  // inputs 8c .. 8c + 3 of chunk c
    const float4* xb = xs4 + K / 8;  // inputs 8c + 4 .. 8c + 7
    int i = 0, s = 0;
    uint32_t phase = 0;
    for (int g = blockIdx.x; g < warp_groups; g += gridDim.x) {
        const int j = g * GEMV_WARPS + warp;  // this warp's output row
        // the writer's bias and the next row's residual are in flight while the row is reduced
        const float res_next = residual_of(g + gridDim.x);
        float bias_p[passes];
#pragma unroll
        for (int p = 0; p < passes; ++p) bias_p[p] = writer && bias ? bf16_to_float(bias[p * (N / 2) + j]) : 0.0f;
        float sums[passes];
#pragma unroll
        for (int p = 0; p < passes; ++p) {
            float acc = 0.0f;
            for (int kt = 0; kt < k_tiles; ++kt, ++i) {
                mbar_wait(&full[warp][s], phase);
                const uint4* wt = reinterpret_cast<const uint4*>(ring + s * (GSTREAM_TILE_K * 2));
                const int chunks = min(GSTREAM_TILE_K, K - kt * GSTREAM_TILE_K) / 8;
                const int base = kt * (GSTREAM_TILE_K / 8);
#pragma unroll 8
                for (int c = lane; c < chunks; c += TT_WARP)
                    acc = gemv_fma_chunk(acc, wt[c], xa[base + c], xb[base + c]);
                __syncwarp();  // every lane has read the slot
                if (lane == 0 && i + stages < pieces) {
                    fence_proxy_async_shared();  // those reads come before the copy unit's write
                    issue(s);
                }
                if (++s == stages) {
                    s = 0;
                    phase ^= 1;
                }
            }
            sums[p] = warp_sum(acc);
        }
        if (writer) {
            float acc = sums[0];
            if constexpr (SWIGLU) {
                float up = sums[1];
                if (bias) {
                    acc += bias_p[0];
                    up += bias_p[1];
                }
                y[(size_t)t * (N / 2) + j] = silu_mul(acc, up);
            } else {
                if (bias) acc += bias_p[0];
                if (residual) acc += res;
                y[(size_t)t * N + j] = acc;
            }
        }
        res = res_next;
    }
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 3);
}

// y = in(x) @ W.T (+ bias) (+ residual), as gemv_bf16 with one warp per row. residual may alias y.
extern "C" __global__ void __launch_bounds__(GSTREAM_THREADS)
gemv_stream_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w,
                 int x_mode, float eps, const bf16_t* __restrict__ bias, const float* residual, float* y, int N, int K,
                 int stages) {
    gemv_stream<false>(W, x, norm_w, x_mode, eps, bias, residual, y, N, K, stages);
}

// y[j] = silu_mul(row j, row N / 2 + j) of the fused gate|up weight, as gemv_swiglu_bf16 with one warp per row.
extern "C" __global__ void __launch_bounds__(GSTREAM_THREADS)
gemv_stream_swiglu_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w,
                        int x_mode, float eps, const bf16_t* __restrict__ bias, float* y, int N, int K, int stages) {
    gemv_stream<true>(W, x, norm_w, x_mode, eps, bias, nullptr, y, N, K, stages);
}
