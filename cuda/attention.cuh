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

// The prefill attention of a kv head's queries together: block (kv head, y) takes tokens y * tokens_per_block ..
// (at most ATTN_PREFILL_QUERIES / group of them) and every q head of the kv head's group, query qi = (token
// qi / group, head qi % group). A query's arithmetic is `attention`'s, operation for operation (the same bits,
// whatever the tokens around it): its scores are the same ascending fma chains over head_dim, scaled; m is their
// max (exact in any order); thread t sums exp(s_j - m) over the positions j = t, t + 256, ... in ascending order
// and block_sums folds the 256 partials with block_sum's tree; the output sums p_j v[j, d] over j in ascending
// order in one fma chain and divides by l. What changes is who does it: `attention` runs a block per (head, token),
// each reading the whole cache of its kv head, one dependent chain a thread; here every K and V row a block reads
// serves all its queries, and a thread carries the chains of several queries at once. Positions go in tiles of
// ATTN_PREFILL_ROWS (thread t scores position j0 + t for every query): a first pass finds each query's max and
// keeps the scores of the first stash_tiles tiles in `stash` (global memory, 8 KB a tile, read back by the thread
// that wrote them), a second takes them (or scores a later tile's K rows again: the same bits) for the weights and l,
// then sums the tile's V rows. Every tile's K and V rows reach shared memory through cp.async, coalesced, the next
// tile's K while this one's is scored (a thread reading its own row straight from the cache touched a separate line
// per lane). Dynamic shared memory:
// ATTN_PREFILL_K_BUFFERS tiles of K rows (each padded by 16 bytes, so that a quarter warp's 16-byte reads of 8 rows
// fall in distinct banks) and one of V rows (attn_prefill_shared).
#define ATTN_PREFILL_QUERIES 8
#define ATTN_PREFILL_ROWS ATTN_THREADS
#define ATTN_PREFILL_K_BUFFERS 2

__host__ __device__ constexpr int attn_prefill_k_row_bytes(int hd) { return hd * (int)sizeof(kv_t) + 16; }

__host__ __device__ constexpr int attn_prefill_shared(int hd) {
    return ATTN_PREFILL_ROWS * (ATTN_PREFILL_K_BUFFERS * attn_prefill_k_row_bytes(hd) + hd * (int)sizeof(kv_t));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most `pending` of this thread's committed copy groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
}

// Rows j0 .. j0 + rows - 1 of kv head kvh (HD entries each) into dst, `stride` bytes a row; one copy group.
template <int HD>
__device__ __forceinline__ void attn_prefill_stage(char* dst, int stride, const kv_t* __restrict__ cache, int j0,
                                                   int rows, int kv_stride, int kvh) {
    constexpr int PIECES = HD * (int)sizeof(kv_t) / 16;
    for (int e = threadIdx.x; e < rows * PIECES; e += ATTN_THREADS) {
        const int r = e / PIECES, c = e % PIECES;
        cp_async16(dst + r * stride + c * 16,
                   cache + (size_t)(j0 + r) * kv_stride + kvh * HD + c * (16 / sizeof(kv_t)));
    }
    cp_async_commit();
}

// The scaled scores of one K row (in shared memory) for queries 0 .. NQ - 1: `attention`'s chains, entry by entry.
template <int HD, int NQ>
__device__ __forceinline__ void attn_prefill_scores(float (&s)[ATTN_PREFILL_QUERIES], const char* krow,
                                                    const float (*q)[HD], float scale) {
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi) s[qi] = 0.0f;
#pragma unroll 4
    for (int i = 0; i < HD / 8; ++i) {
        const uint4 raw = reinterpret_cast<const uint4*>(krow)[i];
        const float4 ka = kv_unpack4(make_uint2(raw.x, raw.y)), kb = kv_unpack4(make_uint2(raw.z, raw.w));
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi) {
            const float4 qa = reinterpret_cast<const float4*>(q[qi])[2 * i];
            const float4 qb = reinterpret_cast<const float4*>(q[qi])[2 * i + 1];
            s[qi] = fmaf(qa.x, ka.x, s[qi]);
            s[qi] = fmaf(qa.y, ka.y, s[qi]);
            s[qi] = fmaf(qa.z, ka.z, s[qi]);
            s[qi] = fmaf(qa.w, ka.w, s[qi]);
            s[qi] = fmaf(qb.x, kb.x, s[qi]);
            s[qi] = fmaf(qb.y, kb.y, s[qi]);
            s[qi] = fmaf(qb.z, kb.z, s[qi]);
            s[qi] = fmaf(qb.w, kb.w, s[qi]);
        }
    }
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi) s[qi] = __fmul_rn(s[qi], scale);  // rounded as `attention` stores it: no fma
}

// The block's scores of K row `row` of a staged tile: four queries' chains where the block has at most four.
template <int HD>
__device__ __forceinline__ void attn_prefill_row_scores(float (&s)[ATTN_PREFILL_QUERIES], const char* ktile, int row,
                                                        int nq, const float (*q)[HD], float scale) {
    const char* krow = ktile + row * attn_prefill_k_row_bytes(HD);
    if (nq > 4)  // uniform
        attn_prefill_scores<HD, ATTN_PREFILL_QUERIES>(s, krow, q, scale);
    else
        attn_prefill_scores<HD, 4>(s, krow, q, scale);
}

// Tile rows 0 .. rows - 1's weighted V sums of thread (part, d): acc[k] += p[r][part * QP + k] * v[r][d] in ascending
// r. CHECK: only rows below mylen[k] count; without it every row does, for tiles that every present query sees whole
// (an absent query's sums are never stored).
template <int HD, int QP, bool CHECK>
__device__ __forceinline__ void attn_prefill_v_rows(float (&acc)[QP], const float (*p)[ATTN_PREFILL_QUERIES],
                                                    const kv_t* vtile, int rows, int part, int d, int j0,
                                                    const int (&mylen)[QP]) {
#pragma unroll 4
    for (int r = 0; r < rows; ++r) {
        const float v = bf16_to_float(vtile[r * HD + d]);
        float pw[QP];  // this thread's queries' weights of row r in one shared-memory load
        if constexpr (QP == 4) {
            const float4 w4 = *reinterpret_cast<const float4*>(&p[r][part * QP]);
            pw[0] = w4.x, pw[1] = w4.y, pw[2] = w4.z, pw[3] = w4.w;
        } else {
#pragma unroll
            for (int k = 0; k < QP; ++k) pw[k] = p[r][part * QP + k];
        }
#pragma unroll
        for (int k = 0; k < QP; ++k)
            if (!CHECK || j0 + r < mylen[k]) acc[k] = fmaf(pw[k], v, acc[k]);
    }
}

// The block's stored scores of one row (ATTN_PREFILL_QUERIES floats) in `stash`, global memory: pass 1 writes them
// and pass 2 reads them back, each row by the thread that wrote it.
struct AttnPrefillRowScores {
    float4 lo, hi;
};

template <int HD>
__device__ __forceinline__ void attention_prefill_body(const float* __restrict__ qkv, const kv_t* __restrict__ k_cache,
                                                       const kv_t* __restrict__ v_cache, float* __restrict__ out,
                                                       const int* pos_ptr, int pos_host, int n_tokens,
                                                       int tokens_per_block, int n_heads, int n_kv_heads,
                                                       float scale, float* __restrict__ stash, int stash_tiles) {
    constexpr int QM = ATTN_PREFILL_QUERIES, ROWS = ATTN_PREFILL_ROWS, PARTS = ATTN_THREADS / HD, QP = QM / PARTS;
    constexpr int KROW = attn_prefill_k_row_bytes(HD), KTILE = ROWS * KROW;
    static_assert(ATTN_THREADS % HD == 0 && QM % PARTS == 0 && QM % 4 == 0, "threads split evenly into query parts");
    static_assert(ATTN_PREFILL_K_BUFFERS == 2, "the passes alternate two K tiles");
    static_assert(QM == 8, "a row's stored scores are two float4s");
    pdl_enter();
    extern __shared__ __align__(16) char prefill_tiles[];  // K tiles, then the V tile
    const kv_t* vtile = reinterpret_cast<const kv_t*>(prefill_tiles + ATTN_PREFILL_K_BUFFERS * KTILE);
    __shared__ __align__(16) float q[QM][HD];
    __shared__ __align__(16) float p[ROWS][QM];  // the tile's weights, a row's queries side by side
    __shared__ float scratch[32 * QM];
    const int kvh = blockIdx.x, group = n_heads / n_kv_heads, t0 = blockIdx.y * tokens_per_block;
    const int nq = min(tokens_per_block, n_tokens - t0) * group;
    const int pos0 = host_or_device(pos_ptr, pos_host), length = pos0 + t0 + nq / group;  // the last query's
    const int kv_stride = n_kv_heads * HD, width = (n_heads + 2 * n_kv_heads) * HD;
    // Tiles below stash_tiles keep their scores from pass 1 for pass 2 (stash_tiles tiles a block, in block order);
    // later tiles are scored again from their K rows. The same values either way.
    AttnPrefillRowScores* rows_stash = reinterpret_cast<AttnPrefillRowScores*>(stash) +
                                       (size_t)(blockIdx.y * gridDim.x + blockIdx.x) * stash_tiles * ROWS;
    attn_prefill_stage<HD>(prefill_tiles, KROW, k_cache, 0, min(ROWS, length), kv_stride, kvh);
    for (int e = threadIdx.x; e < QM * HD; e += ATTN_THREADS) {
        const int qi = e / HD, d = e % HD;
        q[qi][d] = qi < nq ? qkv[(size_t)(t0 + qi / group) * width + (kvh * group + qi % group) * HD + d] : 0.0f;
    }
    // Query qi sees positions below qlen(qi); an absent query sees none.
    auto qlen = [&](int qi) { return qi < nq ? pos0 + t0 + qi / group + 1 : 0; };

    // Pass 1: each query's max score.
    float mx[QM];
#pragma unroll
    for (int qi = 0; qi < QM; ++qi) mx[qi] = -INFINITY;
    for (int n = 0, j0 = 0; j0 < length; ++n, j0 += ROWS) {
        if (j0 + ROWS < length) {
            attn_prefill_stage<HD>(prefill_tiles + ((n + 1) & 1) * KTILE, KROW, k_cache, j0 + ROWS,
                                   min(ROWS, length - j0 - ROWS), kv_stride, kvh);
            cp_async_wait<1>();
        } else
            cp_async_wait<0>();
        __syncthreads();  // tile n's K rows (and, the first time, q) are in place
        const int j = j0 + threadIdx.x;
        if (j < length) {
            float s[QM] = {};
            attn_prefill_row_scores<HD>(s, prefill_tiles + (n & 1) * KTILE, threadIdx.x, nq, q, scale);
#pragma unroll
            for (int qi = 0; qi < QM; ++qi)
                if (j < qlen(qi)) mx[qi] = fmaxf(mx[qi], s[qi]);
            if (n < stash_tiles)
                rows_stash[n * ROWS + threadIdx.x] = {make_float4(s[0], s[1], s[2], s[3]),
                                                      make_float4(s[4], s[5], s[6], s[7])};
        }
        __syncthreads();  // K buffer n & 1 is free for tile n + 2
    }
#pragma unroll
    for (int qi = 0; qi < QM; ++qi) mx[qi] = block_max(mx[qi], scratch);

    // Pass 2: the weights, l's partials and the output sums, tile by tile. Each tile commits two copy groups, its V
    // rows and the next tile's K rows (empty where the next tile is stored or there is none), so that one count of
    // groups in flight serves every tile.
    const int part = threadIdx.x / HD, d = threadIdx.x % HD;
    float lsum[QM], acc[QP];
#pragma unroll
    for (int qi = 0; qi < QM; ++qi) lsum[qi] = 0.0f;
#pragma unroll
    for (int k = 0; k < QP; ++k) acc[k] = 0.0f;
    int mylen[QP];
#pragma unroll
    for (int k = 0; k < QP; ++k) mylen[k] = qlen(part * QP + k);
    AttnPrefillRowScores kept{};  // this thread's row of the tile at hand, where that tile is stored
    if (0 < stash_tiles) {
        if (threadIdx.x < length) kept = rows_stash[threadIdx.x];
        cp_async_commit();
    } else
        attn_prefill_stage<HD>(prefill_tiles, KROW, k_cache, 0, min(ROWS, length), kv_stride, kvh);
    for (int n = 0, j0 = 0; j0 < length; ++n, j0 += ROWS) {
        const int rows = min(ROWS, length - j0), j = j0 + threadIdx.x;
        const bool next = j0 + ROWS < length, stored = n < stash_tiles, next_stored = n + 1 < stash_tiles;
        attn_prefill_stage<HD>(prefill_tiles + ATTN_PREFILL_K_BUFFERS * KTILE, HD * (int)sizeof(kv_t), v_cache, j0,
                               rows, kv_stride, kvh);
        AttnPrefillRowScores later{};  // the next tile's row, loaded a tile ahead of its use
        if (next && !next_stored)
            attn_prefill_stage<HD>(prefill_tiles + ((n + 1) & 1) * KTILE, KROW, k_cache, j0 + ROWS,
                                   min(ROWS, length - j0 - ROWS), kv_stride, kvh);
        else {
            if (next && j + ROWS < length) later = rows_stash[(n + 1) * ROWS + threadIdx.x];
            cp_async_commit();
        }
        float w[QM];
#pragma unroll
        for (int qi = 0; qi < QM; ++qi) w[qi] = 0.0f;
        if (!stored) {  // uniform
            cp_async_wait<2>();  // tile n's K; its V and the next K may still be in flight
            __syncthreads();
        }
        if (j < length) {
            float s[QM] = {};
            if (stored) {
                s[0] = kept.lo.x, s[1] = kept.lo.y, s[2] = kept.lo.z, s[3] = kept.lo.w;
                s[4] = kept.hi.x, s[5] = kept.hi.y, s[6] = kept.hi.z, s[7] = kept.hi.w;
            } else
                attn_prefill_row_scores<HD>(s, prefill_tiles + (n & 1) * KTILE, threadIdx.x, nq, q, scale);
#pragma unroll
            for (int qi = 0; qi < QM; ++qi) {
                if (j < qlen(qi)) {
                    w[qi] = expf(s[qi] - mx[qi]);
                    lsum[qi] += w[qi];
                }
            }
        }
        kept = later;
#pragma unroll
        for (int qi = 0; qi < QM; qi += 4)
            *reinterpret_cast<float4*>(&p[threadIdx.x][qi]) = make_float4(w[qi], w[qi + 1], w[qi + 2], w[qi + 3]);
        cp_async_wait<1>();  // tile n's V
        __syncthreads();
        if (j0 + rows <= pos0 + t0 + 1)  // uniform: the block's first query, so every present one, sees every row
            attn_prefill_v_rows<HD, QP, false>(acc, p, vtile, rows, part, d, j0, mylen);
        else
            attn_prefill_v_rows<HD, QP, true>(acc, p, vtile, rows, part, d, j0, mylen);
        __syncthreads();  // the next tile overwrites p, the V tile and K buffer n & 1
    }
    block_sums<QM>(lsum, scratch);  // leaves query qi's total in scratch[32 * qi] as well
#pragma unroll
    for (int k = 0; k < QP; ++k) {
        const int qi = part * QP + k;
        if (qi < nq)
            out[(size_t)(t0 + qi / group) * n_heads * HD + (kvh * group + qi % group) * HD + d] =
                acc[k] / scratch[32 * qi];
    }
}

#define ATTN_PREFILL_PARAMS                                                                                   \
    const float *__restrict__ qkv, const kv_t *__restrict__ k_cache, const kv_t *__restrict__ v_cache,          \
        float *__restrict__ out, const int *pos_ptr, int pos_host, int n_tokens, int tokens_per_block, int n_heads, \
        int n_kv_heads, float scale, float *__restrict__ stash, int stash_tiles
#define ATTN_PREFILL_ARGS \
    qkv, k_cache, v_cache, out, pos_ptr, pos_host, n_tokens, tokens_per_block, n_heads, n_kv_heads, scale, stash, \
        stash_tiles

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_prefill_hd128(ATTN_PREFILL_PARAMS) {
    attention_prefill_body<128>(ATTN_PREFILL_ARGS);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_prefill_hd64(ATTN_PREFILL_PARAMS) {
    attention_prefill_body<64>(ATTN_PREFILL_ARGS);
}
