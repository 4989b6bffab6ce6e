// Prefill GEMM: C[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n]) (+ residual[m, n]).
// A fp32 [M, K] (token rows), W bf16 [N, K], C fp32 [M, N]. Prefill runs the tensor-core kernels below
// (gemm_mma16_bf16, gemm_mma8_bf16); gemm_bf16 serves the shapes they do not take. It is classic shared-memory
// tiling: a 64x64 output tile per block of 256 threads, each thread owning a 4x4 patch, K walked in steps of 16.
// Every output is summed by one thread in ascending k, so results are deterministic. Any M, N, K (edges are
// zero-filled).
#pragma once
#include "common.cuh"

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 16

extern "C" __global__ void __launch_bounds__(256)
gemm_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
          const float* residual, float* C, int M, int N, int K) {
    pdl_enter();
    // Stored k-major so the inner loop reads a row of 4 consecutive m (or n) values per thread.
    __shared__ float As[GEMM_BK][GEMM_BM + 4];
    __shared__ float Ws[GEMM_BK][GEMM_BN + 4];
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    const int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {
        // 64x16 tile of each operand, 4 elements per thread.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = tid + i * 256;
            const int r = e / GEMM_BK, c = e % GEMM_BK;
            const int gm = m0 + r, gn = n0 + r, gk = k0 + c;
            As[c][r] = (gm < M && gk < K) ? A[(size_t)gm * K + gk] : 0.0f;
            Ws[c][r] = (gn < N && gk < K) ? bf16_to_float(W[(size_t)gn * K + gk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = As[kk][tm + i];
                b[i] = Ws[kk][tn + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int gm = m0 + tm + i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int gn = n0 + tn + j;
            if (gn >= N) continue;
            float v = acc[i][j];
            if (bias) v += bf16_to_float(bias[gn]);
            const size_t o = (size_t)gm * N + gn;
            if (residual) v += residual[o];
            C[o] = v;
        }
    }
}

// Prefill GEMM on the tensor cores (mma.sync m16n8k16, bf16 operands, fp32 accumulation): C as gemm_bf16 defines it,
// for any M, bound by the weight stream and the tensor cores rather than by fp32 FMAs.
//
// Precision: each fp32 input is split into two bf16 terms, hi = bf16(a) and lo = bf16(a - hi) (a - hi is exact), and
// the weights are bf16 already, so hi * w and lo * w are exact products and a is carried to about 16 significant
// bits (relative error about 2^-17), against 8 for a plain bf16 cast; the sums are the tensor core's fp32 sums.
//
// Layout: block (tg, rb) stages tokens tg * T .. tg * T + T - 1 (zeros past M) in shared memory as hi and lo rows, then
// takes row groups rb, rb + gridDim.y, ... of ROWS = 8 * TILES * PARTS output rows. Warp w owns part w % PARTS of a
// group's rows (TILES n8 tiles, so each A fragment read from shared memory feeds TILES tiles; in the sixteen-warp forms
// PARTS is 4, else 2) and quarter w / PARTS of K's steps (ceil(steps / 4) consecutive steps each, so a warp streams its
// rows contiguously). In step s lane (gid, tig) = (lane / 4, lane % 4) loads 16 bytes of each tile's weight row gid,
// columns 32 s + 8 tig .. + 7, which feed two k16 mmas: the mma's logical k = 2 tig + e and 8 + 2 tig + e (e = 0, 1)
// stand for columns 32 s + 8 tig + 4 h + e and + 2 + e in the h-th of them. The same map holds for A's fragments, so
// every column is summed once. A group's four K-quarters are then added in ascending order through shared memory.
// Weights are requested BATCH steps ahead, across row groups, the first batch before the wait (a second batch in
// flight through shared memory measured slower: docs/cuda-speed-notes.md #140).
// Rows a group: 64 (TILES 4, BATCH 4), or 32 (TILES 2) and 128 (TILES 8, BATCH 2: the same bytes in flight). On an
// H100 a block takes about 0.65 times as long for a group of 32 rows as for 64, and 1.8 times for 128
// (docs/cuda-speed-notes.md #148): a step's fragment loads and latencies come whatever the tiles, so the host takes
// 32 where the grid has blocks to spare and 128 where blocks take several groups each. A tile's chain of mmas is the
// same in every form: the same bits.
// Deterministic: an output element is a fixed sum of four chains of mmas in ascending steps, whatever the grid; and
// an mma's row does not depend on the other rows of its tile, so a token's results do not depend on the tokens
// beside it (prefill chunks give the same bits). Requires K % 32 == 0. Dynamic shared memory: gemm_mma_shared().
#define GMMA_TILES 4         // n8 tiles a warp owns in the 64-row form: half of a group's rows
#define GMMA_KSPLIT 4        // warps that share a row part, each taking a quarter of K's steps
#define GMMA_BATCH 4         // steps of weights a lane keeps in flight in the 64-row form (4 loads of 16 bytes each)
#define GMMA_RED_PAD 4       // floats past a group's rows in a token row of the partials (no bank conflicts)

// Row stride of the staged tokens, in bf16: K rounded so that it is 32 more than a multiple of 64, which puts the
// two rows that a quarter warp reads together in different halves of the banks.
__host__ __device__ __forceinline__ int gemm_mma_stride(int K) { return K + (96 - K % 64) % 64; }

// Two fp32 values rounded to bf16 (round to nearest even), packed with x0 in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float x0, float x1) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(x1), "f"(x0));
    return d;
}

// hi and lo terms of two fp32 values, hi = bf16(x) and lo = bf16(x - hi) (x - hi is exact), each pair packed with
// x0's in the low half.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    hi = pack_bf16x2(x0, x1);
    float h0, h1;
    bf16x2_to_float(hi, h0, h1);
    lo = pack_bf16x2(x0 - h0, x1 - h1);
}

// hi and lo terms of 8 consecutive fp32 inputs, as 8 packed bf16 each.
__device__ __forceinline__ void split_bf16x8(const float4& a, const float4& b, uint4& hi, uint4& lo) {
    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t h[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) split_bf16x2(x[2 * i], x[2 * i + 1], h[i], l[i]);
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// d += a (16 x 16, row) * b (16 x 8, col), bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 32-column step of a tile (the column map: gemm_mma's comment): d += the lane's token rows gid (h0, l0) and
// gid + 8 (h8, l8), hi terms then lo, times the tile's weights w, the step's first k16 and then its second. This
// order fixes every tensor-core GEMM's bits; gemm_mma_cluster takes it too.
__device__ __forceinline__ void gemm_mma_step(float (&d)[4], const uint4& h0, const uint4& h8, const uint4& l0,
                                              const uint4& l8, const uint4& w) {
    mma_bf16_16816(d, h0.x, h8.x, h0.y, h8.y, w.x, w.y);
    mma_bf16_16816(d, l0.x, l8.x, l0.y, l8.y, w.x, w.y);
    mma_bf16_16816(d, h0.z, h8.z, h0.w, h8.w, w.z, w.w);
    mma_bf16_16816(d, l0.z, l8.z, l0.w, l8.w, w.z, w.w);
}

// Stages columns 0 .. K - 1 of tokens t0 .. t0 + T - 1 of A (rows a_ld floats apart; zeros past M) as hi rows at As
// and lo rows at As + T * ld (ld bf16 apart), four 8-column chunks a thread at a time, then synchronises.
template <int T>
__device__ __forceinline__ void gemm_mma_stage(bf16_t* As, const float* __restrict__ A, int t0, int M, int K,
                                               int a_ld, int ld) {
    const int c8 = K / 8, n = T * c8;
    for (int base = threadIdx.x; base < n; base += 4 * blockDim.x) {
        float4 v[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // every load of the round before any use
            const int e = base + i * blockDim.x, r = e / c8, c = e % c8;
            const bool live = e < n && t0 + r < M;
            const float4* src = reinterpret_cast<const float4*>(A + (size_t)(t0 + r) * a_ld + c * 8);
            v[i][0] = live ? src[0] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v[i][1] = live ? src[1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = base + i * blockDim.x, r = e / c8, c = e % c8;
            if (e >= n) continue;
            uint4 hi, lo;
            split_bf16x8(v[i][0], v[i][1], hi, lo);
            *reinterpret_cast<uint4*>(As + (size_t)r * ld + c * 8) = hi;
            *reinterpret_cast<uint4*>(As + (size_t)(T + r) * ld + c * 8) = lo;
        }
    }
    __syncthreads();
}

template <int T, bool HALVES = false, int TILES = GMMA_TILES, int BATCH = GMMA_BATCH, int PARTS = 2>
__device__ __forceinline__ void gemm_mma(const float* __restrict__ A, const bf16_t* __restrict__ W,
                                         const bf16_t* __restrict__ bias, const float* residual, float* C, int M, int N,
                                         int K) {
    static_assert(T == 8 || T == 16, "a block stages one m16 tile of tokens, or its top half");
    // PARTS * GMMA_KSPLIT warps: PARTS row parts (TILES n8 tiles each), four K-quarters.
    constexpr int ROWS = PARTS * TILES * 8, RED = ROWS + GMMA_RED_PAD;  // a group's rows; floats a token's partials
    extern __shared__ __align__(16) unsigned char gmma_smem[];
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP, gid = lane / 4, tig = lane % 4;
    const int part = warp % PARTS, quarter = warp / PARTS;  // the warp's row part and K-quarter
    const int steps = K / 32;
    const int quarter_steps = (steps + GMMA_KSPLIT - 1) / GMMA_KSPLIT, first_step = quarter * quarter_steps;
    // HALVES: each quarter's steps in two phases of hs steps (whole batches), staged one phase at a time.
    const int hs = HALVES ? ((quarter_steps + 1) / 2 + BATCH - 1) / BATCH * BATCH : quarter_steps;
    const int cols = HALVES ? GMMA_KSPLIT * hs * 32 : K, t0 = blockIdx.x * T;
    const int ld = gemm_mma_stride(cols);
    bf16_t* As = reinterpret_cast<bf16_t*>(gmma_smem);
    float* red = reinterpret_cast<float*>(As + (size_t)2 * T * ld);  // [quarter][T][RED]
    const int my_steps = max(0, min(quarter_steps, steps - first_step));  // steps first_step .. + my_steps - 1
    const int batches = (quarter_steps + BATCH - 1) / BATCH;  // the same in every warp
    const int groups = (N + ROWS - 1) / ROWS;
    // This warp's weight batches: (row group, batch) in order, row groups blockIdx.y, + gridDim.y, ... The loads walk
    // them with a running cursor, so a batch costs its loads and no address arithmetic past a group's first.
    const uint4* wrow[TILES];  // the tiles' rows gid in the group being loaded, at the batch being loaded
    int load_b = 0, load_g = blockIdx.y;
    auto aim = [&](int g) {
        const int row0 = g * ROWS + part * (TILES * 8) + gid;
#pragma unroll
        for (int r = 0; r < TILES; ++r)
            wrow[r] = reinterpret_cast<const uint4*>(W + (size_t)min(row0 + r * 8, N - 1) * K) + tig + first_step * 4;
    };
    // The next batch into w, then the cursor on. Lanes past the last batch or step load nothing: no mma reads those
    // registers (the steps loop stops at my_steps, the batch loop at the last batch).
    auto load = [&](uint4 (&w)[BATCH][TILES]) {
        if (load_g >= groups) return;  // warp-uniform
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int jj = load_b * BATCH + j;
            if (jj < my_steps)
#pragma unroll
                for (int r = 0; r < TILES; ++r) w[j][r] = __ldg(wrow[r] + j * 4);
        }
#pragma unroll
        for (int r = 0; r < TILES; ++r) wrow[r] += BATCH * 4;
        if (++load_b == batches) {
            load_b = 0;
            load_g += gridDim.y;
            if (load_g < groups) aim(load_g);
        }
    };
    uint4 w0[BATCH][TILES] = {}, w1[BATCH][TILES] = {};
    if (load_g < groups) aim(load_g);
    load(w0);  // weights only: no kernel writes them
    // HALVES: phase p's steps of every quarter q, side by side (quarter q's at column q * hs * 32).
    auto stage_phase = [&](int p) {
        for (int q = 0; q < GMMA_KSPLIT; ++q) {
            const int from = q * quarter_steps + p * hs;
            const int n = min(hs, min(quarter_steps, steps - q * quarter_steps) - p * hs);  // may be <= 0
            gemm_mma_stage<T>(As + q * hs * 32, A + from * 32, t0, M, max(0, n) * 32, K, ld);
        }
    };
    pdl_enter();
    if constexpr (HALVES)
        stage_phase(0);
    else
        gemm_mma_stage<T>(As, A, t0, M, K, K, ld);
    const bf16_t* hi_g = As + (size_t)gid * ld + tig * 8;  // this lane's A rows: gid (and gid + 8), hi then lo
    const bf16_t* lo_g = As + (size_t)(T + gid) * ld + tig * 8;
    float acc[TILES][4] = {};
    int b = 0, g = blockIdx.y;  // the batch being reduced and its row group
    // Batch (g, b) from cur, with the next batch loaded into spare first.
    auto reduce = [&](uint4 (&cur)[BATCH][TILES], uint4 (&spare)[BATCH][TILES]) {
        load(spare);
        if constexpr (HALVES) {  // a group's second phase, or a new group after one: every warp has read the rows
            if ((b > 0 || g != (int)blockIdx.y) && hs < quarter_steps && (b == 0 || b * BATCH == hs)) {
                __syncthreads();
                stage_phase(b == 0 ? 0 : 1);
            }
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int jj = b * BATCH + j;
            if (jj >= my_steps) break;
            const int col = HALVES ? (quarter * hs + jj - (jj >= hs ? hs : 0)) * 32 : (first_step + jj) * 32;
            const uint4 h0 = *reinterpret_cast<const uint4*>(hi_g + col);  // rows gid, hi and lo
            const uint4 l0 = *reinterpret_cast<const uint4*>(lo_g + col);
            uint4 h8 = make_uint4(0u, 0u, 0u, 0u), l8 = h8;  // rows gid + 8: none when T == 8
            if constexpr (T == 16) {
                h8 = *reinterpret_cast<const uint4*>(hi_g + 8 * ld + col);
                l8 = *reinterpret_cast<const uint4*>(lo_g + 8 * ld + col);
            }
#pragma unroll
            for (int r = 0; r < TILES; ++r) gemm_mma_step(acc[r], h0, h8, l0, l8, cur[j][r]);
        }
        if (++b < batches) return;
        // The group's K-quarter partials, then their sums in ascending quarter order.
#pragma unroll
        for (int r = 0; r < TILES; ++r)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = gid + (e / 2) * 8;
                if (row < T)
                    red[(quarter * T + row) * RED + part * TILES * 8 + r * 8 + tig * 2 + e % 2] = acc[r][e];
                acc[r][e] = 0.0f;
            }
        __syncthreads();
        const int n0 = g * ROWS;
        for (int idx = threadIdx.x; idx < T * ROWS; idx += blockDim.x) {
            const int row = idx / ROWS, c = idx % ROWS, t = t0 + row, col = n0 + c;
            if (t < M && col < N) {
                float v = red[row * RED + c];
#pragma unroll
                for (int q = 1; q < GMMA_KSPLIT; ++q) v += red[(q * T + row) * RED + c];
                if (bias) v += bf16_to_float(bias[col]);
                const size_t o = (size_t)t * N + col;
                if (residual) v += residual[o];
                C[o] = v;
            }
        }
        __syncthreads();  // red is written again by the next group
        b = 0;
        g += gridDim.y;
    };
    // Unrolled by two so that the two batches in registers swap roles instead of being copied.
    while (g < groups) {
        reduce(w0, w1);
        if (g >= groups) break;
        reduce(w1, w0);
    }
}

// Blocks of 16 tokens (the K of most rows); gemm_mma8_bf16 stages 8, for rows too wide for 16 (an MLP down row).
extern "C" __global__ void __launch_bounds__(256, 1)
gemm_mma16_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                const float* residual, float* C, int M, int N, int K) {
    gemm_mma<16>(A, W, bias, residual, C, M, N, K);
}

// 16 tokens with each K-quarter's rows staged in two phases, for rows too wide to stage whole (an MLP down row).
extern "C" __global__ void __launch_bounds__(256, 1)
gemm_mma16h_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                 const float* residual, float* C, int M, int N, int K) {
    gemm_mma<16, true>(A, W, bias, residual, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
gemm_mma8_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
               const float* residual, float* C, int M, int N, int K) {
    gemm_mma<8>(A, W, bias, residual, C, M, N, K);
}

// Row groups of 32 (two n8 tiles a warp), for grids with blocks to spare; of 128 (eight tiles, two steps a batch), for
// grids whose blocks take several groups each.
extern "C" __global__ void __launch_bounds__(256, 1)
gemm_mma16r32_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                   const float* residual, float* C, int M, int N, int K) {
    gemm_mma<16, false, 2>(A, W, bias, residual, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
gemm_mma8r32_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                  const float* residual, float* C, int M, int N, int K) {
    gemm_mma<8, false, 2>(A, W, bias, residual, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
gemm_mma16r128_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                    const float* residual, float* C, int M, int N, int K) {
    gemm_mma<16, false, 8, 2>(A, W, bias, residual, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 1)
gemm_mma8r128_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                   const float* residual, float* C, int M, int N, int K) {
    gemm_mma<8, false, 8, 2>(A, W, bias, residual, C, M, N, K);
}

// Sixteen warps (four row parts of two n8 tiles, four K-quarters) on a 64-row group: twice the warps an SM of
// gemm_mma16_bf16 for the same staged tokens, the same chains of mmas (the same bits). Opt-in: on an H100 within 5%
// of the eight-warp form alone either way (docs/cuda-speed-notes.md #149).
extern "C" __global__ void __launch_bounds__(512, 1)
gemm_mma16w_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                 const float* residual, float* C, int M, int N, int K) {
    gemm_mma<16, false, 2, GMMA_BATCH, 4>(A, W, bias, residual, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(512, 1)
gemm_mma8w_bf16(const float* __restrict__ A, const bf16_t* __restrict__ W, const bf16_t* __restrict__ bias,
                const float* residual, float* C, int M, int N, int K) {
    gemm_mma<8, false, 2, GMMA_BATCH, 4>(A, W, bias, residual, C, M, N, K);
}
