// Greedy argmax over one row of logits: one block; each thread scans a strided slice in ascending order,
// then a fixed tree folds the (value, id) pairs. Ties go to the lower id; NaN never wins. The winner is
// written to out_token (device memory), where the next step's embedding gather can read it.
#pragma once
#include "common.cuh"

#define ARGMAX_THREADS 1024

__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax(const float* __restrict__ logits, int n, int* __restrict__ out_token) {
    pdl_enter();
    __shared__ float vals[ARGMAX_THREADS];
    __shared__ int ids[ARGMAX_THREADS];
    float best = -INFINITY;
    int best_id = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = logits[i];
        if (v > best || (best_id < 0 && v == best)) {  // strict: the first (lowest) id of a tie stays
            best = v;
            best_id = i;
        }
    }
    vals[threadIdx.x] = best;
    ids[threadIdx.x] = best_id;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float v = vals[threadIdx.x + s];
            const int i = ids[threadIdx.x + s];
            if (i >= 0 && (ids[threadIdx.x] < 0 || argmax_better(v, i, vals[threadIdx.x], ids[threadIdx.x]))) {
                vals[threadIdx.x] = v;
                ids[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out_token[0] = ids[0];  // -1 when every logit is NaN: the host treats it as an error
}
