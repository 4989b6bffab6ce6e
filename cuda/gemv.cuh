// Decode GEMV: y[t, n] = sum_k W[n, k] * in[t, k] (+ bias[n]) (+ residual[t, n]).
// W is bf16 [N, K] row-major (Hugging Face's [out_features, in_features]); activations are fp32.
//
// Each block first stages its input row in shared memory (K floats, dynamic), applying the input transform
// once per block rather than once per warp:
//   GEMV_IN_PLAIN    in = x[t, :K]
//   GEMV_IN_RMSNORM  in = rmsnorm(x[t, :K]) * norm_w, with the rmsnorm kernel's partition, tree and expression,
//                    so the values are bit-identical to running that kernel first
// Then a row belongs to `warps_per_row` warps of the block (1, 2, 4 or 8; the host picks it from the shape
// alone, so a given matrix is always reduced the same way). Lane l of part p reads 16-byte weight chunks
// (8 bf16) p*32 + l, then every 32*warps_per_row chunks, accumulating in fp32 in ascending order; each warp
// folds its lanes with a fixed butterfly, and the parts are added in ascending order. No atomics.
// A lane's first GEMV_PREFETCH chunks are loaded into registers before the input is staged, so the weight
// stream is in flight while the block stages (and normalises) its input, and, under a programmatic dependent
// launch, while the kernel before it finishes; that changes no arithmetic.
// gemv_swiglu_bf16 writes silu(row j) * row (N/2 + j), j < N/2, for the fused gate|up weight instead: the warp
// that reduces gate row j reduces up row j next. The rows' sums and silu_mul are those of gemv_bf16 followed by the
// swiglu kernel, so the bits are too; the MLP's down GEMV then stages a plain input instead of every block
// recomputing silu(gate) * up for its whole row.
// Requires K % 8 == 0 (16-byte rows), checked on the host.
#pragma once
#include "common.cuh"
#include "rmsnorm.cuh"

#define GEMV_WARPS 8  // warps per block of 256 threads
#define GEMV_IN_PLAIN 0
#define GEMV_IN_RMSNORM 1

#define GEMV_STAGE_BATCH 4  // float4 loads per thread issued together while staging (all in flight at once)

// A row that fits one batch of loads a thread (v: chunks e = threadIdx.x + i * TEAM's stride, w: their norm
// weights), normalised into xs4[slot(e)]: the sum of squares in rms_sum_of_squares's partition and order
// (chunks ascending per thread, components in order), then each chunk scaled. gemv_stage_input and the persistent
// kernel's tagged staging load the row their own ways, then share this.
template <int TEAM, class Slot>
__device__ __forceinline__ void rms_stage_batch(float4* xs4, const float4 (&v)[GEMV_STAGE_BATCH],
                                                const uint2 (&w)[GEMV_STAGE_BATCH], int k4, int K, float eps,
                                                float* scratch, Slot slot) {
    const int stride = team_size<TEAM>();
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
        if (threadIdx.x + i * stride < k4) ss = fma_squares(v[i], ss);
    }
    const float inv = rms_inverse(block_sum<TEAM>(ss, scratch), K, eps);
#pragma unroll
    for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
        const int e = threadIdx.x + i * stride;
        if (e < k4) xs4[slot(e)] = rms_scale4(v[i], inv, w[i]);
    }
}

// Writes the transformed input row to xs (K floats) and synchronises the block. Each thread owns float4 chunks
// e = threadIdx.x + i * blockDim.x and issues GEMV_STAGE_BATCH of them before it uses any, so staging costs one
// L2 round trip per batch rather than one per chunk. Every value is the same expression of the same inputs as
// before, in whatever order the chunks are visited.
// HALVES: float4 e goes to xs4[(e % 2) * K / 8 + e / 2], so the first and second halves of the 8 inputs of weight
// chunk c sit at xs4[c] and xs4[K / 8 + c]: a warp reading consecutive chunks then reads consecutive float4s
// (gemv_stream.cuh). CG: the row is read through L2 only (load_activation; the persistent decode kernel).
template <bool HALVES = false, bool CG = false, int TEAM = 0>
__device__ __forceinline__ void gemv_stage_input(float4* __restrict__ xs4, const float* __restrict__ xt,
                                                 const bf16_t* __restrict__ norm_w, int x_mode, float eps, int K,
                                                 float* scratch) {
    const float4* x4 = reinterpret_cast<const float4*>(xt);
    const int k4 = K / 4, stride = team_size<TEAM>();
    auto slot = [K](int e) { return HALVES ? (e % 2) * (K / 8) + e / 2 : e; };
    if (x_mode == GEMV_IN_RMSNORM && k4 <= GEMV_STAGE_BATCH * stride) {
        // The row fits one batch: one round of loads serves the sum of squares (rms_sum_of_squares's partition
        // and order: chunks ascending per thread, components in order) and the normalised values.
        float4 v[GEMV_STAGE_BATCH];
        uint2 w[GEMV_STAGE_BATCH];
        const uint2* w4 = reinterpret_cast<const uint2*>(norm_w);
#pragma unroll
        for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
            const int e = threadIdx.x + i * stride;
            if (e < k4) {
                v[i] = load_activation<CG>(x4 + e);
                w[i] = w4[e];
            }
        }
        rms_stage_batch<TEAM>(xs4, v, w, k4, K, eps, scratch, slot);
    } else if (x_mode == GEMV_IN_RMSNORM) {
        const float inv = rms_inverse(rms_sum_of_squares<CG, TEAM>(x4, k4, scratch), K, eps);
        const uint2* w4 = reinterpret_cast<const uint2*>(norm_w);  // 4 bf16 weights per float4 chunk
        for (int base = threadIdx.x; base < k4; base += GEMV_STAGE_BATCH * stride) {
            float4 v[GEMV_STAGE_BATCH];
            uint2 w[GEMV_STAGE_BATCH];
#pragma unroll
            for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
                const int e = base + i * stride;
                if (e < k4) {
                    v[i] = load_activation<CG>(x4 + e);
                    w[i] = w4[e];
                }
            }
#pragma unroll
            for (int i = 0; i < GEMV_STAGE_BATCH; ++i) {
                const int e = base + i * stride;
                if (e < k4) xs4[slot(e)] = rms_scale4(v[i], inv, w[i]);  // as the rmsnorm kernel writes each element
            }
        }
    } else {  // twice the batch: a 6,144-wide row (the MLP down GEMV's) is staged in one round of loads, not two
        for (int base = threadIdx.x; base < k4; base += 2 * GEMV_STAGE_BATCH * stride) {
            float4 v[2 * GEMV_STAGE_BATCH];
#pragma unroll
            for (int i = 0; i < 2 * GEMV_STAGE_BATCH; ++i) {
                const int e = base + i * stride;
                if (e < k4) v[i] = load_activation<CG>(x4 + e);
            }
#pragma unroll
            for (int i = 0; i < 2 * GEMV_STAGE_BATCH; ++i) {
                const int e = base + i * stride;
                if (e < k4) xs4[slot(e)] = v[i];
            }
        }
    }
    team_sync<TEAM>();
}

#define GEMV_TRACE_SLOT 6144  // TT_MARK slots of block b: 6144 + 4b .. 6144 + 4b + 3 (-DTT_TRACE)
#define GEMV_PREFETCH 8  // 16-byte chunks per lane loaded before the input is staged (a whole 2048-wide row)

// acc += the 8 products of a chunk's weights (as floats) with its 8 staged inputs, in ascending order: the one order
// of every GEMV form, whatever the weights' format.
__device__ __forceinline__ float gemv_fma8(float acc, float w0, float w1, float w2, float w3, float w4, float w5,
                                           float w6, float w7, const float4 xa, const float4 xb) {
    acc = fmaf(w0, xa.x, acc);
    acc = fmaf(w1, xa.y, acc);
    acc = fmaf(w2, xa.z, acc);
    acc = fmaf(w3, xa.w, acc);
    acc = fmaf(w4, xb.x, acc);
    acc = fmaf(w5, xb.y, acc);
    acc = fmaf(w6, xb.z, acc);
    acc = fmaf(w7, xb.w, acc);
    return acc;
}

// acc += the 8 products of one 16-byte bf16 weight chunk with its 8 staged inputs, in ascending order.
__device__ __forceinline__ float gemv_fma_chunk(float acc, const uint4 w, const float4 xa, const float4 xb) {
    float w0, w1, w2, w3, w4, w5, w6, w7;
    bf16x2_to_float(w.x, w0, w1);
    bf16x2_to_float(w.y, w2, w3);
    bf16x2_to_float(w.z, w4, w5);
    bf16x2_to_float(w.w, w6, w7);
    return gemv_fma8(acc, w0, w1, w2, w3, w4, w5, w6, w7, xa, xb);
}

// The first GEMV_PREFETCH chunks of a lane's share of a row (chunks p*32 + l + i*32*warps_per_row). Issued
// before the input is staged so the weight stream's HBM latency overlaps the staging; the values are consumed
// by gemv_row_dot_from in the same order gemv_row_dot reads them. A lane past the row end loads nothing.
struct GemvPrefetch {
    uint4 w[GEMV_PREFETCH];
};

__device__ __forceinline__ GemvPrefetch gemv_prefetch(const uint4* __restrict__ wrow, int K, int part, int lane,
                                                      int warps_per_row) {
    GemvPrefetch pf;
    const int chunks = K / 8, step = warps_per_row * TT_WARP, first = part * TT_WARP + lane;
#pragma unroll
    for (int i = 0; i < GEMV_PREFETCH; ++i) {
        const int c = first + i * step;
        pf.w[i] = c < chunks ? __ldcs(wrow + c) : make_uint4(0u, 0u, 0u, 0u);  // weights are read once per step
    }
    return pf;
}

#define GEMV_BATCH 4  // chunks per lane loaded together past the prefetched ones

// Chunks c, c + step, ... (GEMV_BATCH of them; zeros past `chunks`) of a weight row, loaded together and marked
// evict-first (decode reads each weight once per step).
__device__ __forceinline__ void gemv_load_batch(uint4 (&batch)[GEMV_BATCH], const uint4* __restrict__ wrow, int c,
                                                int step, int chunks) {
#pragma unroll
    for (int i = 0; i < GEMV_BATCH; ++i)
        batch[i] = c + i * step < chunks ? __ldcs(wrow + c + i * step) : make_uint4(0u, 0u, 0u, 0u);
}

// A lane's chunks first, first + step, ... below `chunks`, in ascending order: use(ci, w) for each. The first
// PREFETCHED come from `pf` (loaded earlier into registers); the rest GEMV_BATCH at a time with the following batch
// in flight while one is used. The first batch is requested before the prefetched chunks are used, so a row longer
// than the prefetch (the MLP down projection) costs no extra round trip after the prefetch lands.
template <int PREFETCHED, class Use>
__device__ __forceinline__ void gemv_batched_chunks(const uint4 (&pf)[PREFETCHED], const uint4* __restrict__ wrow,
                                                    int first, int step, int chunks, Use use) {
    int c = first + PREFETCHED * step;
    uint4 next[GEMV_BATCH];
    gemv_load_batch(next, wrow, c, step, chunks);
#pragma unroll
    for (int i = 0; i < PREFETCHED; ++i) {
        const int cp = first + i * step;
        if (cp < chunks) use(cp, pf[i]);
    }
    while (c < chunks) {
        uint4 cur[GEMV_BATCH];
#pragma unroll
        for (int i = 0; i < GEMV_BATCH; ++i) cur[i] = next[i];
        const int c_next = c + GEMV_BATCH * step;
        gemv_load_batch(next, wrow, c_next, step, chunks);
#pragma unroll
        for (int i = 0; i < GEMV_BATCH; ++i) {
            const int ci = c + i * step;
            if (ci < chunks) use(ci, cur[i]);
        }
        c = c_next;
    }
}

// One row's dot product with the staged input: lane l of part p reads 16-byte chunks p*32 + l, then every
// 32*warps_per_row chunks, in ascending order (the first GEMV_PREFETCH of them from pf); the warp folds its lanes
// with the fixed butterfly. The arithmetic does not depend on which chunks were prefetched.
__device__ __forceinline__ float gemv_row_dot_from(const GemvPrefetch& pf, const uint4* __restrict__ wrow,
                                                   const float4* __restrict__ xs4, int K, int part, int lane,
                                                   int warps_per_row) {
    float acc = 0.0f;
    const int chunks = K / 8, step = warps_per_row * TT_WARP, first = part * TT_WARP + lane;
    gemv_batched_chunks(pf.w, wrow, first, step, chunks, [&](int ci, const uint4& w) {
        acc = gemv_fma_chunk(acc, w, xs4[2 * ci], xs4[2 * ci + 1]);
    });
    return warp_sum(acc);
}

// The same dot product with no prefetch ahead of it. The dense GEMV and the sparse head both reduce a row this
// way, so a row's logit is the same bits under either head.
__device__ __forceinline__ float gemv_row_dot(const uint4* __restrict__ wrow, const float4* __restrict__ xs4, int K,
                                              int part, int lane, int warps_per_row) {
    const GemvPrefetch pf = gemv_prefetch(wrow, K, part, lane, warps_per_row);
    return gemv_row_dot_from(pf, wrow, xs4, K, part, lane, warps_per_row);
}

// A row shared by warps_per_row warps: the writer (part 0, lane 0) adds the other parts' sums in ascending order.
// `parts` (GEMV_WARPS floats) must not be in use by the previous call's readers: callers alternate two of them.
// Uniform across the block (it synchronises when warps_per_row > 1).
__device__ __forceinline__ float gemv_fold_parts(float acc, float* parts, int part, int lane, int warp,
                                                 int warps_per_row) {
    if (warps_per_row == 1) return acc;
    if (lane == 0) parts[warp] = acc;
    __syncthreads();
    if (part == 0 && lane == 0)
        for (int p = 1; p < warps_per_row; ++p) acc += parts[warp + p];
    return acc;
}

// Row t of x starts at t * K; norm_w and eps serve GEMV_IN_RMSNORM only.
// residual may alias y. A block owns groups of 8 / warps_per_row consecutive rows: group blockIdx.x, then every
// gridDim.x-th group, so any grid (ncols, n_tokens) with 1 <= ncols <= ceil(N / (8 / warps_per_row)) covers
// every row once; the grid changes no result (a row's arithmetic never depends on its block). The input is
// staged once per block, and the next group's weights are loaded while the current group is reduced.
// Dynamic shared memory K * 4 bytes.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * TT_WARP)
gemv_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w, int x_mode,
          float eps, const bf16_t* __restrict__ bias, const float* residual, float* y, int N, int K,
          int warps_per_row) {
    extern __shared__ float4 xs4[];
    __shared__ float scratch[32];
    __shared__ float parts[2][GEMV_WARPS];  // alternate halves per group, so one barrier per group suffices
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    const int part = warp % warps_per_row;
    const int rows = GEMV_WARPS / warps_per_row, groups = (N + rows - 1) / rows;
    const int slot = warp / warps_per_row;
    const int t = blockIdx.y;
    // Rows past N (and groups past the last) read nothing: their lanes see K = 0.
    int g = blockIdx.x, n = g * rows + slot;
    const uint4* wrow = reinterpret_cast<const uint4*>(W + (size_t)min(n, N - 1) * K);
    GemvPrefetch pf = gemv_prefetch(wrow, n < N ? K : 0, part, lane, warps_per_row);
    // The lane that writes a row loads its bias and residual ahead of the dot product, so neither costs a round
    // trip after it (the additions are unchanged). The bias is a weight: read before the wait.
    const bool writer = part == 0 && lane == 0;
    float b_cur = writer && bias && n < N ? bf16_to_float(bias[n]) : 0.0f;
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4);
    pdl_enter();  // only weights were read so far; the input may still be in the making
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 1);
    float r_cur = writer && residual && n < N ? residual[(size_t)t * N + n] : 0.0f;
    gemv_stage_input(xs4, x + (size_t)t * K, norm_w, x_mode, eps, K, scratch);
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 2);

    for (int it = 0; g < groups; g += gridDim.x, ++it) {
        const int n_next = (g + gridDim.x) * rows + slot;
        const uint4* wrow_next = reinterpret_cast<const uint4*>(W + (size_t)min(n_next, N - 1) * K);
        const GemvPrefetch pf_next = gemv_prefetch(wrow_next, n_next < N ? K : 0, part, lane, warps_per_row);
        // rows are owned by one block each, so the next row's residual is not this row's output
        const float b_next = writer && bias && n_next < N ? bf16_to_float(bias[n_next]) : 0.0f;
        const float r_next = writer && residual && n_next < N ? residual[(size_t)t * N + n_next] : 0.0f;
        float acc = 0.0f;
        if (n < N) acc = gemv_row_dot_from(pf, wrow, xs4, K, part, lane, warps_per_row);
        if (warps_per_row > 1) {  // uniform across the block
            if (lane == 0) parts[it & 1][warp] = acc;
            __syncthreads();
            if (part == 0 && lane == 0)
                for (int p = 1; p < warps_per_row; ++p) acc += parts[it & 1][warp + p];  // ascending part order
        }
        if (n < N && writer) {
            if (bias) acc += b_cur;
            if (residual) acc += r_cur;
            y[(size_t)t * N + n] = acc;
        }
        b_cur = b_next;
        r_cur = r_next;
        pf = pf_next;
        wrow = wrow_next;
        n = n_next;
    }
    TT_MARK(GEMV_TRACE_SLOT + blockIdx.x * 4 + 3);
}

// The SwiGLU output of the fused gate|up weight (N rows, N even): y[t, j] = silu_mul(row j, row N/2 + j), j < N/2.
// A block owns groups of rows = 8 / warps_per_row gate rows (group blockIdx.x, then every gridDim.x-th; any grid up
// to ceil((N / 2) / rows) covers them). The warp that reduces gate row j reduces up row j next, with the up row's
// weights requested while it reduces the gate row and the next group's gate row while it reduces the up row; its
// writer keeps the gate sum for silu_mul, so no warp waits for another. Each row's sum is gemv_bf16's. Held to
// two resident blocks per SM, as gemv_bf16 (at most 128 registers).
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * TT_WARP, 2)
gemv_swiglu_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x, const bf16_t* __restrict__ norm_w,
                 int x_mode, float eps, const bf16_t* __restrict__ bias, float* y, int N, int K, int warps_per_row) {
    extern __shared__ float4 xs4[];
    __shared__ float scratch[32];
    __shared__ float parts[2][GEMV_WARPS];  // alternate halves per row, so one barrier per row suffices
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    const int part = warp % warps_per_row;
    const int rows = GEMV_WARPS / warps_per_row, half = N / 2, groups = (half + rows - 1) / rows;
    const int slot = warp / warps_per_row;
    const int t = blockIdx.y;
    const bool writer = part == 0 && lane == 0;
    // Rows past the end (and groups past the last) read nothing: their lanes see K = 0.
    int g = blockIdx.x, j = g * rows + slot;
    const uint4* gate_row = reinterpret_cast<const uint4*>(W + (size_t)min(j, half - 1) * K);
    GemvPrefetch pf_gate = gemv_prefetch(gate_row, j < half ? K : 0, part, lane, warps_per_row);
    float b_gate = writer && bias && j < half ? bf16_to_float(bias[j]) : 0.0f;  // a weight: read before the wait
    pdl_enter();  // only weights were read so far; the input may still be in the making
    gemv_stage_input(xs4, x + (size_t)t * K, norm_w, x_mode, eps, K, scratch);

    for (; g < groups; g += gridDim.x) {
        const bool valid = j < half;
        const uint4* up_row = reinterpret_cast<const uint4*>(W + (size_t)(half + min(j, half - 1)) * K);
        const GemvPrefetch pf_up = gemv_prefetch(up_row, valid ? K : 0, part, lane, warps_per_row);
        const float b_up = writer && bias && valid ? bf16_to_float(bias[half + j]) : 0.0f;
        float gate = valid ? gemv_row_dot_from(pf_gate, gate_row, xs4, K, part, lane, warps_per_row) : 0.0f;
        gate = gemv_fold_parts(gate, parts[0], part, lane, warp, warps_per_row);

        const int j_next = j + gridDim.x * rows;
        gate_row = reinterpret_cast<const uint4*>(W + (size_t)min(j_next, half - 1) * K);
        pf_gate = gemv_prefetch(gate_row, j_next < half ? K : 0, part, lane, warps_per_row);
        const float b_next = writer && bias && j_next < half ? bf16_to_float(bias[j_next]) : 0.0f;
        float up = valid ? gemv_row_dot_from(pf_up, up_row, xs4, K, part, lane, warps_per_row) : 0.0f;
        up = gemv_fold_parts(up, parts[1], part, lane, warp, warps_per_row);
        if (valid && writer) {
            if (bias) {
                gate += b_gate;
                up += b_up;
            }
            y[(size_t)t * half + j] = silu_mul(gate, up);
        }
        b_gate = b_next;
        j = j_next;
    }
}
