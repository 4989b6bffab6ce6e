// Prefill GEMM: C[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n]) (+ residual[m, n]).
// A fp32 [M, K] (token rows), W bf16 [N, K], C fp32 [M, N]. Classic shared-memory tiling: a 64x64 output
// tile per block of 256 threads, each thread owning a 4x4 patch, K walked in steps of 16. Every output is
// summed by one thread in ascending k, so results are deterministic. Any M, N, K (edges are zero-filled).
#pragma once
#include "common.cuh"

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
