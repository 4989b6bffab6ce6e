// RMSNorm over rows: out = x * rsqrt(mean(x^2) + eps) * w, one block per row.
// The sum of squares uses one fixed partition (float4 chunk e belongs to thread e % blockDim.x, chunks taken in
// ascending order, components x, y, z, w in order) and the fixed block tree; the GEMV's fused norm calls the
// same function, so both give bit-identical normalised values. Requires n % 4 == 0 (checked on the host).
#pragma once
#include "common.cuh"

// ss plus the squares of v's components in order: the sum of squares' expression wherever a row is normalised.
__device__ __forceinline__ float fma_squares(const float4 v, float ss) {
    ss = fmaf(v.x, v.x, ss);
    ss = fmaf(v.y, v.y, ss);
    ss = fmaf(v.z, v.z, ss);
    return fmaf(v.w, v.w, ss);
}

// x * inv * w for the four values of a float4 chunk and their four bf16 norm weights: the rmsnorm kernel's
// expression for each element.
__device__ __forceinline__ float4 rms_scale4(const float4 v, float inv, const uint2 w) {
    float w0, w1, w2, w3;
    bf16x2_to_float(w.x, w0, w1);
    bf16x2_to_float(w.y, w2, w3);
    return make_float4(v.x * inv * w0, v.y * inv * w1, v.z * inv * w2, v.w * inv * w3);
}

// Per-thread partial sum of squares of n4 float4 chunks, then the block total (every thread receives it). CG: load
// through L2 only (load_activation).
template <bool CG = false, int TEAM = 0>
__device__ __forceinline__ float rms_sum_of_squares(const float4* __restrict__ x4, int n4, float* scratch) {
    float ss = 0.0f;
#pragma unroll 4
    for (int e = threadIdx.x; e < n4; e += team_size<TEAM>()) {
        ss = fma_squares(load_activation<CG>(x4 + e), ss);
    }
    return block_sum<TEAM>(ss, scratch);
}

__device__ __forceinline__ float rms_inverse(float sum_of_squares, int n, float eps) {
    return rsqrtf(sum_of_squares / (float)n + eps);
}

__device__ __forceinline__ void rmsnorm_row(const float* __restrict__ xr, const bf16_t* __restrict__ w,
                                            float* __restrict__ outr, int n, float eps, float* scratch) {
    const float inv = rms_inverse(rms_sum_of_squares(reinterpret_cast<const float4*>(xr), n / 4, scratch), n, eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) outr[i] = xr[i] * inv * bf16_to_float(w[i]);
}

extern "C" __global__ void rmsnorm(const float* __restrict__ x, const bf16_t* __restrict__ w, float* __restrict__ out,
                                   int n, float eps) {
    pdl_enter();
    __shared__ float scratch[32];
    rmsnorm_row(x + (size_t)blockIdx.x * n, w, out + (size_t)blockIdx.x * n, n, eps, scratch);
}

// Row *count - 1 of x (a forced chain's last token) into out; one block.
extern "C" __global__ void rmsnorm_last(const float* __restrict__ x, const bf16_t* __restrict__ w,
                                        float* __restrict__ out, int n, float eps, const int* count) {
    pdl_enter();
    __shared__ float scratch[32];
    rmsnorm_row(x + (size_t)(*count - 1) * n, w, out, n, eps, scratch);
}
