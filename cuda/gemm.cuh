// Prefill GEMM: C[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n]) (+ residual[m, n]).
// A fp32 [M, K] (token rows), W bf16 [N, K], C fp32 [M, N]. Classic shared-memory tiling: a 64x64 output
// tile per block of 256 threads, each thread owning a 4x4 patch, K walked in steps of 16. Every output is
// summed by one thread in ascending k, so results are deterministic. Any M, N, K (edges are zero-filled).
#pragma once
#include "common.cuh"
#include "gemv.cuh"

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 16

extern "C" __global__ void __launch_bounds__(256)
gemm_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
          const float* residual, float* C, int M, int N, int K) {
    pdl_enter();
    // Stored k-major so the inner loop reads a row of 4 consecutive m (or n) values per thread.
    __shared__ float As[GEMM_BK][GEMM_BM + 4];
    __shared__ float Ws[GEMM_BK][GEMM_BN + 4];
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    const int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {
        // 64x16 tile of each operand, 4 elements per thread.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = tid + i * 256;
            const int r = e / GEMM_BK, c = e % GEMM_BK;
            const int gm = m0 + r, gn = n0 + r, gk = k0 + c;
            As[c][r] = (gm < M && gk < K) ? A[(size_t)gm * K + gk] : 0.0f;
            Ws[c][r] = (gn < N && gk < K) ? bf16_to_float(W[(size_t)gn * K + gk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = As[kk][tm + i];
                b[i] = Ws[kk][tn + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int gm = m0 + tm + i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int gn = n0 + tn + j;
            if (gn >= N) continue;
            float v = acc[i][j];
            if (bias) v += bf16_to_float(bias[gn]);
            const size_t o = (size_t)gm * N + gn;
            if (residual) v += residual[o];
            C[o] = v;
        }
    }
}

// Prefill of a few tokens (the request suffix after a cached catalog prefix): C[m, n] as gemm_bf16 computes
// it, but shaped like the decode GEMV, which streams the weights once for up to GEMM_SKINNY_T tokens instead of
// walking 64x64 tiles. Block (tg, rb): tokens tg*T .. tg*T+T-1 staged in shared memory (zeros past M), row groups
// rb, rb + gridDim.y, ... of 8 rows, one warp per row; lane l reads 16-byte chunks l, l + 32, ... in ascending
// order into T fp32 accumulators (gemv_fma_chunk's order), then each token's warp butterfly. A row's result
// depends neither on the grid nor on the other tokens of its group. Dynamic shared memory T * K * 4 bytes.
#define GEMM_SKINNY_T 8

// A row's first SKINNY_PREFETCH chunks for lane l (chunks l + 32 i), loaded through the cache (the other token
// groups' blocks read the same rows), ahead of their use. Half the decode GEMV's depth: the block also holds the
// next row's and a batch past these in registers, at two blocks per SM.
#define SKINNY_PREFETCH 4
struct SkinnyPrefetch {
    uint4 w[SKINNY_PREFETCH];
};

__device__ __forceinline__ SkinnyPrefetch skinny_prefetch(const uint4* __restrict__ wrow, int chunks, int lane) {
    SkinnyPrefetch pf;
#pragma unroll
    for (int i = 0; i < SKINNY_PREFETCH; ++i) {
        const int c = lane + i * TT_WARP;
        pf.w[i] = c < chunks ? __ldg(wrow + c) : make_uint4(0u, 0u, 0u, 0u);
    }
    return pf;
}

// acc[t] += the row's products with token t's staged input over the lane's chunks l, l + 32, ... in ascending
// order (gemv_fma_chunk's order, as gemv_row_dot_from): the prefetched chunks, then batches of GEMV_BATCH, each
// batch requested before the one ahead of it is used.
__device__ __forceinline__ void skinny_row_dot(float (&acc)[GEMM_SKINNY_T], const SkinnyPrefetch& pf,
                                               const uint4* __restrict__ wrow, const float4* __restrict__ xs4_t,
                                               int k4, int chunks, int lane) {
    gemv_batched_chunks<false>(pf.w, wrow, lane, TT_WARP, chunks, [&](int ci, const uint4& w) {
#pragma unroll
        for (int t = 0; t < GEMM_SKINNY_T; ++t)
            acc[t] = gemv_fma_chunk(acc[t], w, xs4_t[t * k4 + 2 * ci], xs4_t[t * k4 + 2 * ci + 1]);
    });
}

// The block's first row's weights are requested before the wait, and each next row's while the current one is
// reduced, as in the decode GEMV, so the weight stream is not one dependent round trip after another.
#ifndef SKINNY_MIN_BLOCKS
#define SKINNY_MIN_BLOCKS 2  // resident blocks per SM asked of ptxas (it then keeps to 128 registers)
#endif
extern "C" __global__ void __launch_bounds__(256, SKINNY_MIN_BLOCKS)
gemm_skinny_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                 const float* residual, float* C, int M, int N, int K) {
    extern __shared__ float4 xs4_t[];
    const int k4 = K / 4, t0 = blockIdx.x * GEMM_SKINNY_T, nt = min(GEMM_SKINNY_T, M - t0);
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP, chunks = K / 8;
    const int groups = (N + GEMV_WARPS - 1) / GEMV_WARPS;
    int g = blockIdx.y, n = g * GEMV_WARPS + warp;
    SkinnyPrefetch pf =
        skinny_prefetch(reinterpret_cast<const uint4*>(W + (size_t)min(n, N - 1) * K), n < N ? chunks : 0, lane);
    pdl_enter();  // only weights were read so far
    const float4* a4 = reinterpret_cast<const float4*>(A + (size_t)t0 * K);
    for (int e = threadIdx.x; e < GEMM_SKINNY_T * k4; e += blockDim.x)
        xs4_t[e] = e < nt * k4 ? a4[e] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();
    for (; g < groups; g += gridDim.y) {  // no barrier inside: warps whose row is past N skip the work
        const int n_next = (g + gridDim.y) * GEMV_WARPS + warp;
        const SkinnyPrefetch pf_next =
            skinny_prefetch(reinterpret_cast<const uint4*>(W + (size_t)min(n_next, N - 1) * K), n_next < N ? chunks : 0,
                            lane);
        if (n < N) {
            const uint4* wrow = reinterpret_cast<const uint4*>(W + (size_t)n * K);
            float acc[GEMM_SKINNY_T];
#pragma unroll
            for (int t = 0; t < GEMM_SKINNY_T; ++t) acc[t] = 0.0f;
            skinny_row_dot(acc, pf, wrow, xs4_t, k4, chunks, lane);
#pragma unroll
            for (int t = 0; t < GEMM_SKINNY_T; ++t) {
                const float sum = warp_sum(acc[t]);
                if (lane == 0 && t < nt) {
                    float out = sum;
                    if (bias) out += bf16_to_float(bias[n]);
                    const size_t o = (size_t)(t0 + t) * N + n;
                    if (residual) out += residual[o];
                    C[o] = out;
                }
            }
        }
        pf = pf_next;
        n = n_next;
    }
}
