// Decode attention (one query token per head), split over the cached positions so that a head keeps many
// SMs busy (the single-block kernel in attention.cuh serves prefill). Deterministic by construction:
//   the positions are cut into fixed chunks of ATTN_CHUNK (chunk c holds positions c*64 .. c*64+63, whatever
//   the grid), so a chunk's partial result does not depend on how many blocks run;
//   attention_split  per (head, chunk): scores with one warp per position (lanes own fixed float4 slices,
//                    butterfly sum; a warp's 8 rows are loaded before any is used), the chunk's max m and sum l
//                    of exp(s - m) by the fixed block trees, and acc[d] = sum_j p_j v[j, d] over V staged in
//                    shared memory (its loads issued with the K loads), positions dealt round-robin to thread groups, the groups added in ascending
//                    order. Writes (m, l, acc[0..head_dim)) per chunk.
//   attention_combine per head: merges the chunks in ascending order (m = max m_c, weights exp(m_c - m)).
// The position comes from device memory (graph replays) or from the host (pos_ptr null).
#pragma once
#include "common.cuh"

#define ATTN_CHUNK 64
#define ATTN_SPLIT_THREADS 256  // the kernel assumes exactly this block size
#define ATTN_SPLIT_WARPS (ATTN_SPLIT_THREADS / TT_WARP)
#define ATTN_ROWS_PER_WARP (ATTN_CHUNK / ATTN_SPLIT_WARPS)
#define ATTN_SPLIT_TILE_FLOATS 8192  // 32 KiB of V: a whole chunk at head_dim <= 128, half a chunk at 256

#define ATTN_V_PER_THREAD (ATTN_SPLIT_TILE_FLOATS / 4 / ATTN_SPLIT_THREADS)  // float4 of a V tile per thread

// Loads one V tile (rows j0 .. j0 + trows - 1 of kv head kvh) into registers: thread t holds float4 chunks
// t + u * ATTN_SPLIT_THREADS of the tile, every load issued before any is used.
__device__ __forceinline__ void attn_load_v_tile(float4 (&v)[ATTN_V_PER_THREAD], const float* __restrict__ v_cache,
                                                 int j0, int trows, int kv_stride, int kvh, int head_dim) {
    const int hd4 = head_dim / 4;
#pragma unroll
    for (int u = 0; u < ATTN_V_PER_THREAD; ++u) {
        const int e4 = threadIdx.x + u * ATTN_SPLIT_THREADS;
        if (e4 < trows * hd4) {
            const int r = e4 / hd4, col = e4 % hd4;
            v[u] = reinterpret_cast<const float4*>(v_cache + (size_t)(j0 + r) * kv_stride + kvh * head_dim)[col];
        }
    }
}

// grid (n_heads, any number of blocks); block ATTN_SPLIT_THREADS; partial holds n_heads * max_chunks records
// of head_dim + 2 floats.
extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS)
attention_split(const float* __restrict__ qkv, const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                float* __restrict__ partial, const int* pos_ptr, int pos_host, int n_heads, int n_kv_heads,
                int head_dim, float scale, int max_chunks) {
    pdl_enter();
    __shared__ __align__(16) float q[256];
    __shared__ float p[ATTN_CHUNK];
    __shared__ float red[ATTN_SPLIT_THREADS];
    __shared__ float scratch[32];
    __shared__ __align__(16) float vtile[ATTN_SPLIT_TILE_FLOATS];
    float4* vt4 = reinterpret_cast<float4*>(vtile);
    const int h = blockIdx.x;
    const int length = host_or_device(pos_ptr, pos_host) + 1;
    const int n_chunks = (length + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const int kvh = h / (n_heads / n_kv_heads);
    const int kv_stride = n_kv_heads * head_dim, hd4 = head_dim / 4;
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q[d] = qkv[h * head_dim + d];
    __syncthreads();
    const float4* q4 = reinterpret_cast<const float4*>(q);
    const int groups = blockDim.x / head_dim;  // head_dim divides 256 for 16, 32, 64, 128, 256
    const int g = threadIdx.x / head_dim, d = threadIdx.x % head_dim;
    const int tile_rows = min(ATTN_CHUNK, ATTN_SPLIT_TILE_FLOATS / head_dim);

    for (int c = blockIdx.y; c < n_chunks; c += gridDim.y) {  // uniform across the block
        const int j0 = c * ATTN_CHUNK, rows = min(ATTN_CHUNK, length - j0);
        // The first V tile is loaded into registers together with the K rows, so both HBM round trips overlap.
        float4 vreg[ATTN_V_PER_THREAD];
        attn_load_v_tile(vreg, v_cache, j0, min(tile_rows, rows), kv_stride, kvh, head_dim);
        // Scores: warp w owns rows w, w + 8, ...; every row's loads are issued before the first use.
        float s[ATTN_ROWS_PER_WARP];
#pragma unroll
        for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) s[u] = 0.0f;
        for (int i = lane; i < hd4; i += TT_WARP) {
            float4 k[ATTN_ROWS_PER_WARP];
#pragma unroll
            for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) {
                const int r = warp + u * ATTN_SPLIT_WARPS;
                k[u] = r < rows ? reinterpret_cast<const float4*>(k_cache + (size_t)(j0 + r) * kv_stride +
                                                                  kvh * head_dim)[i]
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            const float4 qq = q4[i];
#pragma unroll
            for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) {
                s[u] = fmaf(qq.x, k[u].x, s[u]);
                s[u] = fmaf(qq.y, k[u].y, s[u]);
                s[u] = fmaf(qq.z, k[u].z, s[u]);
                s[u] = fmaf(qq.w, k[u].w, s[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) {
            const int r = warp + u * ATTN_SPLIT_WARPS;
            const float total = warp_sum(s[u]);
            if (lane == 0) p[r] = r < rows ? total * scale : -INFINITY;
        }
        __syncthreads();
        const float v = threadIdx.x < ATTN_CHUNK ? p[threadIdx.x] : -INFINITY;
        const float m = block_max(v, scratch);
        const float e = threadIdx.x < rows ? expf(v - m) : 0.0f;
        if (threadIdx.x < ATTN_CHUNK) p[threadIdx.x] = e;
        const float l = block_sum(e, scratch);  // its barriers order the writes to p before the reads below

        // Output: V staged through shared memory by the whole block (all loads in flight at once); group g sums
        // rows g, g + groups, ... in ascending order, then the groups are added in ascending order.
        float acc = 0.0f;
        for (int t0 = 0; t0 < rows; t0 += tile_rows) {
            const int trows = min(tile_rows, rows - t0);
            if (t0 > 0) attn_load_v_tile(vreg, v_cache, j0 + t0, trows, kv_stride, kvh, head_dim);
#pragma unroll
            for (int u = 0; u < ATTN_V_PER_THREAD; ++u) {
                const int e4 = threadIdx.x + u * ATTN_SPLIT_THREADS;
                if (e4 < trows * hd4) vt4[e4] = vreg[u];
            }
            __syncthreads();
            if (g < groups)
                for (int r = g; r < trows; r += groups) acc = fmaf(p[t0 + r], vtile[r * head_dim + d], acc);
            __syncthreads();  // the next tile overwrites vtile
        }
        if (g < groups) red[g * head_dim + d] = acc;
        __syncthreads();
        float* rec = partial + ((size_t)h * max_chunks + c) * (head_dim + 2);
        if (threadIdx.x < head_dim) {
            float sum = red[threadIdx.x];
            for (int i = 1; i < groups; ++i) sum += red[i * head_dim + threadIdx.x];  // ascending group order
            rec[2 + threadIdx.x] = sum;
        }
        if (threadIdx.x == 0) {
            rec[0] = m;
            rec[1] = l;
        }
        __syncthreads();  // p and red are reused by the next chunk
    }
}

// grid (n_heads); block max(32, head_dim). out[h * head_dim + d] = merged attention output.
extern "C" __global__ void attention_combine(const float* __restrict__ partial, float* __restrict__ out,
                                             const int* pos_ptr, int pos_host, int head_dim, int max_chunks) {
    pdl_enter();
    const int h = blockIdx.x, d = threadIdx.x;
    if (d >= head_dim) return;
    const int length = host_or_device(pos_ptr, pos_host) + 1;
    const int n_chunks = (length + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const float* ph = partial + (size_t)h * max_chunks * (head_dim + 2);
    float m = -INFINITY;
    for (int c = 0; c < n_chunks; ++c) m = fmaxf(m, ph[c * (head_dim + 2)]);
    float l = 0.0f, acc = 0.0f;
    for (int c = 0; c < n_chunks; ++c) {
        const float* rec = ph + c * (head_dim + 2);
        const float w = expf(rec[0] - m);
        l = fmaf(rec[1], w, l);
        acc = fmaf(rec[2 + d], w, acc);
    }
    out[h * head_dim + d] = acc / l;
}
