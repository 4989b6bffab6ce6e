// Decode attention (one query token), one launch per layer: q/k norm and rotary embedding of the new token,
// its K/V cache write, attention split over the cached positions so that a head keeps many SMs busy, and the
// merge of the splits. (The single-block kernel in attention.cuh serves prefill.) Deterministic by construction:
//   the positions are cut into fixed chunks of ATTN_CHUNK (chunk c holds positions c*64 .. c*64+63, whatever
//   the grid), so a chunk's partial result does not depend on how many blocks run;
//   per (head, chunk): scores with one warp per position (lanes own fixed float4 slices, butterfly sum; a warp's
//   8 rows are loaded before any is used, together with the chunk's V), the chunk's max m and sum l of
//   exp(s - m) by the fixed block trees, and acc[d] = sum_j p_j v[j, d] over V staged in shared memory,
//   positions dealt round-robin to thread groups, the groups added in ascending order; (m, l, acc) go to
//   `partial`;
//   the block that finishes a head last (a counter per head) merges its chunks in ascending order
//   (m = max m_c, weights exp(m_c - m)) into out, and resets the counter. Which block merges changes nothing.
// The new token's k and v (row pos) are computed by every block whose chunk holds pos, with head_norm_rope
// (the prefill kernel's function), and used from shared memory; the first q head of each kv group writes them
// to the caches. The position comes from device memory (graph replays) or from the host (pos_ptr null).
#pragma once
#include "common.cuh"
#include "rope.cuh"

#define ATTN_CHUNK 64
#define ATTN_SPLIT_THREADS 256  // the kernel assumes exactly this block size
#define ATTN_SPLIT_WARPS (ATTN_SPLIT_THREADS / TT_WARP)
#define ATTN_ROWS_PER_WARP (ATTN_CHUNK / ATTN_SPLIT_WARPS)
#define ATTN_SPLIT_TILE_FLOATS 8192  // 32 KiB of V: a whole chunk at head_dim <= 128, half a chunk at 256

#define ATTN_V_PER_THREAD (ATTN_SPLIT_TILE_FLOATS / 4 / ATTN_SPLIT_THREADS)  // float4 of a V tile per thread

// Loads one V tile (rows j0 .. j0 + trows - 1 of kv head kvh) into registers: thread t holds float4 chunks
// t + u * ATTN_SPLIT_THREADS of the tile, every load issued before any is used. Row `pos` (the new token, not
// yet in the cache) comes from vnew.
__device__ __forceinline__ void attn_load_v_tile(float4 (&v)[ATTN_V_PER_THREAD], const float* __restrict__ v_cache,
                                                 const float4* vnew4, int pos, int j0, int trows, int kv_stride,
                                                 int kvh, int head_dim) {
    const int hd4 = head_dim / 4;
#pragma unroll
    for (int u = 0; u < ATTN_V_PER_THREAD; ++u) {
        const int e4 = threadIdx.x + u * ATTN_SPLIT_THREADS;
        if (e4 < trows * hd4) {
            const int r = e4 / hd4, col = e4 % hd4;
            v[u] = j0 + r == pos ? vnew4[col]
                                 : reinterpret_cast<const float4*>(v_cache + (size_t)(j0 + r) * kv_stride +
                                                                   kvh * head_dim)[col];
        }
    }
}

// grid (n_heads, any number of blocks); block ATTN_SPLIT_THREADS. partial holds n_heads * max_chunks records of
// head_dim + 2 floats; done holds n_heads zeroed counters (left zeroed). qkv is the new token's raw q|k|v.
extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS)
attention_decode(const float* __restrict__ qkv, const bf16_t* __restrict__ q_norm, const bf16_t* __restrict__ k_norm,
                 float* __restrict__ k_cache, float* __restrict__ v_cache, float* __restrict__ partial,
                 float* __restrict__ out, int* __restrict__ done, const int* pos_ptr, int pos_host, int n_heads,
                 int n_kv_heads, int head_dim, float scale, float theta, float eps, int max_chunks) {
    pdl_enter();
    __shared__ __align__(16) float q[256];
    __shared__ __align__(16) float knew[256];
    __shared__ __align__(16) float vnew[256];
    __shared__ float rope_scratch[256];
    __shared__ float p[ATTN_CHUNK];
    __shared__ float red[ATTN_SPLIT_THREADS];
    __shared__ float scratch[32];
    __shared__ int merge;
    __shared__ __align__(16) float vtile[ATTN_SPLIT_TILE_FLOATS];
    float4* vt4 = reinterpret_cast<float4*>(vtile);
    const int h = blockIdx.x;
    const int pos = host_or_device(pos_ptr, pos_host), length = pos + 1;
    const int n_chunks = (length + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const int group_size = n_heads / n_kv_heads, kvh = h / group_size;
    const int q_width = n_heads * head_dim, kv_stride = n_kv_heads * head_dim, hd4 = head_dim / 4;
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;

    // The first chunk's K and V rows are requested into L2 before the rotary work, so their HBM round trip
    // overlaps it (a prefetch holds no registers; the loads below then hit L2).
    if (blockIdx.y < n_chunks) {
        const int j0 = blockIdx.y * ATTN_CHUNK, rows = min(ATTN_CHUNK, length - j0);
        const int lines = max(1, head_dim / 32);  // 128-byte lines per row of one kv head
        for (int e = threadIdx.x; e < 2 * rows * lines; e += blockDim.x) {
            const int r = (e / lines) % rows, line = e % lines;
            const float* base = e < rows * lines ? k_cache : v_cache;
            const float* at = base + (size_t)(j0 + r) * kv_stride + kvh * head_dim + line * 32;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
        }
    }

    const float qd = head_norm_rope(qkv + h * head_dim, q_norm, pos, head_dim, theta, eps, rope_scratch, scratch);
    if (threadIdx.x < head_dim) q[threadIdx.x] = qd;
    const int last_chunk = pos / ATTN_CHUNK;
    if (last_chunk % gridDim.y == blockIdx.y) {  // uniform across the block: this block scores row pos
        const float kd =
            head_norm_rope(qkv + q_width + kvh * head_dim, k_norm, pos, head_dim, theta, eps, rope_scratch, scratch);
        if (threadIdx.x < head_dim) {
            const float vd = qkv[q_width + kv_stride + kvh * head_dim + threadIdx.x];
            knew[threadIdx.x] = kd;
            vnew[threadIdx.x] = vd;
            if (h % group_size == 0) {  // one writer per kv head
                const size_t c = (size_t)pos * kv_stride + kvh * head_dim + threadIdx.x;
                k_cache[c] = kd;
                v_cache[c] = vd;
            }
        }
    }
    __syncthreads();
    const float4* q4 = reinterpret_cast<const float4*>(q);
    const float4* knew4 = reinterpret_cast<const float4*>(knew);
    const float4* vnew4 = reinterpret_cast<const float4*>(vnew);
    const int groups = blockDim.x / head_dim;  // head_dim divides 256 for 16, 32, 64, 128, 256
    const int g = threadIdx.x / head_dim, d = threadIdx.x % head_dim;
    const int tile_rows = min(ATTN_CHUNK, ATTN_SPLIT_TILE_FLOATS / head_dim);

    for (int c = blockIdx.y; c < n_chunks; c += gridDim.y) {  // uniform across the block
        const int j0 = c * ATTN_CHUNK, rows = min(ATTN_CHUNK, length - j0);
        // The first V tile is loaded into registers together with the K rows, so both HBM round trips overlap.
        float4 vreg[ATTN_V_PER_THREAD];
        attn_load_v_tile(vreg, v_cache, vnew4, pos, j0, min(tile_rows, rows), kv_stride, kvh, head_dim);
        // Scores: warp w owns rows w, w + 8, ...; every row's loads are issued before the first use.
        float s[ATTN_ROWS_PER_WARP];
#pragma unroll
        for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) s[u] = 0.0f;
        for (int i = lane; i < hd4; i += TT_WARP) {
            float4 k[ATTN_ROWS_PER_WARP];
#pragma unroll
            for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) {
                const int r = warp + u * ATTN_SPLIT_WARPS;
                k[u] = r >= rows      ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                       : j0 + r == pos ? knew4[i]
                                       : reinterpret_cast<const float4*>(k_cache + (size_t)(j0 + r) * kv_stride +
                                                                         kvh * head_dim)[i];
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

        // Output: V staged through shared memory by the whole block; group g sums rows g, g + groups, ... in
        // ascending order, then the groups are added in ascending order.
        float acc = 0.0f;
        for (int t0 = 0; t0 < rows; t0 += tile_rows) {
            const int trows = min(tile_rows, rows - t0);
            if (t0 > 0) attn_load_v_tile(vreg, v_cache, vnew4, pos, j0 + t0, trows, kv_stride, kvh, head_dim);
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

    // The last of the head's blocks to get here merges its chunks (the others' records are visible to it: each
    // block fences its writes before it counts itself in).
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) merge = atomicAdd(done + h, 1) == (int)gridDim.y - 1;
    __syncthreads();
    if (!merge) return;
    __threadfence();
    // Every chunk's (m, l) in one round of loads into shared memory (vtile is free now), then each output
    // element's chunk values in batches; the merge arithmetic runs in ascending chunk order.
    const float* ph = partial + (size_t)h * max_chunks * (head_dim + 2);
    float* ms = vtile;
    float* ls = vtile + ATTN_SPLIT_TILE_FLOATS / 2;
    for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) {
        ms[c] = __ldcg(ph + c * (head_dim + 2));
        ls[c] = __ldcg(ph + c * (head_dim + 2) + 1);
    }
    __syncthreads();
    if (threadIdx.x < head_dim) {
        float mx = -INFINITY;
        for (int c = 0; c < n_chunks; ++c) mx = fmaxf(mx, ms[c]);
        float lsum = 0.0f, a = 0.0f;
        for (int c0 = 0; c0 < n_chunks; c0 += 4) {
            float vals[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                vals[j] = c0 + j < n_chunks ? __ldcg(ph + (c0 + j) * (head_dim + 2) + 2 + threadIdx.x) : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (c0 + j < n_chunks) {
                    const float w = expf(ms[c0 + j] - mx);
                    lsum = fmaf(ls[c0 + j], w, lsum);
                    a = fmaf(vals[j], w, a);
                }
            }
        }
        out[h * head_dim + threadIdx.x] = a / lsum;
    }
    if (threadIdx.x == 0) done[h] = 0;  // ready for the next launch (kernels on the stream run in order)
}
