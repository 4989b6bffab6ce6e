// Decode GEMV: y[t, n] = sum_k W[n, k] * in[t, k] (+ bias[n]) (+ residual[t, n]).
// W is bf16 [N, K] row-major (Hugging Face's [out_features, in_features]); activations are fp32.
//
// Each block first stages its input row in shared memory (K floats, dynamic), applying the input transform
// once per block rather than once per warp:
//   GEMV_IN_PLAIN    in = x[t, :K]
//   GEMV_IN_RMSNORM  in = rmsnorm(x[t, :K]) * norm_w, with the rmsnorm kernel's partition, tree and expression,
//                    so the values are bit-identical to running that kernel first
//   GEMV_IN_SWIGLU   in = silu(x[t, :K]) * x[t, K:2K] (the fused gate|up output), as the swiglu kernel computes it
// Then a row belongs to `warps_per_row` warps of the block (1, 2, 4 or 8; the host picks it from the shape
// alone, so a given matrix is always reduced the same way). Lane l of part p reads 16-byte weight chunks
// (8 bf16) p*32 + l, then every 32*warps_per_row chunks, accumulating in fp32 in ascending order; each warp
// folds its lanes with a fixed butterfly, and the parts are added in ascending order. No atomics.
// Requires K % 8 == 0 (16-byte rows), checked on the host.
#pragma once
#include "common.cuh"
#include "rmsnorm.cuh"

#define GEMV_WARPS 8  // warps per block of 256 threads
#define GEMV_IN_PLAIN 0
#define GEMV_IN_RMSNORM 1
#define GEMV_IN_SWIGLU 2

__device__ __forceinline__ float gemv_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Writes the transformed input row to xs (K floats) and synchronises the block.
__device__ __forceinline__ void gemv_stage_input(float4* __restrict__ xs4, const float* __restrict__ xt,
                                                 const bf16_t* __restrict__ norm_w, int x_mode, float eps, int K,
                                                 float* scratch) {
    const float4* x4 = reinterpret_cast<const float4*>(xt);
    const int k4 = K / 4;
    if (x_mode == GEMV_IN_SWIGLU) {
        for (int e = threadIdx.x; e < k4; e += blockDim.x) {
            const float4 g = x4[e], u = x4[k4 + e];
            xs4[e] = make_float4(gemv_silu_mul(g.x, u.x), gemv_silu_mul(g.y, u.y), gemv_silu_mul(g.z, u.z),
                                 gemv_silu_mul(g.w, u.w));
        }
    } else if (x_mode == GEMV_IN_RMSNORM) {
        const float inv = rms_inverse(rms_sum_of_squares(x4, k4, scratch), K, eps);
        for (int i = threadIdx.x; i < K; i += blockDim.x)
            reinterpret_cast<float*>(xs4)[i] = xt[i] * inv * bf16_to_float(norm_w[i]);
    } else {
        for (int e = threadIdx.x; e < k4; e += blockDim.x) xs4[e] = x4[e];
    }
    __syncthreads();
}

// One row's dot product with the staged input: lane l of part p reads 16-byte chunks p*32 + l, then every
// 32*warps_per_row chunks, in ascending order; the warp folds its lanes with the fixed butterfly. The dense
// GEMV and the sparse head both call this, so a row's logit is the same bits under either head.
__device__ __forceinline__ float gemv_row_dot(const uint4* __restrict__ wrow, const float4* __restrict__ xs4, int K,
                                              int part, int lane, int warps_per_row) {
    float acc = 0.0f;
    const int chunks = K / 8, step = warps_per_row * TT_WARP;
#pragma unroll 4
    for (int c = part * TT_WARP + lane; c < chunks; c += step) {
        const uint4 w = __ldcs(wrow + c);  // weights are read once per step: stream them past L1
        const float4 xa = xs4[2 * c], xb = xs4[2 * c + 1];
        float w0, w1, w2, w3, w4, w5, w6, w7;
        bf16x2_to_float(w.x, w0, w1);
        bf16x2_to_float(w.y, w2, w3);
        bf16x2_to_float(w.z, w4, w5);
        bf16x2_to_float(w.w, w6, w7);
        acc = fmaf(w0, xa.x, acc);
        acc = fmaf(w1, xa.y, acc);
        acc = fmaf(w2, xa.z, acc);
        acc = fmaf(w3, xa.w, acc);
        acc = fmaf(w4, xb.x, acc);
        acc = fmaf(w5, xb.y, acc);
        acc = fmaf(w6, xb.z, acc);
        acc = fmaf(w7, xb.w, acc);
    }
    return warp_sum(acc);
}

// Row t of x starts at t * K (t * 2K for GEMV_IN_SWIGLU); norm_w and eps serve GEMV_IN_RMSNORM only.
// residual may alias y. Grid (ceil(N / (8 / warps_per_row)), n_tokens); dynamic shared memory K * 4 bytes.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * TT_WARP)
gemv_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w, int x_mode,
          float eps, const bf16_t* __restrict__ bias, const float* residual, float* y, int N, int K,
          int warps_per_row) {
    extern __shared__ float4 xs4[];
    __shared__ float scratch[32];
    __shared__ float parts[GEMV_WARPS];
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    const int part = warp % warps_per_row;
    const int n = blockIdx.x * (GEMV_WARPS / warps_per_row) + warp / warps_per_row;
    const int t = blockIdx.y;
    gemv_stage_input(xs4, x + (size_t)t * K * (x_mode == GEMV_IN_SWIGLU ? 2 : 1), norm_w, x_mode, eps, K, scratch);

    float acc = 0.0f;
    if (n < N) acc = gemv_row_dot(reinterpret_cast<const uint4*>(W + (size_t)n * K), xs4, K, part, lane, warps_per_row);
    if (warps_per_row > 1) {  // uniform across the block
        if (lane == 0) parts[warp] = acc;
        __syncthreads();
        if (part == 0 && lane == 0)
            for (int p = 1; p < warps_per_row; ++p) acc += parts[warp + p];  // ascending part order
    }
    if (n < N && part == 0 && lane == 0) {
        if (bias) acc += bf16_to_float(bias[n]);
        const size_t o = (size_t)t * N + n;
        if (residual) acc += residual[o];
        y[o] = acc;
    }
}
