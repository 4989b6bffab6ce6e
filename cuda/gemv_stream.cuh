// Decode GEMV with the weights streamed into shared memory by the copy unit (cp.async.bulk): the rows, sums and bits
// of gemv_bf16 (and gemv_swiglu_bf16) with one warp per row, but a weight passes through no register until it is
// used, so each warp keeps several row pieces in flight at little register cost.
//
// Why: at batch 1 each launch starts with its weight stream cold, and what a block has in flight before it may read
// its input decides how much of the launch boundary the stream hides. Warp w of a block reduces rows g * 8 + w of
// the block's row groups g; it cuts each row into pieces of up to GSTREAM_TILE_K columns (4 KB) and keeps a ring of
// `stages` pieces in shared memory. Its lane 0 fills the ring before the kernel waits for the one before (weights
// are never written by a kernel), and refills each slot with the piece `stages` ahead as soon as the warp has
// reduced it. Warps never wait for each other after staging the input.
//
// The arithmetic: lane l takes a piece's 16-byte chunks l, l + 32, ..., so across a row's pieces it visits chunks
// l, l + 32, l + 64, ... in ascending order, as gemv_bf16's lane does with one warp per row; the warp folds with the
// same butterfly, and the writer adds bias and residual (or takes silu_mul of the gate and up rows) as gemv_bf16
// (gemv_swiglu_bf16) does. Block b owns row groups b, b + gridDim.x, ... of the G groups of 8 output rows, as
// gemv_bf16's blocks do; any grid up to G covers every row once, and the grid changes no result.
// The chain forms (gemv_stream_chain_*) take a forced chain's 2 to GSTREAM_CHAIN_TOKENS tokens in one pass over the
// weights: every token's input row is staged, and each chunk a lane reads from the ring goes into every token's sum,
// in the order above, so each token's row is the single-token kernel's bits. A SwiGLU chain whose rows are one piece
// each and whose ring holds pairs reduces a group's gate and up rows together, reading each staged input once for
// both; a chain's lanes unroll 2 chunks, not 8, so that its MT sums per chunk fit 128 registers. The chain forms also
// come in blocks of 16 warps (gemv_stream_chain16_*, one an SM), which stage the tokens' rows once for all 16 warps
// and reduce a warp's plain rows two at a time as well where the ring holds pairs.
// The FP8 forms (gemv_stream_fp8, gemv_stream_swiglu_fp8; single token only) read e4m3 weights with one float
// scale per row, a power of two (decoder_service/models/fp8.py). A piece is 4,096 columns (4 KB, or the whole row
// when shorter) and lane l reads its 8-byte chunks l, l + 32, ...: the chunks of 8 columns that the bf16 kernel's
// lane l reads, in the same order. Each weight is converted exactly (e4m3 -> f16 -> f32) and the row's sum is
// multiplied by its scale after the butterfly: rounding commutes with scaling by a power of two, so the result is
// the bits of the bf16 kernel on the dequantized weights (code * scale) as long as no partial sum is an fp32
// subnormal (below 2^-126), which activations and weights of real models never reach.
// Requires K % 8 == 0, as gemv_bf16 (the FP8 forms: K % 16 == 0, 16-byte rows). Dynamic shared memory:
// stages * GEMV_WARPS * gstream_slot_bytes(K, bytes per weight) + K * 4 bytes (the chain forms: stages *
// GSTREAM_TILE_BYTES + GSTREAM_CHAIN_TOKENS * K * 4).
#pragma once
#include <cuda_fp8.h>

#include "async_copy.cuh"
#include "common.cuh"
#include "gemv.cuh"

#define GSTREAM_TILE_K 2048  // columns of a bf16 row piece (a multiple of 256, so a lane's chunks stay in order)
#define GSTREAM_PIECE_BYTES (GSTREAM_TILE_K * 2)  // a row piece's bytes, at most
#define GSTREAM_TILE_BYTES (GEMV_WARPS * GSTREAM_PIECE_BYTES)  // one piece per warp: the shared memory of a stage
#define GSTREAM_MAX_STAGES 6
#define GSTREAM_THREADS (GEMV_WARPS * TT_WARP)
#define GSTREAM_CHAIN_TOKENS 4  // the most tokens gemv_stream_chain takes (a forced chain's forward pass)
#define GSTREAM_WIDE_WARPS 16  // warps of the chain forms' wide blocks (gemv_stream_chain16_*)
static_assert(GSTREAM_CHAIN_TOKENS == 4, "gemv_stream_chain's switch covers 2, 3 and 4 tokens");

// Which piece of which row a warp streams next: its rows are g * WARPS + warp for the block's groups g, in order; a
// SwiGLU group's gate row comes before its up row; a row's pieces go left to right.
struct GstreamCursor {
    int g, p, kt;
    __device__ __forceinline__ void advance(int k_tiles, int passes) {
        if (++kt == k_tiles) {
            kt = 0;
            if (++p == passes) {
                p = 0;
                g += gridDim.x;
            }
        }
    }
};

// Two e4m3 weights (the low byte first) as floats, exactly: the hardware's e4m3x2 -> f16x2 conversion, then f16 ->
// f32 (HADD2.F32, on the fp32 pipe). Building the fp32 bits with integer operations instead measured slower on an
// H200 (docs/cuda-speed-notes.md #96).
__device__ __forceinline__ void e4m3x2_to_float(uint32_t pair, float& lo, float& hi) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    lo = f.x;
    hi = f.y;
}

// gemv_fma_chunk for 8 e4m3 weights (8 bytes: columns 8c .. 8c + 7), in the same order of fmas.
__device__ __forceinline__ float gemv_fma_chunk_e4m3(float acc, const uint2 w, const float4 xa, const float4 xb) {
    float w0, w1, w2, w3, w4, w5, w6, w7;
    e4m3x2_to_float(w.x & 0xFFFFu, w0, w1);
    e4m3x2_to_float(w.x >> 16, w2, w3);
    e4m3x2_to_float(w.y & 0xFFFFu, w4, w5);
    e4m3x2_to_float(w.y >> 16, w6, w7);
    return gemv_fma8(acc, w0, w1, w2, w3, w4, w5, w6, w7, xa, xb);
}

// Bytes of a ring slot for K-wide rows of weights of `wb` bytes: a full piece for bf16 (the layout measured), the
// row itself where an fp8 row is shorter than a piece (fp8 rows are multiples of 16 bytes).
__host__ __device__ constexpr int gstream_slot_bytes(int K, int wb) {
    return wb == 2 || K * wb > GSTREAM_PIECE_BYTES ? GSTREAM_PIECE_BYTES : K * wb;
}

// One warp's weight stream: its ring of pieces in shared memory, their barriers and the cursor of the next piece
// lane 0 requests. WARPS: the block's warps (8, or 16 for the chain forms' wide blocks). WT: the weights' type,
// bf16_t or an e4m3 byte (uint8_t; `scale` then holds the rows' scales).
template <int WARPS, typename WT = bf16_t>
struct GstreamWarp {
    static constexpr int TILE = GSTREAM_PIECE_BYTES / sizeof(WT);  // columns of a piece
    const WT* W;
    const float* scale;
    unsigned char* ring;
    uint64_t* full;
    uint64_t policy;
    GstreamCursor next;
    int N, K, k_tiles, passes, stages, pieces, warp;
    __device__ __forceinline__ int slot_bytes() const { return gstream_slot_bytes(K, sizeof(WT)); }
    __device__ __forceinline__ void issue(int slot) {  // lane 0: the next piece into the slot
        const int row = next.p * (N / 2) + next.g * WARPS + warp;
        const int col = next.kt * TILE, width = min(TILE, K - col);
        const uint32_t bytes = width * sizeof(WT);
        mbar_arrive_expect_tx(&full[slot], bytes);
        bulk_copy_to_shared(ring + slot * slot_bytes(), W + (size_t)row * K + col, bytes, &full[slot], policy);
        next.advance(k_tiles, passes);
    }
};

// The warp's stream set up and its ring filled: only weights so far, which no kernel writes, so the ring fills
// while the kernel before still runs. `full` is the warp's GSTREAM_MAX_STAGES barriers.
template <bool SWIGLU, int WARPS = GEMV_WARPS, typename WT = bf16_t>
__device__ __forceinline__ GstreamWarp<WARPS, WT> gemv_stream_start(const WT* __restrict__ W,
                                                                    const float* __restrict__ scale, int N, int K,
                                                                    int stages, unsigned char* smem, uint64_t* full) {
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    const int out_rows = SWIGLU ? N / 2 : N;
    constexpr int passes = SWIGLU ? 2 : 1;  // a group's gate row, then its up row
    stages = max(1, min(stages, GSTREAM_MAX_STAGES));  // the host sizes shared memory for its own value
    // This warp's groups: blockIdx.x, then every gridDim.x-th, up to the last that holds its row (the last group
    // may have fewer than 8 rows). At any moment the blocks read neighbouring groups, so the weight stream stays
    // spread over the whole memory rather than over as many distant regions as there are blocks.
    const int warp_groups = (out_rows - warp + WARPS - 1) / WARPS;
    const int my_groups = blockIdx.x < warp_groups ? (warp_groups - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    using Stream = GstreamWarp<WARPS, WT>;
    const int k_tiles = (K + Stream::TILE - 1) / Stream::TILE;
    Stream st{W,
              scale,
              smem + (size_t)warp * stages * gstream_slot_bytes(K, sizeof(WT)),
              full,
              l2_evict_first_policy(),  // weights are read once per step
              GstreamCursor{(int)blockIdx.x, 0, 0},
              N,
              K,
              k_tiles,
              passes,
              stages,
              my_groups * passes * k_tiles,
              warp};
    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1);  // the issuing arrival, plus the bytes
        mbar_init_fence();
    }
    __syncwarp();
    if (lane == 0)
        for (int s = 0; s < min(stages, st.pieces); ++s) st.issue(s);
    return st;
}

// The input rows of a forced chain's MT tokens (rows 0 .. MT - 1 of x) staged as gemv_stage_input<true> stages each.
// Normalised rows that fit one batch load in one round and share one block reduction of their sums of squares
// (block_sums: block_sum's tree per token); other rows go one token after another. The same values, slot for slot,
// as MT calls of gemv_stage_input<true>.
template <int MT>
__device__ __forceinline__ void gemv_stage_chain_inputs(float4* __restrict__ xs4, const float* __restrict__ x,
                                                        const bf16_t* __restrict__ norm_w, int x_mode, float eps,
                                                        int K, float* scratch) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int k4 = K / 4, stride = blockDim.x;
    auto slot = [K](int e) { return (e % 2) * (K / 8) + e / 2; };
    if (x_mode != GEMV_IN_RMSNORM) {  // plain rows one token after another: one run of loads measured slower
        for (int t = 0; t < MT; ++t)
            gemv_stage_input<true>(xs4 + t * k4, x + (size_t)t * K, norm_w, x_mode, eps, K, scratch);
        return;
    }
    // Normalised rows wider than one batch: likewise. (A separate branch: folded into the one above, ptxas spills
    // the chain kernels at their 128 registers.)
    if (k4 > GEMV_STAGE_BATCH * stride) {
#pragma unroll 1
        for (int t = 0; t < MT; ++t)
            gemv_stage_input<true>(xs4 + t * k4, x + (size_t)t * K, norm_w, x_mode, eps, K, scratch);
        return;
    }
    float4 v[MT][GEMV_STAGE_BATCH];
    uint2 w[GEMV_STAGE_BATCH];
    const uint2* w4 = reinterpret_cast<const uint2*>(norm_w);
#pragma unroll
    for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
        const int e = threadIdx.x + i * stride;
        if (e < k4) {
            w[i] = w4[e];
#pragma unroll
            for (int t = 0; t < MT; ++t) v[t][i] = x4[t * k4 + e];
        }
    }
    float ss[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
        ss[t] = 0.0f;
#pragma unroll
        for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
            if (threadIdx.x + i * stride < k4) ss[t] = fma_squares(v[t][i], ss[t]);
        }
    }
    block_sums<MT>(ss, scratch);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
        const float inv = rms_inverse(ss[t], K, eps);
#pragma unroll
        for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
            const int e = threadIdx.x + i * stride;
            if (e < k4) xs4[t * k4 + slot(e)] = rms_scale4(v[t][i], inv, w[i]);
        }
    }
    __syncthreads();
}

// gemv_stage_chain_inputs for a wide block (16 warps): the same values slot for slot, since each half of the block
// (threads 256h .. 256h + 255) normalises tokens h, h + 2 with an 8-warp block's partition of the row and block_sum's
// tree over its 8 warps. Plain rows are copies, which any partition gives alike. Normalised rows too wide for one
// batch of 256 threads have no wide form (the host keeps those models on the 8-warp kernels).
template <int MT>
__device__ __forceinline__ void gemv_stage_chain_inputs_halves(float4* __restrict__ xs4, const float* __restrict__ x,
                                                               const bf16_t* __restrict__ norm_w, int x_mode,
                                                               float eps, int K, float* scratch) {
    constexpr int HALF = GEMV_WARPS * TT_WARP, HT = (MT + 1) / 2;  // threads and most tokens of a half
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int k4 = K / 4;
    if (x_mode != GEMV_IN_RMSNORM) {  // one round of loads per token: all tokens in one measured slower (#85)
        for (int t = 0; t < MT; ++t)
            gemv_stage_input<true>(xs4 + t * k4, x + (size_t)t * K, norm_w, x_mode, eps, K, scratch);
        return;
    }
    if (k4 > GEMV_STAGE_BATCH * HALF) __trap();  // the host never launches it so
    const int half = threadIdx.x / HALF, tid = threadIdx.x % HALF, lane = tid % TT_WARP, warp = tid / TT_WARP;
    auto slot = [K](int e) { return (e % 2) * (K / 8) + e / 2; };
    float4 v[HT][GEMV_STAGE_BATCH];
    uint2 w[GEMV_STAGE_BATCH];
    const uint2* w4 = reinterpret_cast<const uint2*>(norm_w);
#pragma unroll
    for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
        const int e = tid + i * HALF;
        if (e < k4) {
            w[i] = w4[e];
#pragma unroll
            for (int j = 0; j < HT; ++j)
                if (half + 2 * j < MT) v[j][i] = x4[(half + 2 * j) * k4 + e];
        }
    }
    float ss[HT];
#pragma unroll
    for (int j = 0; j < HT; ++j) {
        ss[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
            if (tid + i * HALF < k4) ss[j] = fma_squares(v[j][i], ss[j]);
        }
        ss[j] = warp_sum(ss[j]);
    }
    if (lane == 0) {  // block_sums's tree: each warp's sum, then warp 0 of the half over its 8 warps
#pragma unroll
        for (int j = 0; j < HT; ++j)
            if (half + 2 * j < MT) scratch[32 * (half + 2 * j) + warp] = ss[j];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int j = 0; j < HT; ++j) {
            const int t = half + 2 * j;
            if (t < MT) {
                const float p = warp_sum(lane < GEMV_WARPS ? scratch[32 * t + lane] : 0.0f);
                if (lane == 0) scratch[32 * t] = p;
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < HT; ++j) {
        const int t = half + 2 * j;
        if (t < MT) {
            const float inv = rms_inverse(scratch[32 * t], K, eps);
#pragma unroll
            for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
                const int e = tid + i * HALF;
                if (e < k4) xs4[t * k4 + slot(e)] = rms_scale4(v[j][i], inv, w[i]);
            }
        }
    }
    __syncthreads();
}

// Two rows of a chain from ring slots s and s + 1 (whole rows in one piece: a group's gate and up rows, or two of a
// 16-warp block's plain rows), each chunk's staged inputs read once for both; each row's sums are those of the one-row
// loop in gemv_stream_rows (the same chunks in the same order, the same butterfly). Then both slots take the warp's
// next pieces, and the cursor moves on.
template <int MT, int WARPS>
__device__ __forceinline__ void gemv_stream_row_pair(GstreamWarp<WARPS>& st, const float4* xs4, int& s,
                                                     uint32_t& phase, int& i, float (&sums)[2][MT]) {
    const int lane = threadIdx.x % TT_WARP, K = st.K;
    float gate[MT], up[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) gate[t] = up[t] = 0.0f;
    mbar_wait(&st.full[s], phase);
    mbar_wait(&st.full[s + 1], phase);
    const uint4* wg = reinterpret_cast<const uint4*>(st.ring + s * (GSTREAM_TILE_K * 2));
    const uint4* wu = reinterpret_cast<const uint4*>(st.ring + (s + 1) * (GSTREAM_TILE_K * 2));
#pragma unroll 2
    for (int c = lane; c < K / 8; c += TT_WARP) {
        const uint4 a = wg[c], b = wu[c];
#pragma unroll
        for (int t = 0; t < MT; ++t) {
            const float4 xa = xs4[t * (K / 4) + c], xb = xs4[t * (K / 4) + K / 8 + c];
            gate[t] = gemv_fma_chunk(gate[t], a, xa, xb);
            up[t] = gemv_fma_chunk(up[t], b, xa, xb);
        }
    }
    __syncwarp();  // every lane has read both slots
    if (lane == 0) {
        fence_proxy_async_shared();
        if (i + st.stages < st.pieces) st.issue(s);
        if (i + 1 + st.stages < st.pieces) st.issue(s + 1);
    }
    i += 2;
    s += 2;
    if (s == st.stages) {
        s = 0;
        phase ^= 1;
    }
#pragma unroll
    for (int t = 0; t < MT; ++t) {
        sums[0][t] = warp_sum(gate[t]);
        sums[1][t] = warp_sum(up[t]);
    }
}

// After the wait: the input rows of tokens t0 .. t0 + MT - 1 staged, then the warp's rows reduced against each of
// them. Token t's sum is the single-token sum (chunks in the same order, the same butterfly), whatever MT is: a
// weight chunk leaves shared memory once for all MT tokens.
template <bool SWIGLU, int MT, int WARPS = GEMV_WARPS, typename WT = bf16_t>
__device__ __forceinline__ void gemv_stream_rows(GstreamWarp<WARPS, WT>& st, const float* __restrict__ x,
                                                 const bf16_t* __restrict__ norm_w, int x_mode, float eps,
                                                 const bf16_t* __restrict__ bias, const float* residual, float* y,
                                                 int t0, float* scratch) {
    static_assert(MT == 1 || sizeof(WT) == 2, "the chain forms read bf16 weights");
    constexpr bool FP8 = sizeof(WT) == 1;
    constexpr int TILE = GstreamWarp<WARPS, WT>::TILE;
    extern __shared__ __align__(16) unsigned char gstream_smem[];
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    const int N = st.N, K = st.K, k_tiles = st.k_tiles, stages = st.stages, pieces = st.pieces;
    const int out_rows = SWIGLU ? N / 2 : N;
    constexpr int passes = SWIGLU ? 2 : 1;
    const int warp_groups = (out_rows - warp + WARPS - 1) / WARPS;
    // The writer's residual of its first row travels with the input's loads; each later row's comes while the row
    // before is reduced. A warp owns its rows, so a residual that aliases y is read before this warp writes it.
    const bool writer = lane == 0;
    auto residual_of = [&](int g, int t) {
        return !SWIGLU && writer && residual && g < warp_groups
                   ? residual[(size_t)(t0 + t) * N + g * WARPS + warp]
                   : 0.0f;
    };
    float res[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) res[t] = residual_of(blockIdx.x, t);

    float4* xs4 = reinterpret_cast<float4*>(gstream_smem + (size_t)stages * WARPS * st.slot_bytes());
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 1);
    if constexpr (MT == 1)
        gemv_stage_input<true>(xs4, x + (size_t)t0 * K, norm_w, x_mode, eps, K, scratch);
    else if constexpr (WARPS == GEMV_WARPS)
        gemv_stage_chain_inputs<MT>(xs4, x + (size_t)t0 * K, norm_w, x_mode, eps, K, scratch);
    else
        gemv_stage_chain_inputs_halves<MT>(xs4, x + (size_t)t0 * K, norm_w, x_mode, eps, K, scratch);
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 2);
    // Token t's inputs 8c .. 8c + 3 of chunk c at xs4[t * K / 4 + c], 8c + 4 .. 8c + 7 at xs4[t * K / 4 + K / 8 + c]
    int i = 0, s = 0;
    uint32_t phase = 0;
    // A lane's chunks of a piece in flight at once: eight for one token; two for a chain, whose MT sums per chunk
    // would otherwise take more than the 128 registers of two blocks per SM.
    constexpr int unroll = MT == 1 ? 8 : 2;
    // A chain's gate and up rows read each staged input once for both (half the shared-memory reads per weight byte)
    // when the two pieces of a group sit side by side in the ring: whole rows in one piece, a ring of pairs.
    const bool pair_gate_up = SWIGLU && MT > 1 && k_tiles == 1 && stages % 2 == 0;
    // The 16-warp blocks' plain chain rows likewise, two of the warp's rows (groups g and g + gridDim.x) at a time.
    const bool pair_rows = !SWIGLU && MT > 1 && WARPS == GSTREAM_WIDE_WARPS && k_tiles == 1 && stages % 2 == 0;
    for (int g = blockIdx.x; g < warp_groups; g += gridDim.x) {
        const int j = g * WARPS + warp;  // this warp's output row
        // the writer's bias and the next row's residual are in flight while the row is reduced
        float res_next[MT];
#pragma unroll
        for (int t = 0; t < MT; ++t) res_next[t] = residual_of(g + gridDim.x, t);
        if constexpr (!SWIGLU && MT > 1 && WARPS == GSTREAM_WIDE_WARPS) {
            const int g2 = g + gridDim.x, j2 = g2 * WARPS + warp;
            if (pair_rows && g2 < warp_groups) {
                const float b1 = writer && bias ? bf16_to_float(bias[j]) : 0.0f;
                const float b2 = writer && bias ? bf16_to_float(bias[j2]) : 0.0f;
                float sums[2][MT];
                gemv_stream_row_pair<MT, WARPS>(st, xs4, s, phase, i, sums);  // rows j and j2
                if (writer) {
#pragma unroll
                    for (int t = 0; t < MT; ++t) {
                        float acc = sums[0][t], acc2 = sums[1][t];
                        if (bias) {
                            acc += b1;
                            acc2 += b2;
                        }
                        if (residual) {
                            acc += res[t];
                            acc2 += res_next[t];
                        }
                        y[(size_t)(t0 + t) * N + j] = acc;
                        y[(size_t)(t0 + t) * N + j2] = acc2;
                    }
                }
#pragma unroll
                for (int t = 0; t < MT; ++t) res[t] = residual_of(g2 + gridDim.x, t);
                g = g2;  // and the loop's step: the group after g2
                continue;
            }
        }
        float bias_p[passes], scale_p[passes];
#pragma unroll
        for (int p = 0; p < passes; ++p) {
            bias_p[p] = writer && bias ? bf16_to_float(bias[p * (N / 2) + j]) : 0.0f;
            scale_p[p] = FP8 && writer ? st.scale[p * (N / 2) + j] : 1.0f;
        }
        float sums[passes][MT];
        if constexpr (SWIGLU && MT > 1) {
            if (pair_gate_up) gemv_stream_row_pair<MT, WARPS>(st, xs4, s, phase, i, sums);
        }
        if (!pair_gate_up) {
#pragma unroll
            for (int p = 0; p < passes; ++p) {
                float acc[MT];
#pragma unroll
                for (int t = 0; t < MT; ++t) acc[t] = 0.0f;
                for (int kt = 0; kt < k_tiles; ++kt, ++i) {
                    mbar_wait(&st.full[s], phase);
                    const unsigned char* slot = st.ring + s * st.slot_bytes();
                    const int chunks = min(TILE, K - kt * TILE) / 8;
                    const int base = kt * (TILE / 8);
                    if constexpr (FP8) {
                        const uint2* wt = reinterpret_cast<const uint2*>(slot);
#pragma unroll unroll
                        for (int c = lane; c < chunks; c += TT_WARP)
                            acc[0] = gemv_fma_chunk_e4m3(acc[0], wt[c], xs4[base + c], xs4[K / 8 + base + c]);
                    } else {
                        const uint4* wt = reinterpret_cast<const uint4*>(slot);
#pragma unroll unroll
                        for (int c = lane; c < chunks; c += TT_WARP) {
                            const uint4 w = wt[c];
#pragma unroll
                            for (int t = 0; t < MT; ++t)
                                acc[t] = gemv_fma_chunk(acc[t], w, xs4[t * (K / 4) + base + c],
                                                        xs4[t * (K / 4) + K / 8 + base + c]);
                        }
                    }
                    __syncwarp();  // every lane has read the slot
                    if (lane == 0 && i + stages < pieces) {
                        fence_proxy_async_shared();  // those reads come before the copy unit's write
                        st.issue(s);
                    }
                    if (++s == stages) {
                        s = 0;
                        phase ^= 1;
                    }
                }
#pragma unroll
                for (int t = 0; t < MT; ++t) sums[p][t] = warp_sum(acc[t]);
            }
        }
        if (writer) {
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                float acc = sums[0][t] * scale_p[0];  // exact: a power of two (1 for bf16)
                if constexpr (SWIGLU) {
                    float up = sums[1][t] * scale_p[1];
                    if (bias) {
                        acc += bias_p[0];
                        up += bias_p[1];
                    }
                    y[(size_t)(t0 + t) * (N / 2) + j] = silu_mul(acc, up);
                } else {
                    if (bias) acc += bias_p[0];
                    if (residual) acc += res[t];
                    y[(size_t)(t0 + t) * N + j] = acc;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MT; ++t) res[t] = res_next[t];
    }
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 3);
}

// One token (blockIdx.y) of gemv_bf16's rows with one warp per row (bf16 weights, or e4m3 with row scales).
template <bool SWIGLU, typename WT = bf16_t>
__device__ __forceinline__ void gemv_stream(const WT* __restrict__ W, const float* __restrict__ scale,
                                            const float* __restrict__ x, const bf16_t* __restrict__ norm_w,
                                            int x_mode, float eps, const bf16_t* __restrict__ bias,
                                            const float* residual, float* y, int N, int K, int stages) {
    extern __shared__ __align__(16) unsigned char gstream_smem[];
    __shared__ __align__(8) uint64_t full[GEMV_WARPS][GSTREAM_MAX_STAGES];
    __shared__ float scratch[32];
    GstreamWarp<GEMV_WARPS, WT> st = gemv_stream_start<SWIGLU, GEMV_WARPS, WT>(W, scale, N, K, stages, gstream_smem,
                                                                               full[threadIdx.x / TT_WARP]);
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4);  // gemv_bf16's probes
    pdl_enter();
    gemv_stream_rows<SWIGLU, 1, GEMV_WARPS, WT>(st, x, norm_w, x_mode, eps, bias, residual, y, blockIdx.y, scratch);
}

// The tokens of a forced chain, as many as *count (2 to GSTREAM_CHAIN_TOKENS, read after the wait): each token's
// rows are the single-token kernel's bits. Blocks of WARPS warps; dynamic shared memory:
// stages * WARPS * GSTREAM_TILE_K * 2 + GSTREAM_CHAIN_TOKENS * K * 4 bytes.
template <bool SWIGLU, int WARPS>
__device__ __forceinline__ void gemv_stream_chain(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                                  const bf16_t* __restrict__ norm_w, int x_mode, float eps,
                                                  const bf16_t* __restrict__ bias, const float* residual, float* y,
                                                  int N, int K, int stages, const int* count) {
    extern __shared__ __align__(16) unsigned char gstream_smem[];
    __shared__ __align__(8) uint64_t full[WARPS][GSTREAM_MAX_STAGES];
    __shared__ float scratch[32 * GSTREAM_CHAIN_TOKENS];  // block_sums of the tokens' sums of squares
    GstreamWarp<WARPS> st =
        gemv_stream_start<SWIGLU, WARPS>(W, nullptr, N, K, stages, gstream_smem, full[threadIdx.x / TT_WARP]);
    pdl_enter();
    switch (*count) {  // uniform: one value for the whole grid
        case 2: gemv_stream_rows<SWIGLU, 2, WARPS>(st, x, norm_w, x_mode, eps, bias, residual, y, 0, scratch); break;
        case 3: gemv_stream_rows<SWIGLU, 3, WARPS>(st, x, norm_w, x_mode, eps, bias, residual, y, 0, scratch); break;
        default: gemv_stream_rows<SWIGLU, 4, WARPS>(st, x, norm_w, x_mode, eps, bias, residual, y, 0, scratch); break;
    }
}

// y = in(x) @ W.T (+ bias) (+ residual), as gemv_bf16 with one warp per row. residual may alias y.
extern "C" __global__ void __launch_bounds__(GSTREAM_THREADS)
gemv_stream_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w,
                 int x_mode, float eps, const bf16_t* __restrict__ bias, const float* residual, float* y, int N, int K,
                 int stages) {
    gemv_stream<false>(W, nullptr, x, norm_w, x_mode, eps, bias, residual, y, N, K, stages);
}

// y[j] = silu_mul(row j, row N / 2 + j) of the fused gate|up weight, as gemv_swiglu_bf16 with one warp per row.
extern "C" __global__ void __launch_bounds__(GSTREAM_THREADS)
gemv_stream_swiglu_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w,
                        int x_mode, float eps, const bf16_t* __restrict__ bias, float* y, int N, int K, int stages) {
    gemv_stream<true>(W, nullptr, x, norm_w, x_mode, eps, bias, nullptr, y, N, K, stages);
}

// gemv_stream_bf16 with e4m3 weights (W) and their rows' power-of-two scales: the bits of gemv_stream_bf16 on the
// dequantized weights W[n, k] * scale[n] (see the header). Requires K % 16 == 0.
extern "C" __global__ void __launch_bounds__(GSTREAM_THREADS)
gemv_stream_fp8(const uint8_t* __restrict__ W, const float* __restrict__ scale, const float* __restrict__ x,
                const bf16_t* __restrict__ norm_w, int x_mode, float eps, const bf16_t* __restrict__ bias,
                const float* residual, float* y, int N, int K, int stages) {
    gemv_stream<false, uint8_t>(W, scale, x, norm_w, x_mode, eps, bias, residual, y, N, K, stages);
}

// gemv_stream_swiglu_bf16 with e4m3 weights and row scales (the gate rows' scales, then the up rows').
extern "C" __global__ void __launch_bounds__(GSTREAM_THREADS)
gemv_stream_swiglu_fp8(const uint8_t* __restrict__ W, const float* __restrict__ scale, const float* __restrict__ x,
                       const bf16_t* __restrict__ norm_w, int x_mode, float eps, const bf16_t* __restrict__ bias,
                       float* y, int N, int K, int stages) {
    gemv_stream<true, uint8_t>(W, scale, x, norm_w, x_mode, eps, bias, nullptr, y, N, K, stages);
}

// The chain forms of the two kernels above: *count tokens (2 to GSTREAM_CHAIN_TOKENS), rows 0 .. *count - 1 of x,
// residual and y.
// Held to 128 registers: two blocks fit an SM, as the host's layout assumes.
extern "C" __global__ void __launch_bounds__(GSTREAM_THREADS, 2)
gemv_stream_chain_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w,
                       int x_mode, float eps, const bf16_t* __restrict__ bias, const float* residual, float* y, int N,
                       int K, int stages, const int* count) {
    gemv_stream_chain<false, GEMV_WARPS>(W, x, norm_w, x_mode, eps, bias, residual, y, N, K, stages, count);
}

extern "C" __global__ void __launch_bounds__(GSTREAM_THREADS, 2)
gemv_stream_chain_swiglu_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x,
                              const bf16_t* __restrict__ norm_w, int x_mode, float eps,
                              const bf16_t* __restrict__ bias, float* y, int N, int K, int stages, const int* count) {
    gemv_stream_chain<true, GEMV_WARPS>(W, x, norm_w, x_mode, eps, bias, nullptr, y, N, K, stages, count);
}

// The chain forms in blocks of 16 warps, one an SM (held to 128 registers): the tokens' input rows are staged once
// for twice the warps, so the ring gets the shared memory a second block's copy would take.
extern "C" __global__ void __launch_bounds__(GSTREAM_WIDE_WARPS * TT_WARP, 1)
gemv_stream_chain16_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w,
                         int x_mode, float eps, const bf16_t* __restrict__ bias, const float* residual, float* y,
                         int N, int K, int stages, const int* count) {
    gemv_stream_chain<false, GSTREAM_WIDE_WARPS>(W, x, norm_w, x_mode, eps, bias, residual, y, N, K, stages, count);
}

extern "C" __global__ void __launch_bounds__(GSTREAM_WIDE_WARPS * TT_WARP, 1)
gemv_stream_chain16_swiglu_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                const bf16_t* __restrict__ norm_w, int x_mode, float eps,
                                const bf16_t* __restrict__ bias, float* y, int N, int K, int stages,
                                const int* count) {
    gemv_stream_chain<true, GSTREAM_WIDE_WARPS>(W, x, norm_w, x_mode, eps, bias, nullptr, y, N, K, stages, count);
}
