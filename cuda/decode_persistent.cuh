// The decode step of every layer as one persistent kernel: one block per SM runs, layer after layer, the phases
// that the layered launch list runs as separate kernels (qkv GEMV with its RMSNorm, attention, o GEMV, gate|up GEMV
// with its RMSNorm and SwiGLU output, down GEMV), with no grid-wide barrier between them.
//
// Why: at batch 1 a step reads its weights once, and what costs over that is the time HBM idles at kernel
// boundaries and through attention. Weights never depend on activations, so one producer thread per block (lane 0
// of the block's last warp) streams the block's weight tiles of every phase of every layer, in order, into one
// block-wide ring of `stages` 16 KB slots (cp.async.bulk, counted on mbarriers). It waits only for a free slot and,
// with `in_flight` below the ring's depth, for the tile `in_flight` before the next one to land, so the ring holds
// landed tiles ahead of the consumers rather than copies queued in HBM. The 8 consumer warps (the team: threads
// 0 .. 255) stage each phase's input, reduce the tiles and run attention; the producer never joins their barriers
// (named barrier 1, common.cuh's team_sync).
// Activations go from block to block as tagged words (tagged.cuh): each phase's outputs carry the phase's tag, and
// a block stages a phase's input once every word of it carries the tag of the phase before, so it starts a phase as
// soon as its input is complete, with no grid barrier and no fence. Tags are (launch epoch, layer, phase), so no word
// is ever reset. Attention's chunk records still go through its per-head counters (one acq_rel atomic a task),
// counting up through the layers and reset at the launch's end. Reuse is safe without barriers: a phase's input is
// the whole output of the phase before, and a block with no tile in a phase skips it (reading nothing of it), so no
// block overwrites a buffer (x, q|k|v, attention's output, the SwiGLU output, the records) before every block that
// reads it has done so. Measured on an H200 (docs/cuda-speed-notes.md #107, #108): with grid barriers in this form
// each barrier took 3-6 µs (its fences wait behind the SM's own weight copies in flight); with the tagged words a
// layer takes about 41 µs, the hand-overs of x taking 2-3 µs, and the step stays slower than the layered launch
// list's. Opt-in.
//
// The same bits as the layered kernels: each phase is their arithmetic, row for row.
//   GEMVs: a tile is R = min(32, 8,192 / (K * passes)) whole rows (gate|up: R gate rows, then the same R up
//          rows); the tiles of a phase are dealt to blocks round robin, the first block rotating from phase to phase;
//          a tile is reduced by warp slot % 8, each row by one warp whose lane l sums chunks l, l + 32, ... in
//          ascending order, as gemv_stream's lanes do (a row's sum does not depend on which warp or block reduces
//          it); the input staged with gemv_stage_input's values (RMSNorm with the rmsnorm kernel's partition and tree
//          over 8 warps);
//   attention: attention_decode.cuh's functions, one task per (head, 32-position chunk), tasks h + n_heads * c
//          dealt round-robin to the blocks; each task's block counts it, and the block that completes a head
//          merges its chunks, as the layered kernel's last block does.
// Requires every GEMV input width K with K * passes <= 8,192 and K a multiple of 8, and one block per SM with the
// whole grid resident (the host launches it cooperatively with gridDim.x = SM count).
// Dynamic shared memory: stages * PDEC_SLOT_BYTES (the ring), then max(widest input, 2 * max_chunks) floats (the
// staged input row; the attention merge's per-chunk m and l share it).
#pragma once
#include "async_copy.cuh"
#include "attention_decode.cuh"
#include "common.cuh"
#include "gemv.cuh"
#include "gemv_stream.cuh"
#include "tagged.cuh"

#define PDEC_TEAM GSTREAM_THREADS  // the consumer warps: 8, as every layered kernel's block reductions assume
#define PDEC_CONSUMERS GEMV_WARPS
#define PDEC_THREADS (PDEC_TEAM + TT_WARP)  // and the producer warp
static_assert(PDEC_TEAM <= ATTN_SPLIT_THREADS, "attention's merge keeps a value per thread in AttnShared::red");
#define PDEC_SLOT_BYTES 16384
#define PDEC_SLOT_ELEMS (PDEC_SLOT_BYTES / 2)  // bf16 weights a slot holds
#define PDEC_MAX_STAGES 12
#define PDEC_OPS 4  // weight streams of a layer, in the order the phases read them
#define PDEC_QKV 0
#define PDEC_O 1
#define PDEC_GATE_UP 2
#define PDEC_DOWN 3
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
    kv_t* k_cache;
    kv_t* v_cache;
};

// Everything a step needs, written once per model by the host.
struct PdecPlan {
    const PdecLayer* layers;
    float* x;  // the residual stream: the embedding in, the last layer's output out
    // Tagged words (tagged.cuh), zero before the first launch: x, then q|k|v, attention's output, the SwiGLU output.
    unsigned long long* words;
    float* partial;  // attention chunk records, n_heads * max_chunks of head_dim + 2 floats
    const float* rope;
    int* done;         // per-head merge counters (zero between launches)
    unsigned* finished;  // blocks that have finished the launch (zero between launches)
    unsigned* epoch;     // launches so far, plus one: the tags' high part
    int n_layers, hidden, q_width, kv_width, intermediate, n_heads, n_kv_heads, head_dim, max_chunks, stages;
    int in_flight;  // the producer issues tile i once tile i - in_flight has landed (>= stages: no cap)
    int poll_ns;    // nanoseconds a poll of tagged words sleeps after a try that found a word not yet written
    float eps, scale;
};

// The phases whose outputs are handed over, in a layer's order: tag (epoch * n_layers + layer) * PDEC_TAGS + phase.
#define PDEC_TAG_QKV 0
#define PDEC_TAG_ATTN 1
#define PDEC_TAG_X_O 2  // x after the o GEMV's residual
#define PDEC_TAG_ACT 3
#define PDEC_TAG_X_DOWN 4  // x after the down GEMV's residual
#define PDEC_TAGS 5

// A phase's input or residual: plain floats written before this launch (f), or tagged words of this launch (w,
// carrying `tag` once written); neither: none.
struct PdecIn {
    const float* f;
    const unsigned long long* w;
    unsigned tag;
};

// A phase's output: plain floats for the kernels after this launch (f), or tagged words (w) with `tag`.
struct PdecOut {
    float* f;
    unsigned long long* w;
    unsigned tag;
};

// A weight stream of a layer: W is N rows of K columns; `passes` 2 for the gate|up weight (row j of the output
// takes gate row j, then up row N / 2 + j). Its tiles: `rows` output rows each (the last one fewer; at most 32),
// `tiles` in all.
struct PdecOp {
    const bf16_t* W;
    int N, K, passes, out_rows, rows, tiles;
};

__device__ __forceinline__ PdecOp pdec_op(const PdecPlan& P, int layer, int op) {
    const PdecLayer* L = P.layers + layer;
    PdecOp o;
    switch (op) {
        case PDEC_QKV:
            o = {L->qkv, P.q_width + 2 * P.kv_width, P.hidden, 1};
            break;
        case PDEC_O:
            o = {L->o, P.hidden, P.q_width, 1};
            break;
        case PDEC_GATE_UP:
            o = {L->gate_up, 2 * P.intermediate, P.hidden, 2};
            break;
        default:
            o = {L->down, P.hidden, P.intermediate, 1};
    }
    o.out_rows = o.N / o.passes;
    o.rows = min(TT_WARP, PDEC_SLOT_ELEMS / (o.K * o.passes));  // a lane holds each row's residual
    o.tiles = (o.out_rows + o.rows - 1) / o.rows;
    return o;
}

// This block's first tile of a phase whose tiles are dealt from block `rotation % gridDim.x` on: the block owns
// tiles first, first + gridDim.x, ... of the phase. The rotation (the step's tiles before the phase) moves each
// phase's extra tiles to other blocks.
__device__ __forceinline__ int pdec_first_tile(int rotation) {
    return ((int)blockIdx.x - rotation % (int)gridDim.x + (int)gridDim.x) % (int)gridDim.x;
}

// The block's ring: `stages` slots, each with a barrier that counts its copy's bytes (full) and one that its warp's
// release completes (empty).
struct PdecRing {
    unsigned char* mem;
    uint64_t* full;
    uint64_t* empty;
    int stages;
};

// The producer (one thread): every tile of this block, layer after layer, phase after phase, in the order the
// consumers reduce them.
__device__ __forceinline__ void pdec_produce(const PdecPlan& P, const PdecRing& r) {
    const uint64_t policy = l2_evict_first_policy();  // weights are read once per step
    const bool capped = P.in_flight < r.stages;
    RingCursor at, lag;  // lag: the tile in_flight before the next one
    int rotation = 0, issued = 0;
    for (int layer = 0; layer < P.n_layers; ++layer) {
        for (int op = 0; op < PDEC_OPS; ++op) {
            const PdecOp o = pdec_op(P, layer, op);
            for (int t = pdec_first_tile(rotation); t < o.tiles; t += gridDim.x, at.advance(r.stages, 1)) {
                if (capped && issued >= P.in_flight) {
                    mbar_wait(&r.full[lag.slot], lag.use & 1);
                    lag.advance(r.stages, 1);
                }
                ++issued;
                if (at.use > 0) mbar_wait(&r.empty[at.slot], (at.use - 1) & 1);
                const int row0 = t * o.rows, rows = min(o.rows, o.out_rows - row0);
                const uint32_t bytes = (uint32_t)rows * o.K * 2;  // one pass's rows
                unsigned char* slot = r.mem + (size_t)at.slot * PDEC_SLOT_BYTES;
                mbar_arrive_expect_tx(&r.full[at.slot], bytes * o.passes);
                for (int p = 0; p < o.passes; ++p)
                    bulk_copy_to_shared(slot + p * bytes, o.W + ((size_t)p * o.out_rows + row0) * o.K, bytes,
                                        &r.full[at.slot], policy);
            }
            rotation += o.tiles;
        }
    }
}

// Rows of a slot reduced together against the staged input, each input float4 read once for all of them: the H
// rows from wa on and, with TWO, the H rows from wb on (row stride `chunks`). Lane l sums chunks l, l + 32, ... of
// each row in ascending order, as every GEMV form does. sums: each row's warp_sum, wa's rows first.
template <int H, bool TWO>
__device__ __forceinline__ void pdec_dot_rows(const uint4* wa, const uint4* wb, const float4* xa, const float4* xb,
                                              int chunks, int lane, float (&sums)[TWO ? 2 * H : H]) {
    constexpr int G = TWO ? 2 * H : H;
    float acc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g] = 0.0f;
#pragma unroll 2
    for (int c = lane; c < chunks; c += TT_WARP) {
        const float4 a = xa[c], b = xb[c];
#pragma unroll
        for (int h = 0; h < H; ++h) acc[h] = gemv_fma_chunk(acc[h], wa[h * chunks + c], a, b);
        if constexpr (TWO) {
#pragma unroll
            for (int h = 0; h < H; ++h) acc[H + h] = gemv_fma_chunk(acc[H + h], wb[h * chunks + c], a, b);
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) sums[g] = warp_sum(acc[g]);
}

// The first TT_MARK slot of (layer, phase) of this block; past the trace buffer (no probe) after the traced layers.
__device__ __forceinline__ int pdec_mark(int layer, int phase) {
    return layer < PDEC_TRACE_LAYERS
               ? ((blockIdx.x * PDEC_TRACE_LAYERS + layer) * PDEC_PHASES + phase) * PDEC_TRACE_MARKS
               : 1 << 30;
}

// The staged input of a phase from the phase before's tagged words (each read once it carries `tag`):
// gemv_stage_input<true, true>'s values, slot for slot. RMSNorm rows take its one-batch path (the host keeps hidden
// within 4 float4s a thread; block_sum's first barrier comes before any store); plain rows are copies in any order,
// stored after a barrier (xs4 still holds the previous phase's input until every warp has reduced its tiles). Ends
// with a team barrier.
__device__ __forceinline__ void pdec_stage_tagged(float4* xs4, const unsigned long long* words, unsigned tag,
                                                  const bf16_t* norm_w, int x_mode, float eps, int K, float* scratch,
                                                  int sleep_ns) {
    const int k4 = K / 4;
    auto slot = [K](int e) { return (e % 2) * (K / 8) + e / 2; };
    if (x_mode == GEMV_IN_RMSNORM) {
        if (k4 > GEMV_STAGE_BATCH * PDEC_TEAM) __trap();  // the host never launches it so
        float4 v[GEMV_STAGE_BATCH];
        uint2 w[GEMV_STAGE_BATCH];
        const uint2* w4 = reinterpret_cast<const uint2*>(norm_w);
#pragma unroll
        for (int i = 0; i < GEMV_STAGE_BATCH; ++i)
            if (const int e = threadIdx.x + i * PDEC_TEAM; e < k4) w[i] = w4[e];
        poll_tagged4_batch<GEMV_STAGE_BATCH>(v, words, threadIdx.x, PDEC_TEAM, k4, tag, sleep_ns);
        rms_stage_batch<PDEC_TEAM>(xs4, v, w, k4, K, eps, scratch, slot);
    } else {
        constexpr int B = GEMV_STAGE_BATCH;  // float4s a thread polls at once
        const int rounds = (k4 + B * PDEC_TEAM - 1) / (B * PDEC_TEAM);  // the same for every thread
        for (int round = 0; round < rounds; ++round) {
            const int base = threadIdx.x + round * B * PDEC_TEAM;
            float4 v[B];
            poll_tagged4_batch<B>(v, words, base, PDEC_TEAM, k4, tag, sleep_ns);
            if (round == 0) team_sync<PDEC_TEAM>();  // every warp has reduced its tiles
#pragma unroll
            for (int i = 0; i < B; ++i)
                if (const int e = base + i * PDEC_TEAM; e < k4) xs4[slot(e)] = v[i];
        }
    }
    team_sync<PDEC_TEAM>();
}

// A phase's staged input: plain floats through gemv_stage_input, or tagged words through pdec_stage_tagged.
__device__ __forceinline__ void pdec_stage(float4* xs4, const PdecIn& in, const bf16_t* norm_w, int x_mode, float eps,
                                           int K, float* scratch, int sleep_ns) {
    if (in.f)
        gemv_stage_input<true, true, PDEC_TEAM>(xs4, in.f, norm_w, x_mode, eps, K, scratch);
    else
        pdec_stage_tagged(xs4, in.w, in.tag, norm_w, x_mode, eps, K, scratch, sleep_ns);
}

// Lane r < rows of the warp: the residual of row row0 + r (0 without one). Loaded when a tile starts, so that its
// round trip overlaps the tile's products; the words have their tag by then wherever this block staged their phase
// (always but in small models, where the poll may wait). Only this tile's owner writes row row0 + r next.
__device__ __forceinline__ float pdec_residual(const PdecIn& res, int row0, int rows, int lane) {
    if (lane >= rows) return 0.0f;
    if (res.f) return __ldcg(res.f + row0 + lane);
    if (res.w) return poll_tagged(res.w + row0 + lane, res.tag);
    return 0.0f;
}

// Output row j of a GEMV phase from its sums (lane 0): + bias (+ residual), or (SWIGLU) silu_mul of the gate and up
// sums, each + its bias; gemv_stream's expressions.
template <bool SWIGLU>
__device__ __forceinline__ void pdec_write_row(const PdecOp& o, int j, float gate, float up, const bf16_t* bias,
                                               bool has_residual, float res, const PdecOut& y) {
    float v;
    if constexpr (SWIGLU) {
        if (bias) {
            gate += bf16_to_float(bias[j]);
            up += bf16_to_float(bias[o.out_rows + j]);
        }
        v = silu_mul(gate, up);
    } else {
        if (bias) gate += bf16_to_float(bias[j]);
        if (has_residual) gate += res;
        v = gate;
    }
    if (y.f)
        y.f[j] = v;
    else
        st_tagged(y.w + j, v, y.tag);
}

// One GEMV phase of weight stream `op` of `layer` (the consumers): y = in(x) @ W.T (+ bias) (+ residual), or
// (SWIGLU) y[j] = silu_mul(gate row j, up row j). `at` and `rotation` follow the producer's tiles.
template <bool SWIGLU>
__device__ __forceinline__ void pdec_gemv(const PdecPlan& P, int layer, int op, const PdecIn& x, const bf16_t* norm_w,
                                          int x_mode, const bf16_t* bias, const PdecIn& residual, const PdecOut& y,
                                          const PdecRing& r, RingCursor& at, int& rotation, float4* xs4,
                                          float* scratch, int mark) {
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    TT_MARK(mark);
    const PdecOp o = pdec_op(P, layer, op);
    if (pdec_first_tile(rotation) >= o.tiles) {  // no tile here (small models): no input to wait for
        rotation += o.tiles;
        return;
    }
    const int K = o.K, chunks = K / 8;
    const bool has_residual = residual.f || residual.w;
    pdec_stage(xs4, x, norm_w, x_mode, P.eps, K, scratch, P.poll_ns);
    TT_MARK(mark + 1);
    const float4* xa = xs4;          // inputs 8c .. 8c + 3 of chunk c
    const float4* xb = xs4 + K / 8;  // inputs 8c + 4 .. 8c + 7
    for (int t = pdec_first_tile(rotation); t < o.tiles; t += gridDim.x, at.advance(r.stages, PDEC_CONSUMERS)) {
        // One warp serves each slot, so it meets the slot's uses in order: a parity wait tells use u from use
        // u + 2 only if no warp can run ahead of the slot's previous use.
        if (at.owner != warp) continue;
        const int row0 = t * o.rows, rows = min(o.rows, o.out_rows - row0);
        const float res = has_residual ? pdec_residual(residual, row0, rows, lane) : 0.0f;
        auto res_of = [&](int i) { return __shfl_sync(0xffffffffu, res, i); };  // row row0 + i's, for lane 0
        mbar_wait(&r.full[at.slot], at.use & 1);
        const uint4* wt = reinterpret_cast<const uint4*>(r.mem + (size_t)at.slot * PDEC_SLOT_BYTES);
        int i = 0;
        if constexpr (SWIGLU) {  // gate rows 0 .. rows - 1 of the slot, then the up rows
            const uint4* up = wt + (size_t)rows * chunks;
            for (; i + 2 <= rows; i += 2) {
                float s[4];
                pdec_dot_rows<2, true>(wt + (size_t)i * chunks, up + (size_t)i * chunks, xa, xb, chunks, lane, s);
                if (lane == 0) {
                    pdec_write_row<true>(o, row0 + i, s[0], s[2], bias, false, 0.0f, y);
                    pdec_write_row<true>(o, row0 + i + 1, s[1], s[3], bias, false, 0.0f, y);
                }
            }
            if (i < rows) {
                float s[2];
                pdec_dot_rows<1, true>(wt + (size_t)i * chunks, up + (size_t)i * chunks, xa, xb, chunks, lane, s);
                if (lane == 0) pdec_write_row<true>(o, row0 + i, s[0], s[1], bias, false, 0.0f, y);
            }
        } else {
            for (; i + 4 <= rows; i += 4) {
                float s[4];
                const uint4* w = wt + (size_t)i * chunks;
                pdec_dot_rows<2, true>(w, w + 2 * chunks, xa, xb, chunks, lane, s);
#pragma unroll
                for (int g = 0; g < 4; ++g) {
                    const float rg = res_of(i + g);
                    if (lane == 0) pdec_write_row<false>(o, row0 + i + g, s[g], 0.0f, bias, has_residual, rg, y);
                }
            }
            for (; i < rows; ++i) {
                float s[1];
                pdec_dot_rows<1, false>(wt + (size_t)i * chunks, nullptr, xa, xb, chunks, lane, s);
                const float ri = res_of(i);
                if (lane == 0) pdec_write_row<false>(o, row0 + i, s[0], 0.0f, bias, has_residual, ri, y);
            }
        }
        __syncwarp();  // every lane has read the slot
        if (lane == 0) mbar_arrive(&r.empty[at.slot]);
    }
    rotation += o.tiles;
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
        attn_prefetch_rows_l2<PDEC_TEAM>(L->k_cache, L->v_cache, j0, min(ATTN_CHUNK, length - j0), kv_stride,
                                         h / group_size, P.head_dim);
    }
}

// The attention phase of `layer`: tasks t = h + n_heads * c (head h, chunk c) for blocks b, b + gridDim.x, ...
// q|k|v come from tagged words (qkv, tag qkv_tag); the merged outputs go out as tagged words (out, tag out_tag).
// The per-head counters count up through the launch's layers: a head's merge falls to the block that brings it to
// (layer + 1) * n_chunks. merge_ml: shared memory, 8-byte aligned, for the merge's table (2 * max_chunks floats) and
// the serial merge's handed-over values after it (attn_merge_serial; staging_floats in persistent.py sizes both).
__device__ __forceinline__ void pdec_attention(const PdecPlan& P, int layer, int pos, const unsigned long long* qkv,
                                               unsigned qkv_tag, unsigned long long* out, unsigned out_tag,
                                               AttnShared& sh, float* merge_ml, int mark) {
    TT_MARK(mark);
    const PdecLayer* L = P.layers + layer;
    const AttnDims d{P.n_heads, P.n_kv_heads, P.head_dim, P.max_chunks, P.scale, P.eps};
    const int length = pos + 1, n_chunks = (length + ATTN_CHUNK - 1) / ATTN_CHUNK, last_chunk = pos / ATTN_CHUNK;
    const int tasks = P.n_heads * n_chunks;
    kv_t* k_cache = L->k_cache;
    kv_t* v_cache = L->v_cache;
    const bool active = threadIdx.x < P.head_dim;
    const float q_norm_d = active && L->q_norm ? bf16_to_float(L->q_norm[threadIdx.x]) : 0.0f;
    const float k_norm_d = active && L->k_norm ? bf16_to_float(L->k_norm[threadIdx.x]) : 0.0f;
    // attn_prepare_head_from names a value by its place in a float row; here that row is the words themselves.
    const float* qkv_places = reinterpret_cast<const float*>(qkv);
    const int sleep_ns = P.poll_ns;
    auto load_qkv = [=](const float* p) { return poll_tagged(qkv + (p - qkv_places), qkv_tag, sleep_ns); };
    auto store_out = [=](unsigned i, float v) { st_tagged(out + i, v, out_tag); };
    constexpr int no_trace = 1 << 30;  // TT_MARK slots past the trace buffer: no probes here
    for (int t = blockIdx.x; t < tasks; t += gridDim.x) {
        const int h = t % P.n_heads, c = t / P.n_heads;
        attn_prepare_head_from<PDEC_TEAM>(qkv_places, load_qkv, L->q_norm != nullptr, L->k_norm != nullptr, q_norm_d,
                                          k_norm_d, k_cache, v_cache, P.rope, h, pos, c == last_chunk, 0, 0, d, sh,
                                          no_trace);
        attn_chunk_record<PDEC_TEAM>(k_cache, v_cache, AttnRecords{P.partial, nullptr, false}, h, c, pos, d, sh,
                                     no_trace);
        if (t == (int)blockIdx.x) TT_MARK(mark + 1);
        attn_count_and_merge_to<PDEC_TEAM>(P.partial, store_out, false, P.done, h, n_chunks, (layer + 1) * n_chunks,
                                           d, sh, reinterpret_cast<float2*>(merge_ml), no_trace);
    }
    TT_MARK(mark + 2);
}

// grid (SM count), block PDEC_THREADS, launched cooperatively. The token's embedding is in plan->x (the kernel
// before wrote it); the position comes from device memory (graph replays) or from the host (pos_ptr null).
extern "C" __global__ void __launch_bounds__(PDEC_THREADS, 1)
decode_persistent(const PdecPlan* __restrict__ plan, const int* pos_ptr, int pos_host) {
    extern __shared__ __align__(128) unsigned char pdec_smem[];
    __shared__ __align__(8) uint64_t full[PDEC_MAX_STAGES], empty[PDEC_MAX_STAGES];
    __shared__ float scratch[64];
    __shared__ PdecPlan P;
    __shared__ AttnShared sh;
    if (threadIdx.x == 0) P = *plan;  // written once by the host, before any launch
    __syncthreads();
    PdecRing r;
    r.stages = max(1, min(P.stages, PDEC_MAX_STAGES));  // the host sizes shared memory for its own value
    r.mem = pdec_smem;
    r.full = full;
    r.empty = empty;
    if (threadIdx.x == 0) {
        for (int s = 0; s < r.stages; ++s) {
            mbar_init(&full[s], 1);   // the producer's arrival, plus the bytes
            mbar_init(&empty[s], 1);  // the release by the slot's warp
        }
        mbar_init_fence();
    }
    __syncthreads();  // the last barrier the producer warp joins
    if (threadIdx.x >= PDEC_TEAM) {
        // Only weights, which no kernel writes: the ring fills while the kernel before still runs.
        if (threadIdx.x == PDEC_TEAM) pdec_produce(P, r);
        return;
    }
    float4* xs4 = reinterpret_cast<float4*>(pdec_smem + (size_t)r.stages * PDEC_SLOT_BYTES);
    float* merge_ml = reinterpret_cast<float*>(xs4);  // attention's merge table: the staged row is free then
    pdl_wait();
    const int pos = host_or_device(pos_ptr, pos_host);
    const unsigned epoch = *P.epoch;  // the launch before this one set it, and ended before pdl_wait returned
    // Tags and word runs are worked out where they are used, from P in shared memory, so that nothing of theirs
    // stays live in registers through attention.
    auto tag = [&](int layer, int phase) { return ((unsigned)epoch * P.n_layers + layer) * PDEC_TAGS + phase; };
    auto x_words = [&]() { return P.words; };
    auto qkv_words = [&]() { return P.words + P.hidden; };
    auto attn_words = [&]() { return qkv_words() + P.q_width + 2 * P.kv_width; };
    auto act_words = [&]() { return attn_words() + P.q_width; };
    // x: the embedding (layer 0), else the layer before's down output
    auto x_in = [&](int layer) {
        return layer == 0 ? PdecIn{P.x, nullptr, 0} : PdecIn{nullptr, x_words(), tag(layer - 1, PDEC_TAG_X_DOWN)};
    };
    RingCursor at;
    int rotation = 0;
    for (int layer = 0; layer < P.n_layers; ++layer) {
        // Every block is resident (a cooperative launch), so the next kernel's blocks may take the room that is left
        // without keeping any of ours out.
        if (layer > 0 && layer + 1 == P.n_layers) pdl_launch_dependents();
        pdec_prefetch_kv(P, layer, pos);
        pdec_gemv<false>(P, layer, PDEC_QKV, x_in(layer), P.layers[layer].input_norm, GEMV_IN_RMSNORM,
                         P.layers[layer].qkv_bias, PdecIn{}, PdecOut{nullptr, qkv_words(), tag(layer, PDEC_TAG_QKV)},
                         r, at, rotation, xs4, scratch, pdec_mark(layer, 0));
        pdec_attention(P, layer, pos, qkv_words(), tag(layer, PDEC_TAG_QKV), attn_words(), tag(layer, PDEC_TAG_ATTN),
                       sh, merge_ml, pdec_mark(layer, 1));
        pdec_gemv<false>(P, layer, PDEC_O, PdecIn{nullptr, attn_words(), tag(layer, PDEC_TAG_ATTN)}, nullptr,
                         GEMV_IN_PLAIN, nullptr, x_in(layer), PdecOut{nullptr, x_words(), tag(layer, PDEC_TAG_X_O)},
                         r, at, rotation, xs4, scratch, pdec_mark(layer, 2));
        pdec_gemv<true>(P, layer, PDEC_GATE_UP, PdecIn{nullptr, x_words(), tag(layer, PDEC_TAG_X_O)},
                        P.layers[layer].post_norm, GEMV_IN_RMSNORM, nullptr, PdecIn{},
                        PdecOut{nullptr, act_words(), tag(layer, PDEC_TAG_ACT)}, r, at, rotation, xs4, scratch,
                        pdec_mark(layer, 3));
        // The last layer's output goes to P.x as floats, for the kernels after this launch.
        const PdecOut x_down = layer + 1 == P.n_layers ? PdecOut{P.x, nullptr, 0}
                                                       : PdecOut{nullptr, x_words(), tag(layer, PDEC_TAG_X_DOWN)};
        pdec_gemv<false>(P, layer, PDEC_DOWN, PdecIn{nullptr, act_words(), tag(layer, PDEC_TAG_ACT)}, nullptr,
                         GEMV_IN_PLAIN, nullptr, PdecIn{nullptr, x_words(), tag(layer, PDEC_TAG_X_O)}, x_down, r, at,
                         rotation, xs4, scratch, pdec_mark(layer, 4));
    }
    // The launch's end: the last block to finish resets the merge counters and the count, and moves the epoch on.
    team_sync<PDEC_TEAM>();
    if (threadIdx.x == 0) {
        unsigned before;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(P.finished) : "memory");
        if (before == gridDim.x - 1) {
            for (int h = 0; h < P.n_heads; ++h) P.done[h] = 0;
            *P.finished = 0;
            *P.epoch = epoch + 1;
        }
    }
}
