// The decode step of every layer as one persistent kernel: one block per SM runs, layer after layer, the phases
// that the layered launch list runs as separate kernels (qkv GEMV with its RMSNorm, attention, o GEMV, gate|up GEMV
// with its RMSNorm and SwiGLU output, down GEMV), separated by grid-wide barriers (grid_sync.cuh).
//
// Why: at batch 1 a step reads its weights once, and what costs over that is the time HBM idles at kernel
// boundaries and through attention. Weights never depend on activations, so here each warp keeps one ring of
// weight pieces in shared memory for the whole step: it requests, in order, every piece of every row it will
// reduce in every layer, `stages` pieces ahead of the one it reduces. A piece it has reduced is refilled at once
// with the piece `stages` further on, which at the end of a phase is already the next phase's (or the next
// layer's), so while the block waits at a barrier or works on attention, its ring fills with the weights it needs
// next. Nothing but shared memory bounds the lookahead (6 pieces of 4 KB a warp: about 25 MB on an H200, 6 µs of
// its bandwidth). Measured on an H200 it is nonetheless slower than the layered list: each of a step's 139 grid
// barriers costs 1-3 µs after the last block arrives, and the rings of the warps that finished a phase first sit
// full of landed pieces meanwhile, so little is in flight through it (docs/cuda-speed-notes.md #58-#63). Opt-in.
//
// The same bits as the layered kernels: each phase is their arithmetic, row for row.
//   GEMVs: gemv_stream.cuh's, one warp per row; warp w of block b reduces rows g * 8 + w of row groups
//          g = b, b + gridDim.x, ... (a row's sum does not depend on which warp or block reduces it), the input
//          staged by gemv_stage_input (RMSNorm with the rmsnorm kernel's partition and tree, 8 warps);
//   attention: attention_decode.cuh's functions, one task per (head, 32-position chunk), tasks h + n_heads * c
//          dealt round-robin to the blocks; each task's block counts it, and the block that completes a head
//          merges its chunks, as the layered kernel's last block does.
// Activations written by other blocks of this launch are read through L2 only (load_activation<true>).
// Requires every GEMV input width below GEMV_SPLIT_MIN_K (one warp per row) and a multiple of 8, and one block per
// SM with the whole grid resident (the host launches it cooperatively with gridDim.x = SM count).
// Dynamic shared memory: stages * GSTREAM_TILE_BYTES (the rings), then max(widest input, 2 * max_chunks) floats
// (the staged input row; the attention merge's per-chunk m and l share it).
#pragma once
#include "async_copy.cuh"
#include "attention_decode.cuh"
#include "common.cuh"
#include "gemv.cuh"
#include "gemv_stream.cuh"
#include "grid_sync.cuh"

#define PDEC_THREADS GSTREAM_THREADS
static_assert(PDEC_THREADS <= ATTN_SPLIT_THREADS, "attention's merge keeps a value per thread in AttnShared::red");
#define PDEC_OPS 4  // weight streams of a layer, in the order the phases read them
#define PDEC_QKV 0
#define PDEC_O 1
#define PDEC_GATE_UP 2
#define PDEC_DOWN 3
#define PDEC_WARP_SLOT_BYTES (GSTREAM_TILE_K * 2)  // one 4 KB piece
#define PDEC_PHASES 5  // per layer: qkv, attention, o, gate|up, down
// Timing probes (-DTT_TRACE builds; bench/gpu_trace_persistent.py reads them): per block, per phase of the first
// PDEC_TRACE_LAYERS layers, thread 0's timer at the phase's start (its barrier passed), at a point inside it (the
// input staged; attention: the first task's record written) and at its end (before it arrives at the next barrier).
#define PDEC_TRACE_LAYERS 4
#define PDEC_TRACE_MARKS 3

// One layer's weights and caches (decoder_service/engines/cuda/persistent.py packs this layout; nullptr: absent).
struct PdecLayer {
    const bf16_t* qkv;
    const bf16_t* qkv_bias;
    const bf16_t* input_norm;
    const bf16_t* q_norm;
    const bf16_t* k_norm;
    const bf16_t* o;
    const bf16_t* post_norm;
    const bf16_t* gate_up;
    const bf16_t* down;
    float* k_cache;
    float* v_cache;
};

// Everything a step needs, written once per model by the host.
struct PdecPlan {
    const PdecLayer* layers;
    float* x;        // the residual stream: the embedding in, the last layer's output out
    float* qkv;      // the new token's q|k|v
    float* attn;     // attention output
    float* act;      // silu(gate) * up
    float* partial;  // attention chunk records, n_heads * max_chunks of head_dim + 2 floats
    const float* rope;
    int* done;       // per-head merge counters (zero between uses)
    unsigned* sync;  // the grid barrier's counter (zero between launches)
    int n_layers, hidden, q_width, kv_width, intermediate, n_heads, n_kv_heads, head_dim, max_chunks, stages;
    float eps, scale;
};

// A weight stream of a layer: W is N rows of K columns; `passes` 2 for the gate|up weight (row j of the output
// takes gate row j, then up row N / 2 + j).
struct PdecOp {
    const bf16_t* W;
    int N, K, passes;
};

__device__ __forceinline__ PdecOp pdec_op(const PdecPlan& P, int layer, int op) {
    const PdecLayer* L = P.layers + layer;
    switch (op) {
        case PDEC_QKV:
            return {L->qkv, P.q_width + 2 * P.kv_width, P.hidden, 1};
        case PDEC_O:
            return {L->o, P.hidden, P.q_width, 1};
        case PDEC_GATE_UP:
            return {L->gate_up, 2 * P.intermediate, P.hidden, 2};
        default:
            return {L->down, P.hidden, P.intermediate, 1};
    }
}

// Row groups g that hold a row of warp `warp` (g * 8 + warp below the output rows).
__device__ __forceinline__ int pdec_warp_groups(const PdecOp& o, int warp) {
    const int out_rows = o.passes == 2 ? o.N / 2 : o.N;
    return (out_rows - warp + GEMV_WARPS - 1) / GEMV_WARPS;
}

// The next piece a warp requests: piece kt of pass p of row group g of weight stream `op` of `layer`, in the order
// the warp reduces them (layers, then streams, then its groups, a group's gate row before its up row, a row's
// pieces left to right). Streams in which the warp has no row are skipped; layer == n_layers: none is left.
struct PdecCursor {
    int layer, op, g, p, kt, k_tiles, warp_groups;
    PdecOp o;

    __device__ __forceinline__ bool valid(const PdecPlan& P) const { return layer < P.n_layers; }

    // From (layer, op) on, the first stream in which the warp reduces a row.
    __device__ __forceinline__ void seek(const PdecPlan& P, int warp) {
        while (layer < P.n_layers) {
            o = pdec_op(P, layer, op);
            warp_groups = pdec_warp_groups(o, warp);
            k_tiles = (o.K + GSTREAM_TILE_K - 1) / GSTREAM_TILE_K;
            g = blockIdx.x;
            p = kt = 0;
            if (g < warp_groups) return;
            if (++op == PDEC_OPS) {
                op = 0;
                ++layer;
            }
        }
    }

    __device__ __forceinline__ void start(const PdecPlan& P, int warp) {
        layer = op = 0;
        seek(P, warp);
    }

    __device__ __forceinline__ void advance(const PdecPlan& P, int warp) {
        if (++kt < k_tiles) return;
        kt = 0;
        if (++p < o.passes) return;
        p = 0;
        if ((g += gridDim.x) < warp_groups) return;
        if (++op == PDEC_OPS) {
            op = 0;
            ++layer;
        }
        seek(P, warp);
    }
};

// A warp's ring: `stages` slots of one piece with a barrier each; `s` and `phase` are the next slot to reduce and
// its barrier's parity; `next` (lane 0's) is the next piece to request.
struct PdecRing {
    unsigned char* mem;
    uint64_t* full;
    int stages, s;
    uint32_t phase;
    uint64_t policy;
    PdecCursor next;

    // Lane 0: the next piece into `slot`.
    __device__ __forceinline__ void issue(const PdecPlan& P, int slot, int warp) {
        const PdecCursor& c = next;
        const int row = c.p * (c.o.N / 2) + c.g * GEMV_WARPS + warp;
        const int col = c.kt * GSTREAM_TILE_K, width = min(GSTREAM_TILE_K, c.o.K - col);
        mbar_arrive_expect_tx(&full[slot], (uint32_t)(width * 2));
        bulk_copy_to_shared(mem + slot * PDEC_WARP_SLOT_BYTES, c.o.W + (size_t)row * c.o.K + col, width * 2,
                            &full[slot], policy);
        next.advance(P, warp);
    }
};

// The first TT_MARK slot of (layer, phase) of this block; past the trace buffer (no probe) after the traced layers.
__device__ __forceinline__ int pdec_mark(int layer, int phase) {
    return layer < PDEC_TRACE_LAYERS
               ? ((blockIdx.x * PDEC_TRACE_LAYERS + layer) * PDEC_PHASES + phase) * PDEC_TRACE_MARKS
               : 1 << 30;
}

// One GEMV phase of weight stream `op` of `layer`: y = in(x) @ W.T (+ bias) (+ residual), or (SWIGLU) y[j] =
// silu_mul(gate row j, up row j); the rows, sums and output expressions of gemv_stream.
template <bool SWIGLU>
__device__ __forceinline__ void pdec_gemv(const PdecPlan& P, int layer, int op, const float* x, const bf16_t* norm_w,
                                          int x_mode, const bf16_t* bias, const float* residual, float* y,
                                          PdecRing& r, float4* xs4, float* scratch, int mark) {
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    TT_MARK(mark);
    const PdecOp o = pdec_op(P, layer, op);
    const int N = o.N, K = o.K, k_tiles = (K + GSTREAM_TILE_K - 1) / GSTREAM_TILE_K;
    constexpr int passes = SWIGLU ? 2 : 1;
    const int warp_groups = pdec_warp_groups(o, warp);
    const bool writer = lane == 0;
    // A warp owns its rows, so a residual that aliases y is read before this warp writes it.
    auto residual_of = [&](int g) {
        return !SWIGLU && writer && residual && g < warp_groups ? __ldcg(residual + g * GEMV_WARPS + warp) : 0.0f;
    };
    float res = residual_of(blockIdx.x);
    gemv_stage_input<true, true>(xs4, x, norm_w, x_mode, P.eps, K, scratch);
    TT_MARK(mark + 1);
    const float4* xa = xs4;          // inputs 8c .. 8c + 3 of chunk c
    const float4* xb = xs4 + K / 8;  // inputs 8c + 4 .. 8c + 7
    for (int g = blockIdx.x; g < warp_groups; g += gridDim.x) {
        const int j = g * GEMV_WARPS + warp;  // this warp's output row
        const float res_next = residual_of(g + gridDim.x);
        float bias_p[passes];
#pragma unroll
        for (int p = 0; p < passes; ++p) bias_p[p] = writer && bias ? bf16_to_float(bias[p * (N / 2) + j]) : 0.0f;
        float sums[passes];
#pragma unroll
        for (int p = 0; p < passes; ++p) {
            float acc = 0.0f;
            for (int kt = 0; kt < k_tiles; ++kt) {
                mbar_wait(&r.full[r.s], r.phase);
                const uint4* wt = reinterpret_cast<const uint4*>(r.mem + r.s * PDEC_WARP_SLOT_BYTES);
                const int chunks = min(GSTREAM_TILE_K, K - kt * GSTREAM_TILE_K) / 8;
                const int base = kt * (GSTREAM_TILE_K / 8);
                if (chunks == GSTREAM_TILE_K / 8) {
                    // A whole piece: the lane's 8 chunks and their inputs are all read before the first product,
                    // so the products wait for shared memory once (the sum's order is the loop's below).
                    uint4 wv[GSTREAM_TILE_K / 8 / TT_WARP];
                    float4 av[GSTREAM_TILE_K / 8 / TT_WARP], bv[GSTREAM_TILE_K / 8 / TT_WARP];
#pragma unroll
                    for (int i = 0; i < GSTREAM_TILE_K / 8 / TT_WARP; ++i) {
                        const int c = lane + i * TT_WARP;
                        wv[i] = wt[c];
                        av[i] = xa[base + c];
                        bv[i] = xb[base + c];
                    }
#pragma unroll
                    for (int i = 0; i < GSTREAM_TILE_K / 8 / TT_WARP; ++i)
                        acc = gemv_fma_chunk(acc, wv[i], av[i], bv[i]);
                } else {
#pragma unroll 8
                    for (int c = lane; c < chunks; c += TT_WARP)
                        acc = gemv_fma_chunk(acc, wt[c], xa[base + c], xb[base + c]);
                }
                __syncwarp();  // every lane has read the slot
                if (lane == 0 && r.next.valid(P)) {
                    fence_proxy_async_shared();  // those reads come before the copy unit's write
                    r.issue(P, r.s, warp);
                }
                if (++r.s == r.stages) {
                    r.s = 0;
                    r.phase ^= 1;
                }
            }
            sums[p] = warp_sum(acc);
        }
        if (writer) {
            float acc = sums[0];
            if constexpr (SWIGLU) {
                float up = sums[1];
                if (bias) {
                    acc += bias_p[0];
                    up += bias_p[1];
                }
                y[j] = silu_mul(acc, up);
            } else {
                if (bias) acc += bias_p[0];
                if (residual) acc += res;
                y[j] = acc;
            }
        }
        res = res_next;
    }
    TT_MARK(mark + 2);
}

// The K/V rows of all of this block's attention tasks of `layer` requested into L2 as the layer starts, so that
// attention's loads find them there rather than queued behind the weight stream in HBM (the rows before pos are the
// earlier steps', final before this launch; a block with several tasks finds its later ones' rows there too).
__device__ __forceinline__ void pdec_prefetch_kv(const PdecPlan& P, int layer, int pos) {
    const PdecLayer* L = P.layers + layer;
    const int length = pos + 1, tasks = P.n_heads * ((length + ATTN_CHUNK - 1) / ATTN_CHUNK);
    const int group_size = P.n_heads / P.n_kv_heads, kv_stride = P.n_kv_heads * P.head_dim;
    for (int t = blockIdx.x; t < tasks; t += gridDim.x) {
        const int h = t % P.n_heads, j0 = t / P.n_heads * ATTN_CHUNK;
        attn_prefetch_rows_l2(L->k_cache, L->v_cache, j0, min(ATTN_CHUNK, length - j0), kv_stride, h / group_size,
                              P.head_dim);
    }
}

// The attention phase of `layer`: tasks t = h + n_heads * c (head h, chunk c) for blocks b, b + gridDim.x, ...
// merge_ml holds 2 * max_chunks floats of shared memory.
__device__ __forceinline__ void pdec_attention(const PdecPlan& P, int layer, int pos, AttnShared& sh,
                                               float* merge_ml, int mark) {
    TT_MARK(mark);
    const PdecLayer* L = P.layers + layer;
    const AttnDims d{P.n_heads, P.n_kv_heads, P.head_dim, P.max_chunks, P.scale, P.eps};
    const int length = pos + 1, n_chunks = (length + ATTN_CHUNK - 1) / ATTN_CHUNK, last_chunk = pos / ATTN_CHUNK;
    const int tasks = P.n_heads * n_chunks;
    float* k_cache = L->k_cache;
    float* v_cache = L->v_cache;
    const bool active = threadIdx.x < P.head_dim;
    const float q_norm_d = active && L->q_norm ? bf16_to_float(L->q_norm[threadIdx.x]) : 0.0f;
    const float k_norm_d = active && L->k_norm ? bf16_to_float(L->k_norm[threadIdx.x]) : 0.0f;
    constexpr int no_trace = 1 << 30;  // TT_MARK slots past the trace buffer: no probes here
    for (int t = blockIdx.x; t < tasks; t += gridDim.x) {
        const int h = t % P.n_heads, c = t / P.n_heads;
        attn_prepare_head<true>(P.qkv, L->q_norm != nullptr, L->k_norm != nullptr, q_norm_d, k_norm_d, k_cache,
                                v_cache, P.rope, h, pos, c == last_chunk, 0, 0, d, sh, no_trace);
        attn_chunk_record(k_cache, v_cache, AttnRecords{P.partial, nullptr, false}, h, c, pos, d, sh, no_trace);
        if (t == (int)blockIdx.x) TT_MARK(mark + 1);
        attn_count_and_merge(P.partial, P.attn, P.done, h, n_chunks, n_chunks, d, sh, merge_ml,
                             merge_ml + P.max_chunks, no_trace);
    }
    TT_MARK(mark + 2);
}

// grid (SM count), block PDEC_THREADS, launched cooperatively. The token's embedding is in plan->x (the kernel
// before wrote it); the position comes from device memory (graph replays) or from the host (pos_ptr null).
extern "C" __global__ void __launch_bounds__(PDEC_THREADS, 1)
decode_persistent(const PdecPlan* __restrict__ plan, const int* pos_ptr, int pos_host) {
    extern __shared__ __align__(128) unsigned char pdec_smem[];
    __shared__ __align__(8) uint64_t full[GEMV_WARPS][GSTREAM_MAX_STAGES];
    __shared__ float scratch[64];
    __shared__ PdecPlan P;
    __shared__ AttnShared sh;
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    if (threadIdx.x == 0) P = *plan;  // written once by the host, before any launch
    __syncthreads();
    PdecRing r;
    r.stages = max(1, min(P.stages, GSTREAM_MAX_STAGES));  // the host sizes shared memory for its own value
    r.s = 0;
    r.phase = 0;
    r.mem = pdec_smem + (size_t)warp * r.stages * PDEC_WARP_SLOT_BYTES;
    r.full = full[warp];
    r.policy = l2_evict_first_policy();  // weights are read once per step
    if (lane == 0) {
        for (int s = 0; s < r.stages; ++s) mbar_init(&r.full[s], 1);  // the issuing arrival, plus the bytes
        mbar_init_fence();
    }
    __syncwarp();
    // Only weights so far, which no kernel writes: the rings fill while the kernel before still runs.
    if (lane == 0) {
        r.next.start(P, warp);
        for (int s = 0; s < r.stages && r.next.valid(P); ++s) r.issue(P, s, warp);
    }
    float4* xs4 = reinterpret_cast<float4*>(pdec_smem + (size_t)r.stages * GSTREAM_TILE_BYTES);
    float* merge_ml = reinterpret_cast<float*>(xs4);  // attention's merge table: the staged row is free then
    pdl_wait();
    const int pos = host_or_device(pos_ptr, pos_host);
    unsigned phases = 0;  // phases of this step every block has completed
    auto barrier = [&]() {
        grid_arrive(P.sync);
        grid_wait(P.sync, ++phases * gridDim.x);
    };
    for (int layer = 0; layer < P.n_layers; ++layer) {
        const PdecLayer* L = P.layers + layer;
        // Every block is resident by now (a barrier has opened), so the next kernel's blocks may take the room that
        // is left without keeping any of ours out.
        if (layer > 0 && layer == P.n_layers - 1) pdl_launch_dependents();
        pdec_prefetch_kv(P, layer, pos);
        pdec_gemv<false>(P, layer, PDEC_QKV, P.x, L->input_norm, GEMV_IN_RMSNORM, L->qkv_bias, nullptr, P.qkv, r, xs4,
                         scratch, pdec_mark(layer, 0));
        barrier();
        pdec_attention(P, layer, pos, sh, merge_ml, pdec_mark(layer, 1));
        barrier();
        pdec_gemv<false>(P, layer, PDEC_O, P.attn, nullptr, GEMV_IN_PLAIN, nullptr, P.x, P.x, r, xs4, scratch,
                         pdec_mark(layer, 2));
        barrier();
        pdec_gemv<true>(P, layer, PDEC_GATE_UP, P.x, L->post_norm, GEMV_IN_RMSNORM, nullptr, nullptr, P.act, r, xs4,
                        scratch, pdec_mark(layer, 3));
        barrier();
        pdec_gemv<false>(P, layer, PDEC_DOWN, P.act, nullptr, GEMV_IN_PLAIN, nullptr, P.x, P.x, r, xs4, scratch,
                         pdec_mark(layer, 4));
        if (layer + 1 < P.n_layers) barrier();
    }
    grid_arrive_last(P.sync, (phases + 1) * gridDim.x);
}
