// Causal attention over the KV cache, decode and prefill alike: grid (n_heads, n_tokens), token t sits at
// absolute position pos0 + t and attends to cache positions 0..pos0+t (its own k/v already written).
// fp32 arithmetic over the bf16 cache's values (kv_cache.cuh); deterministic by construction:
//   scores  one thread per position, dot product over head_dim in ascending order (float4 loads, many
//           positions in flight at once);
//   softmax fixed-tree block reductions for the max and the sum;
//   output  thread d accumulates p_j * v[j, d] over j in ascending order. V is staged through shared memory
//           in tiles of ATTN_TILE_FLOATS so that the whole block loads while one thread per dimension adds.
// Dynamic shared memory: the scores, max_ctx floats.
#pragma once
#include "common.cuh"
#include "kv_cache.cuh"

#define ATTN_THREADS 256
#define ATTN_TILE_FLOATS 8192  // 32 KiB of V per tile: 64 positions at head_dim 128, 128 at 64

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
attention(const float* __restrict__ qkv, const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
          float* __restrict__ out, const int* pos_ptr, int pos_host, int n_heads, int n_kv_heads, int head_dim,
          float scale) {
    pdl_enter();
    extern __shared__ float scores[];
    __shared__ __align__(16) float q[256];
    __shared__ __align__(16) float vtile[ATTN_TILE_FLOATS];
    __shared__ float scratch[32];
    const int h = blockIdx.x, t = blockIdx.y;
    const int length = host_or_device(pos_ptr, pos_host) + t + 1;
    const int kvh = h / (n_heads / n_kv_heads);
    const int kv_stride = n_kv_heads * head_dim;
    const int hd4 = head_dim / 4;
    const float* qrow = qkv + (size_t)t * (n_heads + 2 * n_kv_heads) * head_dim + h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q[d] = qrow[d];
    __syncthreads();

    const float4* q4 = reinterpret_cast<const float4*>(q);
    for (int j = threadIdx.x; j < length; j += blockDim.x) {
        const kv_t* krow = k_cache + (size_t)j * kv_stride + kvh * head_dim;
        float s = 0.0f;
#pragma unroll 8
        for (int i = 0; i < hd4; ++i) {
            const float4 k = kv_load4(krow, i), qq = q4[i];
            s = fmaf(qq.x, k.x, s);
            s = fmaf(qq.y, k.y, s);
            s = fmaf(qq.z, k.z, s);
            s = fmaf(qq.w, k.w, s);
        }
        scores[j] = s * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = threadIdx.x; j < length; j += blockDim.x) m = fmaxf(m, scores[j]);
    m = block_max(m, scratch);
    float l = 0.0f;
    for (int j = threadIdx.x; j < length; j += blockDim.x) {
        const float p = expf(scores[j] - m);
        scores[j] = p;
        l += p;
    }
    l = block_sum(l, scratch);  // its barriers also order the writes to scores before the reads below

    const int tile_rows = ATTN_TILE_FLOATS / head_dim;
    const int d = threadIdx.x;
    float acc = 0.0f;
    float4* vt4 = reinterpret_cast<float4*>(vtile);
    for (int j0 = 0; j0 < length; j0 += tile_rows) {
        const int rows = min(tile_rows, length - j0);
        for (int e = threadIdx.x; e < rows * hd4; e += blockDim.x) {
            const int r = e / hd4, c = e % hd4;
            vt4[e] = kv_load4(v_cache + (size_t)(j0 + r) * kv_stride + kvh * head_dim, c);
        }
        __syncthreads();
        if (d < head_dim) {
            for (int r = 0; r < rows; ++r) acc = fmaf(scores[j0 + r], vtile[r * head_dim + d], acc);
        }
        __syncthreads();  // the next tile overwrites vtile
    }
    if (d < head_dim) out[(size_t)t * n_heads * head_dim + h * head_dim + d] = acc / l;
}
