// Decode attention (one query token), one launch per layer: q/k norm and rotary embedding of the new token,
// its K/V cache write, attention split over the cached positions so that a head keeps many SMs busy, and the
// merge of the splits. (The single-block kernel in attention.cuh serves prefill.) Deterministic by construction:
//   the positions are cut into fixed chunks of ATTN_CHUNK (chunk c holds positions c*32 .. c*32+31, whatever
//   the grid), so a chunk's partial result does not depend on how many blocks run;
//   per (head, chunk): scores with one warp per position (lanes own fixed float4 slices, butterfly sum; a warp's
//   4 rows are loaded before any is used, together with the chunk's V), the chunk's max m and sum l of
//   exp(s - m) (each warp computes them: a score a lane, one butterfly), and acc[d] = sum_j p_j v[j, d]
//   with V loaded straight into registers, positions dealt round-robin to thread groups, the groups added in
//   ascending order; (m, l, acc) go to `partial`;
//   the block that finishes a head last (a counter per head, over the blocks that have a chunk; the others leave
//   at once) merges its chunks in ascending order (m = max m_c, weights exp(m_c - m); past ATTN_MERGE_SPLIT chunks
//   in contiguous runs summed by separate threads, the runs added in order) into out, and resets the counter.
//   Which block merges changes nothing. attention_decode_cluster (the same body, launched as clusters of
//   ATTN_CLUSTER blocks) merges contexts of at most ATTN_CLUSTER chunks inside the head's first cluster instead:
//   each block writes its record into the shared memory of the cluster's first block, which merges them with the
//   same arithmetic, so the records' global round trips and the counter's atomic leave the chain (the same bits).
//   On an H200 it saves about 35 µs per token at 200 positions, but launching clusters cost more than that at
//   708 (docs/cuda-speed-notes.md #65, #66), so the host takes it only for requests that stay within ATTN_CLUSTER
//   chunks (unless TOOLTRIE_CLUSTER_ATTENTION=0); it is correct at any context (past ATTN_CLUSTER chunks it takes
//   the counter and global records).
// attention_decode_hd128 and attention_decode_cluster_hd128 (and the _hd64 forms) are the same bodies compiled for
// head_dim 128 (64).
// The new token's k and v (row pos) are computed by every block whose chunk holds pos, together with its q by
// head_norm_rope_pair (each value bit-identical to the prefill kernel's head_norm_rope_values), and used from shared
// memory as the bf16 cache holds them (kv_cache.cuh); the first q head of each kv group writes them to the caches.
// The position comes from device memory (graph replays) or from the host (pos_ptr null).
#pragma once
#include "common.cuh"
#include "kv_cache.cuh"
#include "rope.cuh"

// 32 positions a chunk: what a block loads (K and V of its chunk) sets its chain, so chunks are kept small (with
// 64 a step took 20-27 µs longer on an H200; docs/cuda-speed-notes.md #54, #56).
#define ATTN_CHUNK 32
static_assert(ATTN_CHUNK == TT_WARP, "each warp's softmax takes one score a lane");
#define ATTN_SPLIT_THREADS 256  // the kernel assumes exactly this block size
#define ATTN_SPLIT_WARPS (ATTN_SPLIT_THREADS / TT_WARP)
#define ATTN_ROWS_PER_WARP (ATTN_CHUNK / ATTN_SPLIT_WARPS)
#define ATTN_V_COL 16                // V values a thread holds in registers at a time
#define ATTN_MERGE_BATCH 16          // chunk values per output element loaded together by the merge
#define ATTN_MERGE_SPLIT (2 * ATTN_MERGE_BATCH)  // past this many chunks the merge splits them over the block's threads
#define ATTN_TRACE_PROBES 15         // TT_MARK probes per block (-DTT_TRACE; bench/gpu_trace_attention.py names them)
// Chunks the merge holds: 65,536 positions. The host's max_context is bounded lower, by the prefill attention's
// shared memory (one score per position: about 49,600), so this is never the limit.
#define ATTN_MERGE_MAX_CHUNKS 2048
#define ATTN_CLUSTER 8                // blocks of attention_decode_cluster's clusters (its grid.y is a multiple)
#define ATTN_RECORD_FLOATS (256 + 2)  // a chunk's (m, l, acc[head_dim <= 256]) in the cluster merge's table
static_assert(ATTN_CLUSTER * ATTN_RECORD_FLOATS <= 2 * ATTN_MERGE_MAX_CHUNKS, "the records reuse the merge table");
static_assert(2 * ATTN_MERGE_SPLIT + ATTN_MERGE_BATCH * (ATTN_SPLIT_THREADS / 2) <= 2 * ATTN_MERGE_MAX_CHUNKS,
              "the serial merge's handed-over values fit after its table");

// Loads the V values thread (g, d) sums next: column d of rows t0 + g + k * groups (k < ATTN_V_COL) of the chunk at
// j0, where groups = ATTN_SPLIT_THREADS / head_dim threads share a column. A warp reads 32 consecutive columns of
// one row per load (64 contiguous bytes); every load is issued before any is used. Rows past the chunk load its
// first row (never used), which keeps every load unconditional. PLAIN: the caller knows every row it loads lies
// inside the chunk (no clamp).
template <bool PLAIN = false>
__device__ __forceinline__ void attn_load_v_col_rows(float (&v)[ATTN_V_COL], const kv_t* __restrict__ v_cache, int j0,
                                                     int t0, int rows, int g, int d, int groups, int kv_stride, int kvh,
                                                     int head_dim) {
    const kv_t* base = v_cache + (size_t)j0 * kv_stride + kvh * head_dim + d;
#pragma unroll
    for (int k = 0; k < ATTN_V_COL; ++k) {
        const int r = t0 + g + k * groups;
        v[k] = kv_load(base + (size_t)(PLAIN || r < rows ? r : 0) * kv_stride);
    }
}

// Row `pos` (the new token, computed by this block) among attn_load_v_col_rows' values comes from vnew.
__device__ __forceinline__ void attn_v_col_new_row(float (&v)[ATTN_V_COL], const float* vnew, int pos, int j0, int t0,
                                                   int g, int d, int groups) {
#pragma unroll
    for (int k = 0; k < ATTN_V_COL; ++k)
        if (j0 + t0 + g + k * groups == pos) v[k] = vnew[d];
}

// attn_load_v_col_rows, then (unless PLAIN: every row before pos) the new row from vnew.
template <bool PLAIN = false>
__device__ __forceinline__ void attn_load_v_col(float (&v)[ATTN_V_COL], const kv_t* __restrict__ v_cache,
                                                const float* vnew, int pos, int j0, int t0, int rows, int g, int d,
                                                int groups, int kv_stride, int kvh, int head_dim) {
    attn_load_v_col_rows<PLAIN>(v, v_cache, j0, t0, rows, g, d, groups, kv_stride, kvh, head_dim);
    if constexpr (!PLAIN) attn_v_col_new_row(v, vnew, pos, j0, t0, g, d, groups);
}

// Requests K and V rows j0 .. j0 + rows - 1 of kv head kvh into L2: thread t takes 128-byte line t % lines of rows
// t / lines, t / lines + blockDim.x / lines, ...
template <int TEAM = 0>
__device__ __forceinline__ void attn_prefetch_rows_l2(const kv_t* k_cache, const kv_t* v_cache, int j0, int rows,
                                                      int kv_stride, int kvh, int head_dim) {
    constexpr int line_entries = 128 / sizeof(kv_t);
    const int lines = max(1, head_dim / line_entries);  // 128-byte lines per row of one kv head
    const int line = threadIdx.x % lines;
    for (int r = threadIdx.x / lines; r < rows; r += team_size<TEAM>() / lines) {
        const size_t at = (size_t)(j0 + r) * kv_stride + kvh * head_dim + line * line_entries;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(k_cache + at));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(v_cache + at));
    }
}

// Shared memory of one block's decode attention work (the attention_decode kernel's, and the persistent decode
// kernel's attention phase).
struct AttnShared {
    __align__(16) float q[256];
    __align__(16) float knew[256];
    __align__(16) float vnew[256];
    float rope_scratch[2 * 256];  // q and k of the head
    float p[ATTN_CHUNK];                         // the chunk's scores
    __align__(16) float weights[ATTN_SPLIT_WARPS][ATTN_CHUNK];  // each warp's copy of the softmax weights
    float red[ATTN_SPLIT_THREADS];
    float scratch[64];
    int merge;
};

// The geometry of one layer's decode attention.
struct AttnDims {
    int n_heads, n_kv_heads, head_dim, max_chunks;
    float scale, eps;
};

// The block's head h, ready for its chunks: q normalised and rotated into sh.q, and (scores_pos: the block has the
// chunk that holds pos) the new token's k and v into sh.knew and sh.vnew, the first q head of each kv group writing
// them to the caches. The rows prefetch_row0 .. + prefetch_rows of the K/V caches are requested into L2 meanwhile,
// so their HBM round trip overlaps the rotary work (a prefetch holds no registers; later loads then hit L2).
// q_norm_d and k_norm_d are element threadIdx.x of the norm weights (loaded by the caller). Ends with a barrier.
// attn_prepare_head_from reads the q|k|v value at p (a place in qkv) as load_qkv(p): the persistent decode kernel
// polls tagged words there.
template <int TEAM, class LoadQkv>
__device__ __forceinline__ void attn_prepare_head_from(const float* qkv, LoadQkv load_qkv, bool q_has_norm,
                                                       bool k_has_norm, float q_norm_d, float k_norm_d, kv_t* k_cache,
                                                       kv_t* v_cache, const float* __restrict__ rope, int h, int pos,
                                                       bool scores_pos, int prefetch_row0, int prefetch_rows,
                                                       const AttnDims& d, AttnShared& sh, int mark) {
    const int head_dim = d.head_dim, group_size = d.n_heads / d.n_kv_heads, kvh = h / group_size;
    const bool active = threadIdx.x < head_dim;
    const int q_width = d.n_heads * head_dim, kv_stride = d.n_kv_heads * head_dim;
    // The new token's q (and, for the block that scores row pos, its k and v) and the rotation's cosine and sine
    // in one round of loads.
    const float q_raw = active ? load_qkv(qkv + h * head_dim + threadIdx.x) : 0.0f;
    const float2 cs = rope_cos_sin(rope, pos, head_dim);
    float k_raw = 0.0f, v_raw = 0.0f;
    if (scores_pos && active) {
        k_raw = load_qkv(qkv + q_width + kvh * head_dim + threadIdx.x);
        v_raw = load_qkv(qkv + q_width + kv_stride + kvh * head_dim + threadIdx.x);
    }
    if (prefetch_rows > 0)
        attn_prefetch_rows_l2<TEAM>(k_cache, v_cache, prefetch_row0, prefetch_rows, kv_stride, kvh, head_dim);

    if (!scores_pos) {
        const float qd =
            head_norm_rope_values<TEAM>(q_raw, q_has_norm, q_norm_d, cs, head_dim, d.eps, sh.rope_scratch, sh.scratch);
        if (active) sh.q[threadIdx.x] = qd;
    } else {  // q and k together: one reduction and one rotation phase instead of two of each
        const float2 qk = head_norm_rope_pair<TEAM>(q_raw, k_raw, q_has_norm, k_has_norm, q_norm_d, k_norm_d, cs,
                                                    head_dim, d.eps, sh.rope_scratch, sh.scratch);
        if (active) {
            const kv_t kd = kv_from_float(qk.y), vd = kv_from_float(v_raw);
            sh.q[threadIdx.x] = qk.x;
            sh.knew[threadIdx.x] = bf16_to_float(kd);  // as the cache holds them
            sh.vnew[threadIdx.x] = bf16_to_float(vd);
            if (h % group_size == 0) {  // one writer per kv head
                const size_t c = (size_t)pos * kv_stride + kvh * head_dim + threadIdx.x;
                k_cache[c] = kd;
                v_cache[c] = vd;
            }
        }
    }
    TT_MARK(mark + 2);
    team_sync<TEAM>();
    TT_MARK(mark + 3);
}

template <bool CG, int TEAM = 0>
__device__ __forceinline__ void attn_prepare_head(const float* qkv, bool q_has_norm, bool k_has_norm, float q_norm_d,
                                                  float k_norm_d, kv_t* k_cache, kv_t* v_cache,
                                                  const float* __restrict__ rope, int h, int pos, bool scores_pos,
                                                  int prefetch_row0, int prefetch_rows, const AttnDims& d,
                                                  AttnShared& sh, int mark) {
    attn_prepare_head_from<TEAM>(qkv, [](const float* p) { return load_activation<CG>(p); }, q_has_norm, k_has_norm,
                                 q_norm_d, k_norm_d, k_cache, v_cache, rope, h, pos, scores_pos, prefetch_row0,
                                 prefetch_rows, d, sh, mark);
}

// Where chunk records go: (h, c)'s place in `partial` (global memory), or with `cluster` chunk c's row of the
// cluster merge's table in the cluster's first block (`records`, reached through distributed shared memory).
struct AttnRecords {
    float* partial;
    float* records;
    bool cluster;
    __device__ __forceinline__ float* at(int h, int c, const AttnDims& d) const;
};

// Chunk c of head h (attn_prepare_head done for h): its scores, softmax max m and sum l, and V sums, written as the
// record (m, l, acc[head_dim]) of (h, c) at to.at(h, c). Ends with a barrier (sh is free for the next chunk).
// (attn_chunk_records_hd_form is the same arithmetic for a compile-time head_dim.)
template <int TEAM = 0>
__device__ __forceinline__ void attn_chunk_record(const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
                                                  const AttnRecords& to, int h, int c, int pos, const AttnDims& d,
                                                  AttnShared& sh, int mark) {
    const int head_dim = d.head_dim, kvh = h / (d.n_heads / d.n_kv_heads);
    const int length = pos + 1, kv_stride = d.n_kv_heads * head_dim, hd4 = head_dim / 4;
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    const float4* q4 = reinterpret_cast<const float4*>(sh.q);
    const float4* knew4 = reinterpret_cast<const float4*>(sh.knew);
    // Where head_dim does not divide the block (96), the threads past groups * head_dim sum rows a lower group also
    // sums, and their sums are never read.
    const int groups = team_size<TEAM>() / head_dim;
    const int g = threadIdx.x / head_dim, dcol = threadIdx.x % head_dim;
    const int col_rows = ATTN_V_COL * groups;  // chunk rows whose V one round of loads covers
    const int j0 = c * ATTN_CHUNK, rows = min(ATTN_CHUNK, length - j0);
    // The V this thread sums is loaded into registers together with the K rows, so both round trips overlap.
    float vcol[ATTN_V_COL];
    attn_load_v_col(vcol, v_cache, sh.vnew, pos, j0, 0, rows, g, dcol, groups, kv_stride, kvh, head_dim);
    // Scores: warp w owns rows w, w + 8, w + 16, w + 24; every row's loads are issued before the first use.
    // Rows past the chunk load the chunk's first row and score -inf; row pos takes the k computed above.
    float s[ATTN_ROWS_PER_WARP];
#pragma unroll
    for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) s[u] = 0.0f;
    const kv_t* kbase = k_cache + (size_t)j0 * kv_stride + kvh * head_dim;
    for (int i = lane; i < hd4; i += TT_WARP) {
        float4 k[ATTN_ROWS_PER_WARP];
#pragma unroll
        for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) {
            const int r = warp + u * ATTN_SPLIT_WARPS;
            k[u] = kv_load4(kbase + (size_t)(r < rows ? r : 0) * kv_stride, i);
        }
#pragma unroll
        for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u)
            if (j0 + warp + u * ATTN_SPLIT_WARPS == pos) k[u] = knew4[i];
        const float4 qq = q4[i];
#pragma unroll
        for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) {
            s[u] = fmaf(qq.x, k[u].x, s[u]);
            s[u] = fmaf(qq.y, k[u].y, s[u]);
            s[u] = fmaf(qq.z, k[u].z, s[u]);
            s[u] = fmaf(qq.w, k[u].w, s[u]);
        }
    }
    TT_MARK(mark + 4);
    // warp_sum of every row, the rows' butterflies interleaved (each row's additions are warp_sum's, in its order)
#pragma unroll
    for (int o = TT_WARP / 2; o > 0; o >>= 1)
#pragma unroll
        for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
    TT_MARK(mark + 5);
#pragma unroll
    for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) {
        const int r = warp + u * ATTN_SPLIT_WARPS;
        if (lane == 0) sh.p[r] = r < rows ? s[u] * d.scale : -INFINITY;
    }
    team_sync<TEAM>();
    TT_MARK(mark + 6);
    // Softmax weights: every warp works out the chunk's max and sum itself (one score a lane: warp_max and
    // warp_sum, the same in every warp), with no block barrier. Each warp keeps its own copy of the weights for
    // its V sums.
    const float s0 = sh.p[lane];
    const float m = warp_max(s0);
    const float e0 = lane < rows ? expf(s0 - m) : 0.0f;
    const float l = warp_sum(e0);
    float* pw = sh.weights[warp];
    pw[lane] = e0;
    __syncwarp();
    TT_MARK(mark + 7);

    // Output: thread (g, d) sums rows g, g + groups, ... of column d in ascending order, straight from the
    // registers loaded above (one more round per ATTN_V_COL rows at head_dim 256); the groups are then added
    // in ascending order.
    float acc = 0.0f;
    for (int t0 = 0; t0 < rows; t0 += col_rows) {
        if (t0 > 0)
            attn_load_v_col(vcol, v_cache, sh.vnew, pos, j0, t0, rows, g, dcol, groups, kv_stride, kvh, head_dim);
#pragma unroll
        for (int k = 0; k < ATTN_V_COL; ++k) {
            const int r = t0 + g + k * groups;
            if (r < rows) acc = fmaf(pw[r], vcol[k], acc);
        }
    }
    sh.red[g * head_dim + dcol] = acc;
    team_sync<TEAM>();
    TT_MARK(mark + 8);
    float* rec = to.at(h, c, d);
    if (threadIdx.x < head_dim) {
        float sum = sh.red[threadIdx.x];
        for (int i = 1; i < groups; ++i) sum += sh.red[i * head_dim + threadIdx.x];  // ascending group order
        rec[2 + threadIdx.x] = sum;
    }
    if (threadIdx.x == 0) {
        rec[0] = m;
        rec[1] = l;
    }
    team_sync<TEAM>();  // p, weights and red are reused by the next chunk; the records are written
}

// The warp sums of 4 values a lane, each with warp_sum's additions and so bit-identical to it (a butterfly's two
// lanes add the same two values), in 6 shuffles instead of 20: at each of the first two levels a lane keeps half of
// its values and trades the other half with its partner, which keeps those; the last levels are warp_sum's.
// Lane l ends with the sum of value (l >> 3) % 4.
template <int N>
__device__ __forceinline__ float warp_sums_scattered(float (&x)[N]) {
    static_assert(N == 4, "two trading levels: four values a lane");
    constexpr int LEVELS = 2;
    const int lane = threadIdx.x % TT_WARP;
#pragma unroll
    for (int level = 0; level < LEVELS; ++level) {
        const int o = TT_WARP >> (level + 1), half = (N >> level) / 2;
        const bool upper = lane & o;
#pragma unroll
        for (int j = 0; j < half; ++j) {
            const float keep = upper ? x[half + j] : x[j], give = upper ? x[j] : x[half + j];
            x[j] = keep + __shfl_xor_sync(0xffffffffu, give, o);
        }
    }
#pragma unroll
    for (int o = TT_WARP >> (LEVELS + 1); o > 0; o >>= 1) x[0] += __shfl_xor_sync(0xffffffffu, x[0], o);
    return x[0];
}

// Where attn_chunk_records_hd_form keeps the head's chunk state in shared memory: its q (HD floats), scores
// (ATTN_CHUNK), softmax weights (ATTN_SPLIT_WARPS x ATTN_CHUNK, 16-byte aligned) and V partial sums
// (ATTN_SPLIT_THREADS); the new token's k and v. (Passing AttnShared itself compiled to other machine code, with
// 12-16 bytes spilled, than the form #91 measured; so did dropping the head index hh, always 0, from the records.)
struct AttnHeadsScratch {
    const float* q;
    float* p;
    float* weights;
    float* red;
    const float* knew;
    const float* vnew;
};

// The cache values of chunk c that attn_chunk_records_hd_form reduces (compile-time head_dim HD <= 128), loaded ahead
// of it: lane l of warp w holds entries 4l .. 4l + 3 of the chunk's K rows w, w + 8, w + 16 and w + 24 as raw bf16
// pairs, and thread (g, d) its first round of V values (attn_load_v_col_rows'). Rows past the chunk hold its first
// row (never used); row pos holds whatever the cache had there until the reduction puts the new token's k and v in
// its place. A block loads its first chunk so before the head's norm and rotation (attn_head_chunks).
struct AttnChunkValues {
    uint2 k[ATTN_ROWS_PER_WARP];
    float v[ATTN_V_COL];
};

// Chunk c's values into x, clamped as attn_chunk_records_hd_form's own loads of a chunk that holds row pos: every
// load issued, none used.
template <int HD>
__device__ __forceinline__ void attn_chunk_load_hd(AttnChunkValues& x, const kv_t* __restrict__ k_cache,
                                                   const kv_t* __restrict__ v_cache, int kvh, int c, int rows,
                                                   const AttnDims& d) {
    constexpr int hd4 = HD / 4, groups = ATTN_SPLIT_THREADS / HD;
    static_assert(hd4 <= TT_WARP, "one group of four entries a lane covers a K row");
    const int kv_stride = d.n_kv_heads * HD, j0 = c * ATTN_CHUNK;
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    attn_load_v_col_rows(x.v, v_cache, j0, 0, rows, threadIdx.x / HD, threadIdx.x % HD, groups, kv_stride, kvh, HD);
    const kv_t* kbase = k_cache + (size_t)j0 * kv_stride + kvh * HD;
    if (lane < hd4) {
#pragma unroll
        for (int u = 0; u < ATTN_ROWS_PER_WARP; ++u) {
            const int r = warp + u * ATTN_SPLIT_WARPS;
            x.k[u] = reinterpret_cast<const uint2*>(kbase + (size_t)(r < rows ? r : 0) * kv_stride)[lane];
        }
    }
}

// attn_chunk_record for a compile-time head_dim HD and a block of ATTN_SPLIT_THREADS, head h0. Each product, sum,
// weight and record is attn_chunk_record's, in its order (the same bits), with fewer instructions: the loops compile
// for their exact trip counts; PLAIN chunks (wholly before row pos: every chunk but the context's last) load their
// rows without clamps or the new row's substitution; the rows' warp sums trade halves (warp_sums_scattered); where
// one round of V loads covers the chunk, each warp lays its weights out by thread group so that a thread reads its
// rows' weights as float4s (docs/cuda-speed-notes.md #91). EARLY: the chunk's K and V values are *early's
// (attn_chunk_load_hd's), not loaded here. Ends with a barrier.
template <int HD, bool PLAIN, bool EARLY = false>
__device__ __forceinline__ void attn_chunk_records_hd_form(const kv_t* __restrict__ k_cache,
                                                           const kv_t* __restrict__ v_cache, const AttnRecords& to,
                                                           int h0, int c, int pos, const AttnDims& d,
                                                           const AttnHeadsScratch& sh, int mark,
                                                           const AttnChunkValues* early = nullptr) {
    constexpr int hd4 = HD / 4, groups = ATTN_SPLIT_THREADS / HD, col_rows = ATTN_V_COL * groups;
    constexpr int RW = ATTN_ROWS_PER_WARP;
    constexpr bool GROUPED = col_rows == ATTN_CHUNK;  // thread group g's weights at g * ATTN_V_COL ..
    static_assert(!PLAIN || col_rows <= ATTN_CHUNK, "plain loads stay inside the chunk");
    static_assert(HD <= ATTN_SPLIT_THREADS, "one thread an output element");
    const int kvh = h0 / (d.n_heads / d.n_kv_heads), length = pos + 1, kv_stride = d.n_kv_heads * HD;
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    const int g = threadIdx.x / HD, dcol = threadIdx.x % HD;
    const int j0 = c * ATTN_CHUNK, rows = PLAIN ? ATTN_CHUNK : min(ATTN_CHUNK, length - j0);
    const float4* q4 = reinterpret_cast<const float4*>(sh.q);
    const float4* knew4 = reinterpret_cast<const float4*>(sh.knew);
    float vcol[ATTN_V_COL];
    if constexpr (EARLY) {
#pragma unroll
        for (int k = 0; k < ATTN_V_COL; ++k) vcol[k] = early->v[k];
        if constexpr (!PLAIN) attn_v_col_new_row(vcol, sh.vnew, pos, j0, 0, g, dcol, groups);
    } else
        attn_load_v_col<PLAIN>(vcol, v_cache, sh.vnew, pos, j0, 0, rows, g, dcol, groups, kv_stride, kvh, HD);
    float s[RW];
#pragma unroll
    for (int u = 0; u < RW; ++u) s[u] = 0.0f;
    const kv_t* kbase = k_cache + (size_t)j0 * kv_stride + kvh * HD;
#pragma unroll
    for (int i = lane; i < hd4; i += TT_WARP) {
        float4 k[RW];
#pragma unroll
        for (int u = 0; u < RW; ++u) {
            const int r = warp + u * ATTN_SPLIT_WARPS;
            if constexpr (EARLY)
                k[u] = kv_unpack4(early->k[u]);  // i == lane: one group of four a lane covers a row
            else
                k[u] = kv_load4(kbase + (size_t)(PLAIN || r < rows ? r : 0) * kv_stride, i);
        }
        if (!PLAIN) {
#pragma unroll
            for (int u = 0; u < RW; ++u)
                if (j0 + warp + u * ATTN_SPLIT_WARPS == pos) k[u] = knew4[i];
        }
        const float4 qq = q4[i];
#pragma unroll
        for (int u = 0; u < RW; ++u) {
            s[u] = fmaf(qq.x, k[u].x, s[u]);
            s[u] = fmaf(qq.y, k[u].y, s[u]);
            s[u] = fmaf(qq.z, k[u].z, s[u]);
            s[u] = fmaf(qq.w, k[u].w, s[u]);
        }
    }
    TT_MARK(mark + 4);
    const float score = warp_sums_scattered<RW>(s);
    TT_MARK(mark + 5);
    if (lane % (TT_WARP / RW) == 0) {  // one lane for each row: lane 8u holds row u's sum
        const int r = warp + lane / (TT_WARP / RW) * ATTN_SPLIT_WARPS;
        sh.p[r] = PLAIN || r < rows ? score * d.scale : -INFINITY;
    }
    __syncthreads();
    TT_MARK(mark + 6);
    const float s0 = sh.p[lane];
    const float m = warp_max(s0);
    const float e0 = PLAIN || lane < rows ? expf(s0 - m) : 0.0f;
    const float l = warp_sum(e0);
    float* pw = sh.weights + warp * ATTN_CHUNK;
    pw[GROUPED ? (lane % groups) * ATTN_V_COL + lane / groups : lane] = e0;
    __syncwarp();
    TT_MARK(mark + 7);
    float acc = 0.0f;
#pragma unroll
    for (int t0 = 0; t0 < ATTN_CHUNK; t0 += col_rows) {
        if (!PLAIN && t0 >= rows) break;
        if (t0 > 0)
            attn_load_v_col<PLAIN>(vcol, v_cache, sh.vnew, pos, j0, t0, rows, g, dcol, groups, kv_stride, kvh, HD);
#pragma unroll
        for (int q = 0; q < ATTN_V_COL / 4; ++q) {  // rows of k = 4q .. 4q + 3
            float w[4];
            if constexpr (GROUPED) {
                const float4 w4 = reinterpret_cast<const float4*>(pw + g * ATTN_V_COL)[q];
                w[0] = w4.x, w[1] = w4.y, w[2] = w4.z, w[3] = w4.w;
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) w[j] = pw[min(t0 + g + (4 * q + j) * groups, ATTN_CHUNK - 1)];
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int r = t0 + g + (4 * q + j) * groups;
                if (PLAIN || r < rows) acc = fmaf(w[j], vcol[4 * q + j], acc);
            }
        }
    }
    sh.red[g * HD + dcol] = acc;
    __syncthreads();
    TT_MARK(mark + 8);
    if (threadIdx.x < HD) {
        const int hh = threadIdx.x / HD, e = threadIdx.x % HD;
        const float* red = sh.red + hh * ATTN_SPLIT_THREADS;
        float* rec = to.at(h0 + hh, c, d);
        float sum = red[e];
        for (int i = 1; i < groups; ++i) sum += red[i * HD + e];  // ascending group order
        rec[2 + e] = sum;
        if (e == 0) {
            rec[0] = m;
            rec[1] = l;
        }
    }
    __syncthreads();  // p, weights and red are reused by the next chunk; the records are written
}

// Chunk c's record: attn_chunk_records_hd_form (in its PLAIN form where the chunk allows it) with a compile-time
// head_dim, else attn_chunk_record. EARLY (HD > 0 only): on the values attn_chunk_load_hd put in *early.
template <int HD, bool EARLY = false>
__device__ __forceinline__ void attn_chunk_record_for(const kv_t* __restrict__ k_cache,
                                                      const kv_t* __restrict__ v_cache, const AttnRecords& to, int h,
                                                      int c, int pos, const AttnDims& d, AttnShared& sh, int mark,
                                                      const AttnChunkValues* early = nullptr) {
    static_assert(HD > 0 || !EARLY, "early values serve the compiled forms");
    if constexpr (HD > 0) {
        constexpr bool can_be_plain = ATTN_V_COL * (ATTN_SPLIT_THREADS / HD) <= ATTN_CHUNK;
        const AttnHeadsScratch scratch{sh.q, sh.p, &sh.weights[0][0], sh.red, sh.knew, sh.vnew};
        if (can_be_plain && (c + 1) * ATTN_CHUNK <= pos)  // uniform
            attn_chunk_records_hd_form<HD, can_be_plain, EARLY>(k_cache, v_cache, to, h, c, pos, d, scratch, mark,
                                                                early);
        else
            attn_chunk_records_hd_form<HD, false, EARLY>(k_cache, v_cache, to, h, c, pos, d, scratch, mark, early);
    } else
        attn_chunk_record(k_cache, v_cache, to, h, c, pos, d, sh, mark);
}

// Head h's chunks c0, c0 + blocks, ... below n_chunks (this block's): attn_prepare_head, then each chunk's record.
// EARLY (with a compile-time HD): chunk c0's K and V loads go out before the head's norm and rotation, so that their
// round trip overlaps that work instead of following it (the same values in the same arithmetic: the same bits);
// the L2 prefetch of c0's rows, which served the same end, is then left out. The rows before pos are final once the
// wait is over (earlier steps wrote them; this launch writes row pos alone, which the reduction replaces by the new
// token's). The cluster forms take it; the global-merge form measured slower with it (docs/cuda-speed-notes.md #114)
// and keeps the prefetch.
template <int HD, bool EARLY>
__device__ __forceinline__ void attn_head_chunks(const float* qkv, bool q_has_norm, bool k_has_norm, float q_norm_d,
                                                 float k_norm_d, kv_t* k_cache, kv_t* v_cache,
                                                 const float* __restrict__ rope, int h, int pos, bool scores_pos,
                                                 int c0, int n_chunks, int blocks, const AttnRecords& to,
                                                 const AttnDims& d, AttnShared& sh, int mark) {
    const int first_row = c0 * ATTN_CHUNK, first_rows = min(ATTN_CHUNK, pos + 1 - first_row);
    if constexpr (HD > 0 && EARLY) {
        AttnChunkValues first;
        attn_chunk_load_hd<HD>(first, k_cache, v_cache, h / (d.n_heads / d.n_kv_heads), c0, first_rows, d);
        attn_prepare_head<false>(qkv, q_has_norm, k_has_norm, q_norm_d, k_norm_d, k_cache, v_cache, rope, h, pos,
                                 scores_pos, first_row, 0, d, sh, mark);
        attn_chunk_record_for<HD, true>(k_cache, v_cache, to, h, c0, pos, d, sh, mark, &first);
        for (int c = c0 + blocks; c < n_chunks; c += blocks)  // uniform across the block
            attn_chunk_record_for<HD>(k_cache, v_cache, to, h, c, pos, d, sh, mark);
    } else {
        attn_prepare_head<false>(qkv, q_has_norm, k_has_norm, q_norm_d, k_norm_d, k_cache, v_cache, rope, h, pos,
                                 scores_pos, first_row, first_rows, d, sh, mark);
        for (int c = c0; c < n_chunks; c += blocks)  // uniform across the block
            attn_chunk_record_for<HD>(k_cache, v_cache, to, h, c, pos, d, sh, mark);
    }
}

// The merges' table in shared memory: chunk c's (m_c, l_c) side by side, so that the sums read a chunk's pair with
// one 8-byte load where they made two 4-byte ones (6.5 µs off a step at 4,291 positions on an H100,
// docs/cuda-speed-notes.md #124). 8-byte aligned, n_chunks pairs.
//
// The merges' weights: exp(m_c - mx) in place of each chunk's m_c in the table, each computed once, by one thread,
// rather than by every thread that sums an output element (an expf is a dozen dependent instructions, and inside a
// branch a chunk, a 68-chunk run took about 6 µs on an H200). Ends with a barrier.
template <int TEAM>
__device__ __forceinline__ void attn_merge_weights(float2* table, int n_chunks, float mx) {
    for (int c = threadIdx.x; c < n_chunks; c += team_size<TEAM>()) table[c].x = expf(table[c].x - mx);
    team_sync<TEAM>();
}

// A batch of the merge in ascending chunk order: lsum += l_c w_c and a += v_c w_c, one fma each, for the batch's
// chunks below `count` (vals: their values, 0 past count; wl: the batch's (w_c, l_c) in the table). Past count l and
// w are taken as 0, which adds +0 to sums that are never -0 (they start at +0, and under round-to-nearest only
// -0 + -0 gives -0), so the loop needs no branch and the sums' bits are those of skipping those chunks.
__device__ __forceinline__ void attn_merge_batch(const float (&vals)[ATTN_MERGE_BATCH], const float2* wl, int count,
                                                 float& lsum, float& a) {
#pragma unroll
    for (int j = 0; j < ATTN_MERGE_BATCH; ++j) {
        const int k = min(j, count - 1);  // loads of entries in the batch, never skipped: they go out together
        const float2 t = wl[k];
        const float wk = t.x, lk = t.y;
        const bool in = j < count;
        const float wj = in ? wk : 0.0f, lj = in ? lk : 0.0f;
        lsum = fmaf(lj, wj, lsum);
        a = fmaf(vals[j], wj, a);
    }
}

// Values of output element e of chunks c0 .. c0 + ATTN_MERGE_BATCH - 1 (head records ph), 0 for chunks from c_end on
// or where !load. Index: e's type as the caller has it (an unsigned threadIdx.x taken as an int changed the
// attention kernels' machine code).
template <class Index>
__device__ __forceinline__ void attn_merge_load_values(float (&vals)[ATTN_MERGE_BATCH], const float* ph, int c0,
                                                       int c_end, int head_dim, Index e, bool load = true) {
#pragma unroll
    for (int j = 0; j < ATTN_MERGE_BATCH; ++j)
        vals[j] = load && c0 + j < c_end ? __ldcg(ph + (c0 + j) * (head_dim + 2) + 2 + e) : 0.0f;
}

// The merge of attn_count_and_merge up to ATTN_MERGE_SPLIT chunks, in one round of loads: the first warp takes every
// chunk's (m, l), works out the max with a butterfly (exact in any order) and writes each chunk's (weight, l) into
// the table itself; each output element's thread takes its first ATTN_MERGE_BATCH chunk values into registers, and
// where the block has a second head_dim threads (HAND: 2 * head_dim <= the team) those take the element's next
// ATTN_MERGE_BATCH values and hand them over through shared memory after the table, so the sums need not load them
// after the first batch (an L2 round trip later). One barrier; the merge arithmetic runs in ascending chunk order.
// ph: head h's records. table: room for ATTN_MERGE_SPLIT pairs, then, with HAND, ATTN_MERGE_BATCH * head_dim floats.
// Out of line: the kernels around it measured a few µs a step faster so, with the same bits (docs/cuda-speed-notes.md
// #127); attn_merge_split stays inline, since out of line it measured slower at long contexts.
// HD > 0: head_dim is that compile-time constant and the first round's loads are addressed from one base pointer
// (the short kernels' form, #133; the other kernels keep HD = 0, whose machine code measured best with them).
template <int TEAM, class Store, int HD = 0>
__device__ __noinline__ void attn_merge_serial(const float* ph, Store store, int h, int n_chunks, int head_dim,
                                               float2* table, int mark) {
    if constexpr (HD > 0) head_dim = HD;
    const bool active = threadIdx.x < head_dim;
    const bool hand = n_chunks > ATTN_MERGE_BATCH && 2 * head_dim <= (int)team_size<TEAM>();  // uniform
    const bool handing = hand && !active && threadIdx.x < 2 * head_dim;
    const unsigned e = active ? threadIdx.x : threadIdx.x - head_dim;
    float* handed = reinterpret_cast<float*>(table + ATTN_MERGE_SPLIT);
    float vals[ATTN_MERGE_BATCH];
    if constexpr (HD > 0) {  // attn_merge_load_values's values
        const int c0 = active ? 0 : ATTN_MERGE_BATCH;
        const float* p = ph + c0 * (head_dim + 2) + 2 + e;
#pragma unroll
        for (int j = 0; j < ATTN_MERGE_BATCH; ++j)
            vals[j] = (active || handing) && c0 + j < n_chunks ? __ldcg(p + j * (head_dim + 2)) : 0.0f;
    } else {
        attn_merge_load_values(vals, ph, active ? 0 : ATTN_MERGE_BATCH, n_chunks, head_dim, e, active || handing);
    }
    if (threadIdx.x < TT_WARP) {  // n_chunks <= ATTN_MERGE_SPLIT = one chunk a lane
        const int c = threadIdx.x;
        const bool has = c < n_chunks;
        const float m = has ? __ldcg(ph + c * (head_dim + 2)) : -INFINITY;
        const float l = has ? __ldcg(ph + c * (head_dim + 2) + 1) : 0.0f;
        const float mx = warp_max(m);
        if (has) table[c] = make_float2(expf(m - mx), l);
    }
    if (handing) {
#pragma unroll
        for (int j = 0; j < ATTN_MERGE_BATCH; ++j) handed[j * head_dim + e] = vals[j];
    }
    team_sync<TEAM>();
    TT_MARK(mark + 11);
    TT_MARK(mark + 13);
    if (active) {
        float lsum = 0.0f, a = 0.0f;
        for (int c0 = 0; c0 < n_chunks; c0 += ATTN_MERGE_BATCH) {
            if (c0 > 0) {
                if (hand) {
#pragma unroll
                    for (int j = 0; j < ATTN_MERGE_BATCH; ++j) vals[j] = handed[j * head_dim + e];
                } else {
                    attn_merge_load_values(vals, ph, c0, n_chunks, head_dim, threadIdx.x);
                }
            }
            attn_merge_batch(vals, table + c0, n_chunks - c0, lsum, a);
        }
        TT_MARK(mark + 14);
        store(h * head_dim + threadIdx.x, a / lsum);
    }
}

// The merge past ATTN_MERGE_SPLIT chunks, where its serial chain is what long contexts wait for
// (docs/cuda-speed-notes.md #75): the chunks' max by a block reduction (exact in any order), and the block's
// blockDim / head_dim parts each merging a contiguous run of the chunks as attn_merge_serial does; the parts' sums
// are added in part order. The arithmetic depends on n_chunks and head_dim alone, never on the grid. Its run loop
// repeats attn_merge_serial's rather than sharing it: a shared form changed the short contexts' machine code, and
// one such form measured slower at 708 positions (#76).
template <int TEAM, class Store>
__device__ __forceinline__ void attn_merge_split(const float* ph, Store store, int h, int n_chunks, int head_dim,
                                                 AttnShared& sh, float2* table, int mark) {
    // at most 16 (head_dim >= 16): sh.scratch[32 ..] holds their l
    const int parts = (int)team_size<TEAM>() / head_dim;
    const int part = threadIdx.x / head_dim, e = threadIdx.x % head_dim;
    const int per_part = (n_chunks + parts - 1) / parts;
    const int c_begin = min(n_chunks, part * per_part), c_end = min(n_chunks, c_begin + per_part);
    const bool merging = part < parts;  // false only past parts * head_dim threads (head_dim 96)
    float vals[ATTN_MERGE_BATCH];
    attn_merge_load_values(vals, ph, c_begin, c_end, head_dim, e, merging);
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < n_chunks; c += team_size<TEAM>()) {
        const float m = __ldcg(ph + c * (head_dim + 2));
        table[c] = make_float2(m, __ldcg(ph + c * (head_dim + 2) + 1));
        mx = fmaxf(mx, m);
    }
    mx = block_max<TEAM>(mx, sh.scratch);  // its barriers also publish the table
    TT_MARK(mark + 11);
    attn_merge_weights<TEAM>(table, n_chunks, mx);  // no thread reads the maxima any more
    TT_MARK(mark + 13);
    float lsum = 0.0f, a = 0.0f;
    if (merging) {
        for (int c0 = c_begin; c0 < c_end; c0 += ATTN_MERGE_BATCH) {
            if (c0 > c_begin) attn_merge_load_values(vals, ph, c0, c_end, head_dim, e);
            attn_merge_batch(vals, table + c0, c_end - c0, lsum, a);
        }
        sh.red[threadIdx.x] = a;
        if (e == 0) sh.scratch[32 + part] = lsum;
    }
    team_sync<TEAM>();
    TT_MARK(mark + 14);
    if (threadIdx.x < head_dim) {
        a = sh.red[threadIdx.x];
        lsum = sh.scratch[32];
        for (int p = 1; p < parts; ++p) {  // part order
            a += sh.red[p * head_dim + threadIdx.x];
            lsum += sh.scratch[32 + p];
        }
        store(h * head_dim + threadIdx.x, a / lsum);
    }
}

// Counts this block's records of head h in (`arrivals` of `done[h]`'s `expected`); the block that brings the count to
// `expected` merges the head's n_chunks records in ascending order, store(i, value) taking output element i, and
// (reset) sets the counter back to zero. Which block merges changes nothing. table: room for n_chunks pairs in shared
// memory, 8-byte aligned (attn_merge_weights). Uniform across the block.
// The barrier that ends the last chunk orders the block's record writes before thread 0's count, whose release
// (cumulative) publishes them; the merging block's count is also an acquire, and the barrier after it orders its
// threads' reads of the other blocks' records after it. One acq_rel atomic instead of two full fences around a
// relaxed one.
// SHORT: at most ATTN_MERGE_SPLIT chunks (the host's promise; more traps), so the split merge is not compiled in,
// and the serial merge takes the compiled head_dim HD.
template <int TEAM, class Store, int HD = 0, bool SHORT = false>
__device__ __forceinline__ void attn_count_and_merge_to(float* __restrict__ partial, Store store, bool reset,
                                                        int* __restrict__ done, int h, int n_chunks, int expected,
                                                        const AttnDims& d, AttnShared& sh, float2* table,
                                                        int mark) {
    const int head_dim = d.head_dim;
    TT_MARK(mark + 9);
    if (threadIdx.x == 0) {
        int before;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(before) : "l"(done + h) : "memory");
        sh.merge = before == expected - 1;
    }
    team_sync<TEAM>();
    TT_MARK(mark + 10);
    if (!sh.merge) return;
    const float* ph = partial + (size_t)h * d.max_chunks * (head_dim + 2);
    if constexpr (SHORT) {
        if (n_chunks > ATTN_MERGE_SPLIT) __trap();  // a context the short kernels were not chosen for
        attn_merge_serial<TEAM, Store, HD>(ph, store, h, n_chunks, head_dim, table, mark);
    } else if (n_chunks > ATTN_MERGE_SPLIT) {  // uniform
        attn_merge_split<TEAM>(ph, store, h, n_chunks, head_dim, sh, table, mark);
    } else {
        attn_merge_serial<TEAM>(ph, store, h, n_chunks, head_dim, table, mark);
    }
    if (reset && threadIdx.x == 0) done[h] = 0;  // ready for the next use (a later launch, or the next layer)
    TT_MARK(mark + 12);
}

// attn_count_and_merge's store: plain floats. The index is unsigned, as the expression it replaces was, so the
// layered kernels' machine code is what it was before the store became a parameter.
struct AttnStoreOut {
    float* __restrict__ out;
    __device__ __forceinline__ void operator()(unsigned i, float v) const { out[i] = v; }
};

template <int TEAM = 0, int HD = 0, bool SHORT = false>
__device__ __forceinline__ void attn_count_and_merge(float* __restrict__ partial, float* __restrict__ out,
                                                     int* __restrict__ done, int h, int n_chunks, int expected,
                                                     const AttnDims& d, AttnShared& sh, float2* table, int mark) {
    attn_count_and_merge_to<TEAM, AttnStoreOut, HD, SHORT>(partial, AttnStoreOut{out}, true, done, h, n_chunks,
                                                           expected, d, sh, table, mark);
}

__device__ __forceinline__ float* AttnRecords::at(int h, int c, const AttnDims& d) const {
    return cluster ? cluster_map(records + c * ATTN_RECORD_FLOATS, 0)
                   : partial + ((size_t)h * d.max_chunks + c) * (d.head_dim + 2);
}

// out[h * head_dim + d] from the n_chunks (at most ATTN_CLUSTER) records of head h at records[c * stride] (this
// block's shared memory): attn_count_and_merge's arithmetic, in its order. Out of line, as attn_merge_serial: the
// cluster kernels measured faster so, with the same bits (docs/cuda-speed-notes.md #128).
__device__ __noinline__ void attn_merge_local(const float* records, int stride, float* __restrict__ out, int h,
                                              int n_chunks, int head_dim) {
    if (threadIdx.x >= head_dim) return;
    float mx = -INFINITY;
    for (int c = 0; c < n_chunks; ++c) mx = fmaxf(mx, records[c * stride]);
    float lsum = 0.0f, a = 0.0f;
    // Unrolled over the table's ATTN_CLUSTER rows with no branch, so that the weights' expf chains overlap; the rows
    // past n_chunks add +0 (as in attn_merge_batch).
#pragma unroll
    for (int c = 0; c < ATTN_CLUSTER; ++c) {
        const bool in = c < n_chunks;
        const float* rec = records + min(c, n_chunks - 1) * stride;
        const float m = rec[0], l = rec[1], v = rec[2 + threadIdx.x];
        const float w = in ? expf(m - mx) : 0.0f;
        lsum = fmaf(in ? l : 0.0f, w, lsum);
        a = fmaf(in ? v : 0.0f, w, a);
    }
    out[h * head_dim + threadIdx.x] = a / lsum;
}

// grid (n_heads, any number of blocks; CLUSTER: a multiple of ATTN_CLUSTER); block ATTN_SPLIT_THREADS. The first
// `blocks` of a head's blocks take its chunks (block b every blocks-th from chunk b), the others leave at once
// (CLUSTER: blocks is the grid's). partial holds n_heads * max_chunks records of head_dim + 2 floats; done holds
// n_heads zeroed counters (left zeroed). qkv is the new token's raw q|k|v.
// HD > 0: head_dim is that compile-time constant (the argument must equal it, else it traps), so with the block of
// ATTN_SPLIT_THREADS threads that every attention_decode kernel assumes the chunk loops compile for their exact trip
// counts: the same arithmetic in the same order, fewer instructions.
// SHORT (with HD > 0, without CLUSTER): attn_count_and_merge_to's short form, for contexts of at most
// ATTN_MERGE_SPLIT chunks (the attention_decode_short kernels).
template <bool CLUSTER, int HD = 0, bool SHORT = false>
__device__ __forceinline__ void attention_decode_body(const float* __restrict__ qkv, const bf16_t* __restrict__ q_norm,
                                                      const bf16_t* __restrict__ k_norm, kv_t* __restrict__ k_cache,
                                                      kv_t* __restrict__ v_cache, float* __restrict__ partial,
                                                      float* __restrict__ out, int* __restrict__ done,
                                                      const int* pos_ptr, int pos_host, int n_heads, int n_kv_heads,
                                                      int head_dim, float scale, const float* __restrict__ rope,
                                                      float eps, int max_chunks, int blocks) {
    const int mark = (blockIdx.x * gridDim.y + blockIdx.y) * ATTN_TRACE_PROBES;  // this block's TT_MARK slots
    TT_MARK(mark);
    static_assert(!SHORT || (HD > 0 && !CLUSTER), "the short form is compiled for a head_dim, global merge only");
    if constexpr (HD > 0) {
        if (head_dim != HD) __trap();
        head_dim = HD;
    }
    const int h = blockIdx.x;
    const bool active = threadIdx.x < head_dim;
    // Norm weights are never written by a kernel: read them before waiting for the qkv GEMV.
    const float q_norm_d = active && q_norm ? bf16_to_float(q_norm[threadIdx.x]) : 0.0f;
    const float k_norm_d = active && k_norm ? bf16_to_float(k_norm[threadIdx.x]) : 0.0f;
    pdl_enter();
    TT_MARK(mark + 1);
    __shared__ AttnShared sh;
    // The merging block's table (attn_merge_weights), or the cluster merge's records.
    __shared__ __align__(16) float merge_ml[2][ATTN_MERGE_MAX_CHUNKS];
    float2* table = reinterpret_cast<float2*>(&merge_ml[0][0]);
    const AttnDims& d{n_heads, n_kv_heads, head_dim, max_chunks, scale, eps};
    const int pos = host_or_device(pos_ptr, pos_host), length = pos + 1;
    const int n_chunks = (length + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const int last_chunk = pos / ATTN_CHUNK;
    // Uniform: this block scores row pos.
    const bool scores_pos = (unsigned)last_chunk % (unsigned)blocks == blockIdx.y;
    // Three blocks fit an SM (the launch bounds hold registers to 80), so a head's 24 blocks (the host's grid) stay
    // one wave up to 768 positions.
    // Blocks without a chunk (short contexts) leave at once, freeing their SM for the next kernel's blocks, which
    // start loading their weights (programmatic launch); the merge counts only the blocks that have chunks.
    const int working = min(blocks, n_chunks);
    if constexpr (CLUSTER) {
        // At most ATTN_CLUSTER chunks: every chunk sits in the head's first cluster (chunk c in its block c) and is
        // merged there. Each of its blocks writes its record into the first block's table (that block's merge_ml)
        // and arrives at the cluster barrier with release; only the first block waits (acquire), merges and
        // writes out. The other clusters' blocks leave at once, and so do the first cluster's once they have
        // arrived (nothing reads their shared memory). Longer contexts take the counter and global records.
        // (A branch of its own, so that attention_decode's machine code stays the one measured.)
        const bool in_cluster = n_chunks <= ATTN_CLUSTER;
        if (blockIdx.y >= (in_cluster ? ATTN_CLUSTER : working)) return;
        float* records = &merge_ml[0][0];
        if ((int)blockIdx.y < n_chunks) {
            attn_head_chunks<HD, true>(qkv, q_norm != nullptr, k_norm != nullptr, q_norm_d, k_norm_d, k_cache,
                                       v_cache, rope, h, pos, scores_pos, blockIdx.y, n_chunks, blocks,
                                       AttnRecords{partial, records, in_cluster}, d, sh, mark);
        }
        if (!in_cluster) {
            attn_count_and_merge(partial, out, done, h, n_chunks, working, d, sh, table, mark);
            return;
        }
        TT_MARK(mark + 9);
        // The barrier that ends a record orders every thread's writes before its arrival's release.
        cluster_arrive();
        TT_MARK(mark + 10);
        if (cluster_rank() != 0) return;
        cluster_wait();
        TT_MARK(mark + 11);
        attn_merge_local(records, ATTN_RECORD_FLOATS, out, h, n_chunks, head_dim);
        TT_MARK(mark + 12);
        return;
    }
    if (blockIdx.y >= working) return;
    attn_head_chunks<HD, false>(qkv, q_norm != nullptr, k_norm != nullptr, q_norm_d, k_norm_d, k_cache, v_cache,
                                rope, h, pos, scores_pos, blockIdx.y, n_chunks, blocks,
                                AttnRecords{partial, nullptr, false}, d, sh, mark);
    attn_count_and_merge<0, SHORT ? HD : 0, SHORT>(partial, out, done, h, n_chunks, working, d, sh, table, mark);
}

#define ATTN_DECODE_PARAMS                                                                                             \
    const float* __restrict__ qkv, const bf16_t* __restrict__ q_norm, const bf16_t* __restrict__ k_norm,               \
        kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache, float* __restrict__ partial,                           \
        float* __restrict__ out, int* __restrict__ done, const int* pos_ptr, int pos_host, int n_heads,                \
        int n_kv_heads, int head_dim, float scale, const float* __restrict__ rope, float eps, int max_chunks
#define ATTN_DECODE_ARGS                                                                                               \
    qkv, q_norm, k_norm, k_cache, v_cache, partial, out, done, pos_ptr, pos_host, n_heads, n_kv_heads, head_dim,       \
        scale, rope, eps, max_chunks, gridDim.y

extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS, 3) attention_decode(ATTN_DECODE_PARAMS) {
    attention_decode_body<false>(ATTN_DECODE_ARGS);
}

extern "C" __global__ void __cluster_dims__(1, ATTN_CLUSTER, 1) __launch_bounds__(ATTN_SPLIT_THREADS, 3)
    attention_decode_cluster(ATTN_DECODE_PARAMS) {
    attention_decode_body<true>(ATTN_DECODE_ARGS);
}

// attention_decode and attention_decode_cluster compiled for head_dim 128 and 64 (the same bits, fewer instructions).
extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS, 3) attention_decode_hd128(ATTN_DECODE_PARAMS) {
    attention_decode_body<false, 128>(ATTN_DECODE_ARGS);
}

extern "C" __global__ void __cluster_dims__(1, ATTN_CLUSTER, 1) __launch_bounds__(ATTN_SPLIT_THREADS, 3)
    attention_decode_cluster_hd128(ATTN_DECODE_PARAMS) {
    attention_decode_body<true, 128>(ATTN_DECODE_ARGS);
}

extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS, 3) attention_decode_hd64(ATTN_DECODE_PARAMS) {
    attention_decode_body<false, 64>(ATTN_DECODE_ARGS);
}

extern "C" __global__ void __cluster_dims__(1, ATTN_CLUSTER, 1) __launch_bounds__(ATTN_SPLIT_THREADS, 3)
    attention_decode_cluster_hd64(ATTN_DECODE_PARAMS) {
    attention_decode_body<true, 64>(ATTN_DECODE_ARGS);
}

// attention_decode_hd128 and _hd64 for contexts of at most ATTN_MERGE_SPLIT chunks (the host takes them for requests
// that stay within SHORT_ATTENTION_POSITIONS; a longer context traps): the same bits, without the split merge, and
// measured faster at 300 and 708 positions (docs/cuda-speed-notes.md #133).
extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS, 3) attention_decode_short_hd128(ATTN_DECODE_PARAMS) {
    attention_decode_body<false, 128, true>(ATTN_DECODE_ARGS);
}

extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS, 3) attention_decode_short_hd64(ATTN_DECODE_PARAMS) {
    attention_decode_body<false, 64, true>(ATTN_DECODE_ARGS);
}

// A forced chain's tokens (*count of them, 2 or more, at positions *pos_ptr .. *pos_ptr + *count - 1; their raw
// q|k|v rows one after the other in qkv). attention_chain_rows first writes every token's K/V cache row (the prefill
// kernel's values, which are the decode kernel's bits); then attention_decode_chain runs attention_decode's body for
// token blockIdx.z, which reads the chain's earlier rows from the cache, so each token's output is the bits a
// decode step at its position gives. partial and done hold a head set's records and counters per token.
// grid (chain tokens, n_kv_heads), block max(32, head_dim).
extern "C" __global__ void attention_chain_rows(const float* __restrict__ qkv, const bf16_t* __restrict__ k_norm,
                                                kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache,
                                                const int* pos_ptr, const int* count, int n_heads, int n_kv_heads,
                                                int head_dim, const float* __restrict__ rope, float eps) {
    pdl_enter();
    __shared__ float head[256];
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    if (t >= *count) return;  // uniform per block
    const float* row = qkv + (size_t)t * (n_heads + 2 * n_kv_heads) * head_dim;
    kv_row_to_cache(row, k_norm, k_cache, v_cache, *pos_ptr + t, blockIdx.y, n_heads, n_kv_heads, head_dim, rope, eps,
                    head, scratch);
}

// grid (n_heads, blocks per head, chain tokens). The global-merge form shares a head's blocks out among the chain's
// tokens (gridDim.y / *count each, at least one), so a chain's launch keeps the grid's size whatever its length;
// the cluster form keeps its whole clusters per token.
template <bool CLUSTER, int HD = 0>
__device__ __forceinline__ void attention_decode_chain_body(
    const float* __restrict__ qkv, const bf16_t* __restrict__ q_norm, const bf16_t* __restrict__ k_norm,
    kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache, float* __restrict__ partial, float* __restrict__ out,
    int* __restrict__ done, const int* pos_ptr, const int* count, int n_heads, int n_kv_heads, int head_dim,
    float scale, const float* __restrict__ rope, float eps, int max_chunks) {
    pdl_enter();
    const int t = blockIdx.z, tokens = *count;
    if (t >= tokens) return;  // uniform per cluster: a cluster spans blockIdx.y only
    const int blocks = CLUSTER ? (int)gridDim.y : max(1, (int)gridDim.y / tokens);
    const size_t qkv_width = (size_t)(n_heads + 2 * n_kv_heads) * head_dim;
    attention_decode_body<CLUSTER, HD>(qkv + t * qkv_width, q_norm, k_norm, k_cache, v_cache,
                                       partial + (size_t)t * n_heads * max_chunks * (head_dim + 2),
                                       out + (size_t)t * n_heads * head_dim, done + t * n_heads, nullptr,
                                       *pos_ptr + t, n_heads, n_kv_heads, head_dim, scale, rope, eps, max_chunks,
                                       blocks);
}

#define ATTN_CHAIN_PARAMS                                                                                              \
    const float* __restrict__ qkv, const bf16_t* __restrict__ q_norm, const bf16_t* __restrict__ k_norm,               \
        kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache, float* __restrict__ partial,                           \
        float* __restrict__ out, int* __restrict__ done, const int* pos_ptr, const int* count, int n_heads,            \
        int n_kv_heads, int head_dim, float scale, const float* __restrict__ rope, float eps, int max_chunks
#define ATTN_CHAIN_ARGS                                                                                                \
    qkv, q_norm, k_norm, k_cache, v_cache, partial, out, done, pos_ptr, count, n_heads, n_kv_heads, head_dim,          \
        scale, rope, eps, max_chunks

extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS, 3) attention_decode_chain(ATTN_CHAIN_PARAMS) {
    attention_decode_chain_body<false>(ATTN_CHAIN_ARGS);
}

extern "C" __global__ void __cluster_dims__(1, ATTN_CLUSTER, 1) __launch_bounds__(ATTN_SPLIT_THREADS, 3)
    attention_decode_chain_cluster(ATTN_CHAIN_PARAMS) {
    attention_decode_chain_body<true>(ATTN_CHAIN_ARGS);
}

// The chain forms compiled for head_dim 128 and 64 (the same bits, fewer instructions).
extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS, 3) attention_decode_chain_hd128(ATTN_CHAIN_PARAMS) {
    attention_decode_chain_body<false, 128>(ATTN_CHAIN_ARGS);
}

extern "C" __global__ void __cluster_dims__(1, ATTN_CLUSTER, 1) __launch_bounds__(ATTN_SPLIT_THREADS, 3)
    attention_decode_chain_cluster_hd128(ATTN_CHAIN_PARAMS) {
    attention_decode_chain_body<true, 128>(ATTN_CHAIN_ARGS);
}

extern "C" __global__ void __launch_bounds__(ATTN_SPLIT_THREADS, 3) attention_decode_chain_hd64(ATTN_CHAIN_PARAMS) {
    attention_decode_chain_body<false, 64>(ATTN_CHAIN_ARGS);
}

extern "C" __global__ void __cluster_dims__(1, ATTN_CLUSTER, 1) __launch_bounds__(ATTN_SPLIT_THREADS, 3)
    attention_decode_chain_cluster_hd64(ATTN_CHAIN_PARAMS) {
    attention_decode_chain_body<true, 64>(ATTN_CHAIN_ARGS);
}
