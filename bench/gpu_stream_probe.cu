// How close to HBM bandwidth can a decode step's GEMVs run when one kernel streams the weights without ever waiting
// on the data? A probe for the design after the persistent decode kernel (docs/cuda-speed-notes.md #58-#64, #93):
// there each warp's ring of 2-3 pieces was full while a phase's last blocks finished, so HBM idled through every
// grid barrier. Here one producer thread per block streams the block's share of every layer's weights, phase after
// phase, into a ring of `stages` 16 KB slots (cp.async.bulk, counted on mbarriers); it waits only for free slots,
// never for a phase's input, so the ring fills through the barriers. The consumer warps wait for the phase's input
// (a grid-wide barrier on a counter), stage it in shared memory, and reduce the landed rows against it.
//
// Shapes: Qwen3-1.7B's four GEMVs a layer (qkv 4096 x 2048, o 2048 x 2048, gate|up 12288 x 2048, down 2048 x 6144,
// bf16), 28 layers, each phase's input being the first K outputs of the phase before (fp32). No attention, norms
// or residuals: the question is the weight stream's rate across dependent phases. A slot holds 16 KB / (2 K) whole
// rows (4 rows of 2,048, one of 6,144); slot tiles are dealt to blocks round robin, the start rotating so that no
// block takes every phase's extra tile.
//
// Modes: barrier (the phases' dependency, as in a decode step), gap (barrier, and each block waits 5 µs after a
// layer's qkv phase before it arrives: decode attention's place at short contexts, with no weights), free (no grid
// waits: the stream and the arithmetic alone), arithmetic (free, with the input staged once, not each phase: the
// products alone keeping pace with the stream), copy (consumers release slots without reading them: the copy unit's
// stream alone), compute (arithmetic on whatever the slots hold, with no copies and no waits: the consumers' own
// rate), barrier-staged-once (barrier, with the input staged once: the barriers' cost without the staging's; its
// products are not checked), tagged (no barrier and no counter: each output is a 64-bit word holding the value
// below the phase's tag, stored and polled with relaxed accesses, so a consumer stages an input as soon as each of
// its words carries the phase's tag; docs/cuda-speed-notes.md #104), tagged-gap (tagged, with gap mode's 5 µs).
// Each mode but copy runs twice: the weights unpacked from bf16 by a shift and a mask, as the engine's GEMVs do,
// and (unpack_with_cvt) by __bfloat1622float2's conversion instructions. For each ring depth, consumer-warp count
// (one warp serves each slot) and cap on the copies in flight (below the ring's depth, the rest of the ring holds
// landed slots ahead of the consumers) and, for five configurations of the barrier and tagged modes, the stream
// paused from a block's arrival at a grid barrier to its release (tagged: from the end of its phase to its next
// input staged), prints as JSON microseconds per layer, the weight bytes'
// rate against a device-to-device copy, where a block's time went (Split) and, in the barrier modes, how far apart
// the blocks reached each grid barrier and how long after the last one they were released (global timer). Checks a
// down and a gate|up phase's outputs against a double-precision host product of the device's own inputs (barrier
// and tagged modes), and fails when they differ.
//   nvcc -arch=sm_90 -O3 -std=c++17 -o build/gpu_stream_probe bench/gpu_stream_probe.cu && build/gpu_stream_probe
// `build/gpu_stream_probe MODE STAGES WARPS [IN_FLIGHT]` runs one configuration alone, e.g. under a profiler:
//   ncu --set full -k stream_layers -c 1 build/gpu_stream_probe compute 8 8
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../cuda/async_copy.cuh"
#include "../cuda/grid_sync.cuh"
#include "../cuda/tagged.cuh"
#include "cuda_check.h"

constexpr int SLOT_BYTES = 16384;
constexpr int MAX_STAGES = 12;
constexpr int MAX_K = 6144;
constexpr int MAX_N = 12288;
constexpr int PHASES_PER_LAYER = 4;
constexpr int MAX_CONSUMER_WARPS = 12;  // stream_layers' launch bounds: 13 warps

// stream_layers' dynamic shared memory: the ring's slots, then the staged input.
constexpr size_t shared_bytes(int stages) { return (size_t)stages * SLOT_BYTES + MAX_K * 4; }

enum Mode { BARRIER = 0, FREE = 1, COPY = 2, ARITHMETIC = 3, COMPUTE = 4, BARRIER_STAGED_ONCE = 5, TAGGED = 6 };

// TAGGED mode's hand-over (docs/cuda-speed-notes.md #104): each output is one 64-bit word, the value's bits below
// the phase's tag (cuda/tagged.cuh's st_tagged and ld_tagged), so no fence or counter is needed.

// The modes with a grid barrier between phases (the kernel waits at them; the host reads their timestamps).
__host__ __device__ constexpr bool has_barriers(int mode) { return mode == BARRIER || mode == BARRIER_STAGED_ONCE; }

// Where a block's time goes, in SM cycles summed over the launch: thread 0 times the consumers' steps of each phase
// (the grid wait includes gap mode's gap; tiles, the reductions and the waits for slots to land), the producer its
// waits for a free slot and for a landing under the in-flight cap (with, paused at barriers, the pauses); thread 0
// also keeps the launch's cycles and nanoseconds, for the clock rate. Written once per block at the end.
enum Split {
    GRID_WAIT = 0,
    STAGING = 1,
    TILES = 2,
    RING_FULL = 3,
    IN_FLIGHT_CAP = 4,
    CYCLES = 5,
    NANOSECONDS = 6,
    SPLITS = 7
};

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

struct PhaseShape {
    int n, k, rows_per_slot;
    long long offset;  // elements from the layer's start
};

struct ProbeParams {
    PhaseShape shape[PHASES_PER_LAYER];
    long long layer_elems;
    int layers, phases, stages, mode, unpack_with_cvt;
    int in_flight;  // the producer issues tile i once tile i - in_flight has landed (stages: no cap beyond the ring)
    // The producer issues nothing from the block's arrival at a grid barrier to its release (tagged: from the end of
    // the block's phase to its next input staged).
    int pause_at_barriers;
    long long gap_ns;  // after each layer's first phase, the block waits this long (attention's place)
    unsigned long long* tagged;  // TAGGED mode's outputs: 2 x MAX_N words, by phase parity
    unsigned tag0;  // TAGGED mode: phase ph's tag is tag0 + ph (each launch its own, so nothing is reset)
};

// Named barrier 1 among the consumer warps only (the producer warp never joins it).
__device__ __forceinline__ void consumers_sync(int consumer_threads) {
    asm volatile("bar.sync 1, %0;" ::"r"(consumer_threads) : "memory");
}

// This block's first slot tile of a phase whose tiles are dealt from block `rotation % gridDim.x` on: the block owns
// tiles first, first + gridDim.x, ... of the phase.
__device__ __forceinline__ int first_tile(int rotation) {
    return ((int)blockIdx.x - rotation % (int)gridDim.x + (int)gridDim.x) % (int)gridDim.x;
}

// acc plus the 8 bf16 weights of u times xa's then xb's values, in order. The weights are unpacked with a shift and a
// mask (common.cuh's bf16x2_to_float, as the engine's GEMVs do), or WITH_CVT by the conversion instructions that
// __bfloat1622float2 compiles to.
template <bool WITH_CVT>
__device__ __forceinline__ float dot8(const uint4& u, const float4& xa, const float4& xb, float acc) {
    float2 f0, f1, f2, f3;
    if constexpr (WITH_CVT) {
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
        f0 = __bfloat1622float2(h[0]), f1 = __bfloat1622float2(h[1]);
        f2 = __bfloat1622float2(h[2]), f3 = __bfloat1622float2(h[3]);
    } else {
        bf16x2_to_float(u.x, f0.x, f0.y);
        bf16x2_to_float(u.y, f1.x, f1.y);
        bf16x2_to_float(u.z, f2.x, f2.y);
        bf16x2_to_float(u.w, f3.x, f3.y);
    }
    acc = fmaf(f0.x, xa.x, acc);
    acc = fmaf(f0.y, xa.y, acc);
    acc = fmaf(f1.x, xa.z, acc);
    acc = fmaf(f1.y, xa.w, acc);
    acc = fmaf(f2.x, xb.x, acc);
    acc = fmaf(f2.y, xb.y, acc);
    acc = fmaf(f3.x, xb.z, acc);
    return fmaf(f3.y, xb.w, acc);
}

// Each row's lane sums folded with common.cuh's warp_sum; lane 0 writes rows row0 .. row0 + R - 1.
template <int R>
__device__ __forceinline__ void write_rows(float (&acc)[R], float* y, int row0, int lane, unsigned long long* ty,
                                           unsigned tag) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (ty)
                st_tagged(ty + row0 + r, acc[r], tag);
            else
                y[row0 + r] = acc[r];
        }
    }
}

// R rows of K columns from a slot: lane l takes the rows' 16-byte chunks l, l + 32, ..., as the engine's GEMVs do.
template <int R, int K, bool WITH_CVT>
__device__ __forceinline__ void reduce_rows(const unsigned char* slot, const float* xs, float* y, int row0, int lane,
                                            unsigned long long* ty, unsigned tag) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    const uint4* w = reinterpret_cast<const uint4*>(slot);
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    constexpr int chunks = K / 8;
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
        const float4 xa = x4[c], xb = x4[chunks + c];  // stage_input's layout: lanes read consecutive float4s
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = dot8<WITH_CVT>(w[r * chunks + c], xa, xb, acc[r]);
    }
    write_rows<R>(acc, y, row0, lane, ty, tag);
}

// Where stage_input puts float4 e of an n4-float4 input: the first halves of the 8-float chunks, then their second
// halves.
__device__ __forceinline__ int staged_float4(int e, int n4) { return (e % 2) * (n4 / 2) + e / 2; }

// The phase's input (K floats, written by every block in the phase before) into shared memory, up to 8 float4s a
// thread in flight at once (with one load at a time the 6,144-wide input took 16 L2 round trips), laid out as the
// first halves of the 8-float chunks, then their second halves: a warp reading chunk c's halves for lanes c, c + 1,
// ... reads consecutive float4s, where the plain layout's 32-byte stride took twice the shared-memory wavefronts.
__device__ __forceinline__ void stage_input(const float* x, float* xs, int k, int consumer_threads) {
    constexpr int PER_THREAD = 8;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* xs4 = reinterpret_cast<float4*>(xs);
    const int n4 = k / 4;
    for (int e0 = threadIdx.x; e0 < n4; e0 += PER_THREAD * consumer_threads) {
        float4 v[PER_THREAD];
#pragma unroll
        for (int j = 0; j < PER_THREAD; ++j)
            if (e0 + j * consumer_threads < n4) v[j] = __ldcg(x4 + e0 + j * consumer_threads);
#pragma unroll
        for (int j = 0; j < PER_THREAD; ++j)
            if (const int e = e0 + j * consumer_threads; e < n4) xs4[staged_float4(e, n4)] = v[j];
    }
}

// stage_input's layout from TAGGED mode's words: each thread polls its 8 values at once until every tag matches,
// then stores them where stage_input would.
// Out of line: inlined, it left the kernel with 40 bytes of spills (16 so).
__device__ __noinline__ void stage_tagged(const unsigned long long* x, float* xs, int k, int consumer_threads,
                                          unsigned tag) {
    constexpr int PER_THREAD = 8;
    const int n4 = k / 4;
    for (int j0 = threadIdx.x; j0 < k; j0 += PER_THREAD * consumer_threads) {
        unsigned long long w[PER_THREAD];
        bool ready = false;
        while (!ready) {
#pragma unroll
            for (int j = 0; j < PER_THREAD; ++j)
                if (j0 + j * consumer_threads < k) w[j] = ld_tagged(x + j0 + j * consumer_threads);
            ready = true;
#pragma unroll
            for (int j = 0; j < PER_THREAD; ++j)
                if (j0 + j * consumer_threads < k) ready = ready && tag_is(w[j], tag);
        }
#pragma unroll
        for (int j = 0; j < PER_THREAD; ++j)
            if (const int e = j0 + j * consumer_threads; e < k)
                xs[staged_float4(e / 4, n4) * 4 + e % 4] = tagged_value(w[j]);
    }
}

// Block: `consumers` warps, then one producer warp. Dynamic shared memory: the ring, then the staged input.
__global__ void __launch_bounds__((MAX_CONSUMER_WARPS + 1) * 32, 1)
    stream_layers(const __nv_bfloat16* __restrict__ weights, float* ybuf, unsigned* counter,
                  unsigned long long* split, unsigned long long* stamps, ProbeParams p) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ uint64_t full[MAX_STAGES], empty[MAX_STAGES];
    __shared__ int at_barrier;  // set by thread 0 from its arrival at a grid barrier to its release
    unsigned char* ring = smem;
    float* xs = reinterpret_cast<float*>(smem + (size_t)p.stages * SLOT_BYTES);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int consumers = blockDim.x / 32 - 1, consumer_threads = consumers * 32;
    const int phases = p.phases;
    if (threadIdx.x == 0) {
        at_barrier = 0;
        for (int s = 0; s < p.stages; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 1);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warp == consumers) {  // the producer
        if (lane == 0 && p.mode == COMPUTE)
            split[blockIdx.x * SPLITS + RING_FULL] = split[blockIdx.x * SPLITS + IN_FLIGHT_CAP] = 0;
        if (lane != 0 || p.mode == COMPUTE) return;
        const uint64_t policy = l2_evict_first_policy();
        // lag: the tile in_flight before the next one. Under a cap below the ring's depth, landed slots that the
        // consumers have not reached yet stay in the ring while the copies in flight stay at the cap: slack that a
        // grid barrier can use, where a ring full of copies in flight has none (and lengthens the memory queues).
        RingCursor at, lag;
        int rotation = 0, issued = 0;
        unsigned long long ring_full = 0, capped = 0;
        for (int ph = 0; ph < phases; ++ph) {
            const PhaseShape s = p.shape[ph % PHASES_PER_LAYER];
            const int n_tiles = s.n / s.rows_per_slot;
            const uint32_t bytes = (uint32_t)s.rows_per_slot * s.k * 2;
            const __nv_bfloat16* base = weights + (ph / PHASES_PER_LAYER) * p.layer_elems + s.offset;
            for (int t = first_tile(rotation); t < n_tiles; t += gridDim.x, at.advance(p.stages, 1)) {
                const int slot = at.slot;
                if (p.in_flight < p.stages && issued >= p.in_flight) {
                    const unsigned long long t0 = clock64();
                    mbar_wait(&full[lag.slot], lag.use & 1);
                    capped += clock64() - t0;
                    lag.advance(p.stages, 1);
                }
                ++issued;
                if (p.pause_at_barriers) {  // counted with the cap's waits
                    const unsigned long long t0 = clock64();
                    while (*(volatile int*)&at_barrier) {
                    }
                    capped += clock64() - t0;
                }
                if (at.use > 0) {
                    const unsigned long long t0 = clock64();
                    mbar_wait(&empty[slot], (at.use - 1) & 1);
                    ring_full += clock64() - t0;
                }
                mbar_arrive_expect_tx(&full[slot], bytes);
                bulk_copy_to_shared(ring + (size_t)slot * SLOT_BYTES, base + (size_t)t * s.rows_per_slot * s.k,
                                    bytes, &full[slot], policy);
            }
            rotation += n_tiles;
        }
        split[blockIdx.x * SPLITS + RING_FULL] = ring_full;
        split[blockIdx.x * SPLITS + IN_FLIGHT_CAP] = capped;
        return;
    }

    RingCursor at;
    int rotation = 0;
    const bool barriers = has_barriers(p.mode);
    const bool staged_once = p.mode == ARITHMETIC || p.mode == COMPUTE || p.mode == BARRIER_STAGED_ONCE;
    const unsigned long long start_cycles = clock64(), start_ns = global_ns();
    unsigned long long spent[3] = {0, 0, 0}, mark = start_cycles;
    auto lap = [&](int what) {  // thread 0's cycles since the last lap, to `what`
        const unsigned long long now = clock64();
        spent[what] += now - mark;
        mark = now;
    };
    for (int ph = 0; ph < phases; ++ph) {
        const PhaseShape s = p.shape[ph % PHASES_PER_LAYER];
        const int n_tiles = s.n / s.rows_per_slot;
        const float* x = ybuf + ((ph + 1) & 1) * MAX_N;  // the phase before's outputs
        float* y = ybuf + (ph & 1) * MAX_N;
        const bool tagged = p.mode == TAGGED;
        unsigned long long* ty = tagged ? p.tagged + (ph & 1) * MAX_N : nullptr;
        if (barriers && ph > 0) {
            if (threadIdx.x == 0) {
                const unsigned target = (unsigned)ph * gridDim.x;
                while (ld_relaxed_gpu(counter) < target) {
                }
                asm volatile("fence.acq_rel.gpu;" ::: "memory");
                stamps[((size_t)ph * gridDim.x + blockIdx.x) * 2 + 1] = global_ns();  // released
                *(volatile int*)&at_barrier = 0;
            }
            consumers_sync(consumer_threads);
        }
        lap(GRID_WAIT);
        if (tagged && ph > 0) {
            stage_tagged(p.tagged + ((ph + 1) & 1) * MAX_N, xs, s.k, consumer_threads, p.tag0 + ph - 1);
            consumers_sync(consumer_threads);
            if (threadIdx.x == 0) *(volatile int*)&at_barrier = 0;
        } else if (!staged_once || ph == 0) {
            stage_input(x, xs, staged_once ? MAX_K : s.k, consumer_threads);
            consumers_sync(consumer_threads);
        }
        lap(STAGING);
        for (int t = first_tile(rotation); t < n_tiles; t += gridDim.x, at.advance(p.stages, consumers)) {
            // One warp serves each slot, so it meets the slot's uses in order: a parity wait tells use u from use
            // u + 2 only if no warp can run ahead of the slot's previous use.
            if (at.owner != warp) continue;
            const int slot = at.slot;
            if (p.mode != COMPUTE) mbar_wait(&full[slot], at.use & 1);
            if (p.mode != COPY) {
                const unsigned char* tile = ring + (size_t)slot * SLOT_BYTES;
                if (s.k == 2048 && p.unpack_with_cvt)
                    reduce_rows<4, 2048, true>(tile, xs, y, t * 4, lane, ty, p.tag0 + ph);
                else if (s.k == 2048)
                    reduce_rows<4, 2048, false>(tile, xs, y, t * 4, lane, ty, p.tag0 + ph);
                else if (p.unpack_with_cvt)
                    reduce_rows<1, 6144, true>(tile, xs, y, t, lane, ty, p.tag0 + ph);
                else
                    reduce_rows<1, 6144, false>(tile, xs, y, t, lane, ty, p.tag0 + ph);
            }
            __syncwarp();
            if (lane == 0 && p.mode != COMPUTE) mbar_arrive(&empty[slot]);
        }
        rotation += n_tiles;
        if (!staged_once || barriers)  // xs is free again; this block's outputs of the phase are written
            consumers_sync(consumer_threads);
        lap(TILES);
        if (p.gap_ns > 0 && ph % PHASES_PER_LAYER == 0 && threadIdx.x == 0) {
            const unsigned long long t0 = global_ns();
            while (global_ns() - t0 < (unsigned long long)p.gap_ns) {
            }
        }
        if (tagged && p.gap_ns > 0 && ph % PHASES_PER_LAYER == 0) consumers_sync(consumer_threads);
        if (tagged && p.pause_at_barriers && threadIdx.x == 0 && ph + 1 < phases) *(volatile int*)&at_barrier = 1;
        if (barriers && threadIdx.x == 0) {
            stamps[((size_t)ph * gridDim.x + blockIdx.x) * 2] = global_ns();  // arrived
            if (ph + 1 < phases) *(volatile int*)&at_barrier = 1;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        }
    }
    if (threadIdx.x == 0) {
        for (int k = 0; k < 3; ++k) split[blockIdx.x * SPLITS + k] = spent[k];
        split[blockIdx.x * SPLITS + CYCLES] = clock64() - start_cycles;
        split[blockIdx.x * SPLITS + NANOSECONDS] = global_ns() - start_ns;
    }
}

__global__ void fill_weights(__nv_bfloat16* w, long long n, float scale, uint32_t seed) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += stride) {
        uint32_t h = (uint32_t)e * 2654435761u ^ seed * 40503u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        w[e] = __float2bfloat16(((float)(h & 0xffff) / 32768.0f - 1.0f) * scale);
    }
}

int main(int argc, char** argv) {
    // With MODE STAGES WARPS [IN_FLIGHT], one configuration alone (weights unpacked by shift and mask), for a profiler.
    int only_mode = -1, only_stages = 0, only_warps = 0, only_in_flight = 0;
    const char* mode_names[] = {"barrier", "gap",     "free",   "arithmetic", "copy",
                                "compute", "barrier-staged-once", "tagged", "tagged-gap"};
    constexpr int MODES = 9;
    if (argc == 4 || argc == 5) {
        for (int m = 0; m < MODES; ++m)
            if (std::strcmp(argv[1], mode_names[m]) == 0) only_mode = m;
        only_stages = std::atoi(argv[2]);
        only_warps = std::atoi(argv[3]);
        only_in_flight = argc == 5 ? std::atoi(argv[4]) : only_stages;
    }
    if (argc != 1 && (only_mode < 0 || only_stages < 1 || only_stages > MAX_STAGES || only_warps < 1 ||
                      only_warps > MAX_CONSUMER_WARPS || only_in_flight < 1 ||
                      only_in_flight > only_stages)) {
        fprintf(stderr, "usage: %s [MODE STAGES WARPS [IN_FLIGHT]]: MODE one of barrier, gap, free, arithmetic, "
                "copy, compute, barrier-staged-once, tagged, tagged-gap; STAGES 1 to %d ring slots; WARPS 1 to %d "
                "consumer warps; "
                "IN_FLIGHT 1 to STAGES copies in flight (default STAGES)\n", argv[0], MAX_STAGES, MAX_CONSUMER_WARPS);
        return 2;
    }
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    ProbeParams p{};
    const int dims[PHASES_PER_LAYER][2] = {{4096, 2048}, {2048, 2048}, {12288, 2048}, {2048, 6144}};
    long long offset = 0;
    for (int j = 0; j < PHASES_PER_LAYER; ++j) {
        p.shape[j] = {dims[j][0], dims[j][1], SLOT_BYTES / (2 * dims[j][1]), offset};
        offset += (long long)dims[j][0] * dims[j][1];
    }
    p.layer_elems = offset;
    p.layers = 28;
    const long long total = p.layer_elems * p.layers;
    const double weight_bytes = 2.0 * (double)total;

    __nv_bfloat16* w;
    float* ybuf;
    unsigned* counter;
    unsigned long long* split;
    CHECK(cudaMalloc(&w, total * sizeof(__nv_bfloat16)));
    CHECK(cudaMalloc(&ybuf, 2 * MAX_N * sizeof(float)));
    CHECK(cudaMalloc(&counter, sizeof(unsigned)));
    CHECK(cudaMalloc(&split, (size_t)sms * SPLITS * sizeof(unsigned long long)));
    // Each block's global-timer reading as it arrives at and leaves each grid barrier (barrier modes).
    const size_t n_stamps = (size_t)p.layers * PHASES_PER_LAYER * sms * 2;
    unsigned long long* stamps;
    CHECK(cudaMalloc(&stamps, n_stamps * sizeof(unsigned long long)));
    CHECK(cudaMalloc(&p.tagged, 2 * MAX_N * sizeof(unsigned long long)));
    CHECK(cudaMemset(p.tagged, 0, 2 * MAX_N * sizeof(unsigned long long)));
    p.tag0 = 1;
    for (int l = 0; l < p.layers; ++l) {
        for (int j = 0; j < PHASES_PER_LAYER; ++j) {  // uniform, with a product's spread about its input's
            const PhaseShape& s = p.shape[j];
            fill_weights<<<4 * sms, 256>>>(w + l * p.layer_elems + s.offset, (long long)s.n * s.k,
                                           std::sqrt(3.0f / s.k), l * PHASES_PER_LAYER + j);
        }
    }
    CHECK(cudaGetLastError());
    std::vector<float> y0(2 * MAX_N);
    for (int e = 0; e < 2 * MAX_N; ++e) y0[e] = std::sin(0.37f * e);
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));

    // The reference rate: a device-to-device copy of 2 GiB, bytes read plus written.
    const size_t copy_bytes = (size_t)2 << 30;
    void *src, *dst;
    CHECK(cudaMalloc(&src, copy_bytes));
    CHECK(cudaMalloc(&dst, copy_bytes));
    CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st));
    CHECK(cudaEventRecord(a, st));
    for (int r = 0; r < 5; ++r) CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st));
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float copy_ms;
    CHECK(cudaEventElapsedTime(&copy_ms, a, b));
    const double copy_rate = 2.0 * copy_bytes * 5 / (copy_ms * 1e-3);
    CHECK(cudaFree(src));
    CHECK(cudaFree(dst));

    CHECK(cudaFuncSetAttribute(stream_layers, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes(MAX_STAGES)));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("{\"device\": \"%s\", \"blocks\": %d, \"layers\": %d, \"weight_bytes\": %.0f, \"copy_TBps\": %.3f, "
           "\"floor_us_per_layer\": %.3f, \"runs\": [",
           prop.name, sms, p.layers, weight_bytes, copy_rate / 1e12, weight_bytes / copy_rate * 1e6 / p.layers);
    const int modes[] = {BARRIER, BARRIER, FREE, ARITHMETIC, COPY, COMPUTE, BARRIER_STAGED_ONCE, TAGGED, TAGGED};
    const long long gaps[] = {0, 5000, 0, 0, 0, 0, 0, 0, 5000};
    // Ring slots, consumer warps, copies in flight at most, the stream paused at grid barriers.
    std::vector<std::array<int, 4>> configs = {
        {2, 2, 2, 0},   {4, 4, 4, 0},    {8, 4, 8, 0},  {8, 8, 8, 0},  {12, 4, 12, 0}, {12, 6, 12, 0},
        {12, 8, 12, 0}, {12, 12, 12, 0}, {12, 8, 2, 0}, {12, 8, 3, 0}, {12, 8, 4, 0},  {12, 8, 6, 0},
        {12, 8, 8, 0},  {12, 12, 4, 0},  {12, 12, 6, 0}, {12, 12, 8, 0}, {12, 8, 2, 1}, {12, 8, 3, 1},
        {12, 8, 4, 1},  {12, 8, 6, 1},   {12, 8, 12, 1}};
    if (only_mode >= 0) configs = {{only_stages, only_warps, only_in_flight, 0}};
    bool first = true;
    int checks = 0;
    double worst_error = 0.0;
    // One launch of p's first `phases` phases; returns the milliseconds it took in *ms.
    auto launch = [&](int consumers, float* ms) -> int {
        CHECK(cudaMemcpyAsync(ybuf, y0.data(), y0.size() * sizeof(float), cudaMemcpyHostToDevice, st));
        CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned), st));
        CHECK(cudaEventRecord(a, st));
        void* args[] = {&w, &ybuf, &counter, &split, &stamps, &p};
        CHECK(cudaLaunchCooperativeKernel((void*)stream_layers, dim3(sms), dim3((consumers + 1) * 32), args,
                                          shared_bytes(p.stages), st));
        CHECK(cudaEventRecord(b, st));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventElapsedTime(ms, a, b));
        p.tag0 += p.phases;  // the next launch's tags are new
        return 0;
    };
    // The last phase run (p.phases) against a float64 host product of the input the device left for it.
    auto check_last_phase = [&]() -> int {
        const int last = p.phases - 1;
        const PhaseShape s = p.shape[last % PHASES_PER_LAYER];
        std::vector<float> y(2 * MAX_N);
        std::vector<__nv_bfloat16> wl((size_t)s.n * s.k);
        CHECK(cudaMemcpy(y.data(), ybuf, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
        if (p.mode == TAGGED) {  // the values below the tags (phase 0's input, the host's, is never the last's)
            std::vector<unsigned long long> words(2 * MAX_N);
            CHECK(cudaMemcpy(words.data(), p.tagged, words.size() * sizeof(unsigned long long),
                             cudaMemcpyDeviceToHost));
            for (size_t e = 0; e < words.size(); ++e) {
                const uint32_t bits = (uint32_t)words[e];
                std::memcpy(&y[e], &bits, sizeof bits);
            }
        }
        CHECK(cudaMemcpy(wl.data(), w + (last / PHASES_PER_LAYER) * p.layer_elems + s.offset,
                         wl.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
        const float* x = y.data() + ((last + 1) & 1) * MAX_N;
        const float* out = y.data() + (last & 1) * MAX_N;
        for (int row = 0; row < s.n; ++row) {
            double ref = 0.0, mag = 0.0;
            for (int c = 0; c < s.k; ++c) {
                const double t = (double)__bfloat162float(wl[(size_t)row * s.k + c]) * x[c];
                ref += t;
                mag += std::fabs(t);
            }
            worst_error = std::fmax(worst_error, std::fabs(out[row] - ref) / (mag + 1e-30));
        }
        ++checks;
        return 0;
    };
    for (int cvt = 0; cvt < (only_mode >= 0 ? 1 : 2); ++cvt) {
        for (int m = 0; m < MODES; ++m) {
            if ((cvt && modes[m] == COPY) || (only_mode >= 0 && m != only_mode)) continue;  // copy unpacks nothing
            for (const auto& config : configs) {
                const auto [stages, consumers, in_flight, pause] = config;
                if (pause && !has_barriers(modes[m]) && modes[m] != TAGGED) continue;  // nothing to pause at
                p.mode = modes[m];
                p.gap_ns = gaps[m];
                p.stages = stages;
                p.in_flight = in_flight;
                p.pause_at_barriers = pause;
                p.unpack_with_cvt = cvt;
                p.phases = p.layers * PHASES_PER_LAYER;
                const int repeats = 20;
                float ms = 0, one;
                for (int r = -1; r < repeats; ++r) {
                    if (launch(consumers, &one)) return 1;
                    if (r >= 0) ms += one;
                }
                ms /= repeats;
                // The last timed launch's split, µs per layer averaged over the blocks.
                std::vector<unsigned long long> sp((size_t)sms * SPLITS);
                CHECK(cudaMemcpy(sp.data(), split, sp.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
                double mean[SPLITS] = {};
                for (int blk = 0; blk < sms; ++blk)
                    for (int k = 0; k < SPLITS; ++k) mean[k] += (double)sp[(size_t)blk * SPLITS + k] / sms;
                const double us_per_cycle_layer = mean[NANOSECONDS] / mean[CYCLES] * 1e-3 / p.layers;
                // The last timed launch's barriers, µs each averaged over them: how far apart the blocks arrived,
                // from the last arrival to the first release, how far apart they left, and a block's mean wait.
                char barrier_json[320] = "";
                if (has_barriers(modes[m])) {
                    std::vector<unsigned long long> st(n_stamps);
                    CHECK(cudaMemcpy(st.data(), stamps, n_stamps * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
                    double spread = 0, latency = 0, release_spread = 0, wait = 0;
                    unsigned long long step = ~0ull;  // the smallest gap between two readings: the timer's resolution
                    std::vector<unsigned long long> all;
                    for (int ph = 1; ph < p.phases; ++ph) {
                        unsigned long long a0 = ~0ull, a1 = 0, r0 = ~0ull, r1 = 0;
                        for (int blk = 0; blk < sms; ++blk) {
                            const unsigned long long a = st[((size_t)(ph - 1) * sms + blk) * 2];
                            const unsigned long long r = st[((size_t)ph * sms + blk) * 2 + 1];
                            a0 = std::min(a0, a), a1 = std::max(a1, a), r0 = std::min(r0, r), r1 = std::max(r1, r);
                            wait += (double)(r - a) / sms;
                            all.push_back(a);
                        }
                        spread += (double)(a1 - a0), latency += (double)r0 - (double)a1;
                        release_spread += (double)(r1 - r0);
                    }
                    std::sort(all.begin(), all.end());
                    for (size_t e = 1; e < all.size(); ++e)
                        if (all[e] > all[e - 1]) step = std::min(step, all[e] - all[e - 1]);
                    const double n = (p.phases - 1) * 1e3;
                    snprintf(barrier_json, sizeof barrier_json,
                             ", \"barrier_us\": {\"arrival_spread\": %.3f, \"last_arrival_to_first_release\": %.3f, "
                             "\"release_spread\": %.3f, \"mean_wait\": %.3f, \"timer_step_ns\": %llu}",
                             spread / n, latency / n, release_spread / n, wait / n, step);
                }
                // down, then (a launch ending one phase early) gate|up
                if ((p.mode == BARRIER || p.mode == TAGGED) && gaps[m] == 0) {
                    if (check_last_phase()) return 1;
                    p.phases -= 1;
                    if (launch(consumers, &one) || check_last_phase()) return 1;
                }
                printf("%s{\"mode\": \"%s\", \"unpack_with_cvt\": %s, \"stages\": %d, \"consumer_warps\": %d, "
                       "\"in_flight\": %d, \"pause_at_barriers\": %s, \"us_per_layer\": %.3f, \"weight_TBps\": %.3f, "
                       "\"split_us_per_layer\": {\"grid_wait\": %.3f, \"staging\": %.3f, \"tiles\": %.3f, "
                       "\"ring_full\": %.3f, \"in_flight_cap\": %.3f}%s}",
                       first ? "" : ", ", mode_names[m], cvt ? "true" : "false", stages, consumers, in_flight,
                       pause ? "true" : "false",
                       ms * 1e3 / p.layers, weight_bytes / (ms * 1e-3) / 1e12, mean[GRID_WAIT] * us_per_cycle_layer,
                       mean[STAGING] * us_per_cycle_layer, mean[TILES] * us_per_cycle_layer,
                       mean[RING_FULL] * us_per_cycle_layer, mean[IN_FLIGHT_CAP] * us_per_cycle_layer, barrier_json);
                first = false;
            }
        }
    }
    printf("], \"checked\": %s, \"checked_phases\": %d, \"worst_relative_error\": %.3g}\n",
           checks > 0 ? "true" : "false", checks, worst_error);
    if ((only_mode < 0 && checks == 0) || !(worst_error < 1e-5)) {
        fprintf(stderr, "the probe's products differ from the host's (worst relative error %.3g)\n", worst_error);
        return 1;
    }
    return 0;
}
