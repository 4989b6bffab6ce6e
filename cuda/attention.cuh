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
#include "async_copy.cuh"
#include "common.cuh"
#include "gemm.cuh"  // the tensor-core helpers (bf16 split, mma)
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

// The prefill attention of a kv head's queries together, on the tensor cores: block (kv head, y) takes tokens
// y * tokens_per_block .. (at most ATTN_PREFILL_QUERIES / group of them) and every q head of the kv head's group,
// query qi = (token qi / group, head qi % group). Positions go in tiles of ATTN_PREFILL_ROWS, warp w taking rows
// 32 w .. 32 w + 31 of each. Scores: mma.sync m16n8k16 with the queries' fp32 rows split into bf16 hi and lo terms
// (rows 0-7 of the A operand hi, rows 8-15 lo; gemm.cuh's split) against the cache's exact bf16 K rows, fp32 sums,
// the hi and lo products added, then scaled; a first pass finds each query's max, a second scores the tile again,
// takes p = exp(s - m) (0 where the query does not see the position), sums l and multiplies the weights, split into
// hi and lo again, by the tile's V rows on the tensor cores. A warp's partial outputs and l are added over the warps
// in ascending order at the end. Deterministic, and a query's results depend on its own row alone (an mma's output
// row reads its A row only; every reduction is per query), so not on the tokens or heads that share its block.
// Precision: the queries and weights carry about 16 significant bits (relative error about 2^-17), the K and V
// values exactly; sums in fp32. These are not `attention`'s bits (its fp32 fma chains), and not meant to be.
// Dynamic shared memory: ATTN_PREFILL_K_BUFFERS tiles of K rows and one of V rows, each row padded by 16 bytes so
// that a warp's 4-byte fragment loads fall in distinct banks (attn_prefill_shared).
#define ATTN_PREFILL_QUERIES 8
#define ATTN_PREFILL_ROWS 256
#define ATTN_PREFILL_K_BUFFERS 2
#define ATTN_PREFILL_WARPS 8

__host__ __device__ constexpr int attn_prefill_row_bytes(int hd) { return hd * (int)sizeof(kv_t) + 16; }

__host__ __device__ constexpr int attn_prefill_shared(int hd) {
    return ATTN_PREFILL_ROWS * (ATTN_PREFILL_K_BUFFERS + 1) * attn_prefill_row_bytes(hd);
}

// Rows j0 .. j0 + rows - 1 of kv head kvh (HD entries each) into dst, attn_prefill_row_bytes a row; one copy group.
// The tile's rows past `rows` are set to zero (the last tile's): the weights there are 0, and 0 times a stale
// shared-memory word that happens to be a NaN would not be.
template <int HD>
__device__ __forceinline__ void attn_prefill_stage(char* dst, const kv_t* __restrict__ cache, int j0, int rows,
                                                   int kv_stride, int kvh) {
    constexpr int PIECES = HD * (int)sizeof(kv_t) / 16, STRIDE = attn_prefill_row_bytes(HD);
    for (int e = threadIdx.x; e < ATTN_PREFILL_ROWS * PIECES; e += ATTN_THREADS) {
        const int r = e / PIECES, c = e % PIECES;
        if (r < rows)
            cp_async16(dst + r * STRIDE + c * 16,
                       cache + (size_t)(j0 + r) * kv_stride + kvh * HD + c * (16 / sizeof(kv_t)));
        else
            *reinterpret_cast<uint4*>(dst + r * STRIDE + c * 16) = make_uint4(0u, 0u, 0u, 0u);
    }
    cp_async_commit();
}

// Two bf16 entries of a tile, rows r and r + 1 of column d, packed with row r's in the low half (an mma's B operand
// for V: consecutive k in one register).
__device__ __forceinline__ uint32_t attn_prefill_v_pair(const char* vtile, int stride, int r, int d) {
    const uint32_t lo = *reinterpret_cast<const bf16_t*>(vtile + r * stride + d * 2);
    const uint32_t hi = *reinterpret_cast<const bf16_t*>(vtile + (r + 1) * stride + d * 2);
    return lo | (hi << 16);
}

// Scores of this warp's 32 rows of the tile at ktile for the block's 8 queries: s[t][0..1] are query gid's at rows
// 32 w + 8 t + 2 tig + (0, 1), scaled. qa: the queries' A fragments (hi rows, lo rows) for each k16 step of HD.
template <int HD>
__device__ __forceinline__ void attn_prefill_mma_scores(float (&s)[4][2], const char* ktile, int warp, int gid,
                                                        int tig, const uint32_t (&qa)[HD / 16][4], float scale) {
    constexpr int STRIDE = attn_prefill_row_bytes(HD);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const char* krow = ktile + (32 * warp + 8 * t + gid) * STRIDE;  // B column gid: K row 8 t + gid
#pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + (16 * ks + 2 * tig) * 2);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + (16 * ks + 2 * tig + 8) * 2);
            mma_bf16_16816(c, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
        }
        s[t][0] = __fmul_rn(c[0] + c[2], scale);  // hi row gid plus lo row gid + 8
        s[t][1] = __fmul_rn(c[1] + c[3], scale);
    }
}

template <int HD>
__device__ __forceinline__ void attention_prefill_body(const float* __restrict__ qkv, const kv_t* __restrict__ k_cache,
                                                       const kv_t* __restrict__ v_cache, float* __restrict__ out,
                                                       const int* pos_ptr, int pos_host, int n_tokens,
                                                       int tokens_per_block, int n_heads, int n_kv_heads,
                                                       float scale) {
    constexpr int QM = ATTN_PREFILL_QUERIES, ROWS = ATTN_PREFILL_ROWS, W = ATTN_PREFILL_WARPS;
    constexpr int STRIDE = attn_prefill_row_bytes(HD), TILE = ROWS * STRIDE, KS = HD / 16, NT = HD / 8;
    static_assert(QM == 8 && ROWS == 32 * W && W * TT_WARP == ATTN_THREADS, "8 queries, 32 rows a warp");
    static_assert(ATTN_PREFILL_K_BUFFERS == 2 && HD % 16 == 0, "the passes alternate two K tiles");
    extern __shared__ __align__(16) char prefill_tiles[];  // K tiles, then the V tile; the outputs' sums at the end
    char* vtile = prefill_tiles + ATTN_PREFILL_K_BUFFERS * TILE;
    __shared__ float scratch[W][QM];  // each warp's max, then l, of each query
    const int kvh = blockIdx.x, group = n_heads / n_kv_heads, t0 = blockIdx.y * tokens_per_block;
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP, gid = lane / 4, tig = lane % 4;
    const int nq = min(tokens_per_block, n_tokens - t0) * group;
    pdl_enter();
    const int pos0 = host_or_device(pos_ptr, pos_host), length = pos0 + t0 + nq / group;  // the last query's
    const int kv_stride = n_kv_heads * HD, width = (n_heads + 2 * n_kv_heads) * HD;
    attn_prefill_stage<HD>(prefill_tiles, k_cache, 0, min(ROWS, length), kv_stride, kvh);
    // Query gid's A fragments: rows gid (hi) and gid + 8 (lo), k = 2 tig, 2 tig + 1 and 2 tig + 8, 2 tig + 9.
    uint32_t qa[KS][4];
    {
        const bool present = gid < nq;
        const float* qrow = qkv + (size_t)(t0 + gid / group) * width + (kvh * group + gid % group) * HD;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int d = 16 * ks + 2 * tig + 8 * h;
                split_bf16x2(present ? qrow[d] : 0.0f, present ? qrow[d + 1] : 0.0f, qa[ks][2 * h], qa[ks][2 * h + 1]);
            }
        }
    }
    // Query gid sees positions below qlen; an absent query sees none.
    const int qlen = gid < nq ? pos0 + t0 + gid / group + 1 : 0;

    // Pass 1: each query's max score.
    float mx = -INFINITY;
    for (int n = 0, j0 = 0; j0 < length; ++n, j0 += ROWS) {
        if (j0 + ROWS < length) {
            attn_prefill_stage<HD>(prefill_tiles + ((n + 1) & 1) * TILE, k_cache, j0 + ROWS,
                                   min(ROWS, length - j0 - ROWS), kv_stride, kvh);
            cp_async_wait<1>();
        } else
            cp_async_wait<0>();
        __syncthreads();  // tile n's K rows are in place
        if (j0 + 32 * warp < length) {  // uniform across the warp
            float s[4][2];
            attn_prefill_mma_scores<HD>(s, prefill_tiles + (n & 1) * TILE, warp, gid, tig, qa, scale);
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (j0 + 32 * warp + 8 * t + 2 * tig + e < qlen) mx = fmaxf(mx, s[t][e]);
        }
        __syncthreads();  // K buffer n & 1 is free for tile n + 2
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // exact in any order
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if (tig == 0) scratch[warp][gid] = mx;
    __syncthreads();
    mx = scratch[0][gid];
#pragma unroll
    for (int w = 1; w < W; ++w) mx = fmaxf(mx, scratch[w][gid]);

    // Pass 2: the weights, l and the output sums, tile by tile. Each tile commits two copy groups, its V rows and
    // the next tile's K rows, so that one count of groups in flight serves every tile.
    float l = 0.0f;
    float acc[NT][4];  // dims 8 nt + 2 tig, + 1: rows gid (hi weights) and gid + 8 (lo weights)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    attn_prefill_stage<HD>(prefill_tiles, k_cache, 0, min(ROWS, length), kv_stride, kvh);
    for (int n = 0, j0 = 0; j0 < length; ++n, j0 += ROWS) {
        const int rows = min(ROWS, length - j0);
        attn_prefill_stage<HD>(vtile, v_cache, j0, rows, kv_stride, kvh);
        if (j0 + ROWS < length)
            attn_prefill_stage<HD>(prefill_tiles + ((n + 1) & 1) * TILE, k_cache, j0 + ROWS,
                                   min(ROWS, length - j0 - ROWS), kv_stride, kvh);
        else
            cp_async_commit();  // an empty group keeps the count
        cp_async_wait<2>();     // tile n's K; its V and the next K may still be in flight
        __syncthreads();
        const bool mine = 32 * warp < rows;  // uniform across the warp: this warp's rows hold positions
        uint32_t pa[2][4];                   // the weights as A fragments of the two k16 steps of the warp's rows
        if (mine) {
            float s[4][2];
            attn_prefill_mma_scores<HD>(s, prefill_tiles + (n & 1) * TILE, warp, gid, tig, qa, scale);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                float p[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    p[e] = j0 + 32 * warp + 8 * t + 2 * tig + e < qlen ? expf(s[t][e] - mx) : 0.0f;
                    l += p[e];
                }
                // step t / 2: k = 2 tig, + 1 from row group t even (a0 hi, a1 lo), 2 tig + 8, + 9 from t odd
                split_bf16x2(p[0], p[1], pa[t / 2][2 * (t % 2)], pa[t / 2][2 * (t % 2) + 1]);
            }
        }
        cp_async_wait<1>();  // tile n's V
        __syncthreads();
        if (mine) {
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                const int r = 32 * warp + 16 * ks + 2 * tig;  // B rows k = 2 tig, + 1 and 2 tig + 8, + 9
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int d = 8 * nt + gid;  // B column gid
                    const uint32_t b0 = attn_prefill_v_pair(vtile, STRIDE, r, d);
                    const uint32_t b1 = attn_prefill_v_pair(vtile, STRIDE, r + 8, d);
                    mma_bf16_16816(acc[nt], pa[ks][0], pa[ks][1], pa[ks][2], pa[ks][3], b0, b1);
                }
            }
        }
        __syncthreads();  // the next tile overwrites the V tile and K buffer n & 1
    }
    // l and the outputs: each warp's part, then the parts added in warp order.
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (tig == 0) scratch[warp][gid] = l;
    float* sums = reinterpret_cast<float*>(prefill_tiles);  // [warp][query][HD], 32 KB at head_dim 128
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        float* to = sums + ((size_t)warp * QM + gid) * HD + 8 * nt + 2 * tig;
        to[0] = acc[nt][0] + acc[nt][2];  // the hi weights' products plus the lo weights'
        to[1] = acc[nt][1] + acc[nt][3];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < QM * HD; e += ATTN_THREADS) {
        const int qi = e / HD, d = e % HD;
        if (qi >= nq) continue;
        float total = sums[(size_t)qi * HD + d], lq = scratch[0][qi];
        for (int w = 1; w < W; ++w) {
            total += sums[((size_t)w * QM + qi) * HD + d];
            lq += scratch[w][qi];
        }
        out[(size_t)(t0 + qi / group) * n_heads * HD + (kvh * group + qi % group) * HD + d] = total / lq;
    }
}

#define ATTN_PREFILL_PARAMS                                                                                   \
    const float *__restrict__ qkv, const kv_t *__restrict__ k_cache, const kv_t *__restrict__ v_cache,          \
        float *__restrict__ out, const int *pos_ptr, int pos_host, int n_tokens, int tokens_per_block, int n_heads, \
        int n_kv_heads, float scale
#define ATTN_PREFILL_ARGS \
    qkv, k_cache, v_cache, out, pos_ptr, pos_host, n_tokens, tokens_per_block, n_heads, n_kv_heads, scale

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_prefill_hd128(ATTN_PREFILL_PARAMS) {
    attention_prefill_body<128>(ATTN_PREFILL_ARGS);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_prefill_hd64(ATTN_PREFILL_PARAMS) {
    attention_prefill_body<64>(ATTN_PREFILL_ARGS);
}
