// Elementwise kernels: SwiGLU and residual add.
#pragma once
#include "common.cuh"

// gate_up holds, per token, the gate projection (inter values) followed by the up projection (inter values),
// the layout of the fused gate|up weight. out[t, i] = silu_mul(gate, up) (common.cuh).
extern "C" __global__ void swiglu(const float* __restrict__ gate_up, float* __restrict__ out, int n_tokens, int inter) {
    pdl_enter();
    const size_t total = (size_t)n_tokens * inter;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / inter, i = idx % inter;
        const float g = gate_up[t * 2 * inter + i];
        const float u = gate_up[t * 2 * inter + inter + i];
        out[idx] = silu_mul(g, u);
    }
}

// out = a + b; out may alias a or b (each element is read and written by one thread).
extern "C" __global__ void residual_add(const float* a, const float* b, float* out, int n) {
    pdl_enter();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = a[i] + b[i];
}
