// Shared helpers for every tooltrie kernel: bf16 storage, fixed-order reductions, token/position inputs.
#pragma once
#include <stdint.h>

typedef uint16_t bf16_t;  // raw bfloat16 bits; weights are stored this way on the device

#define TT_WARP 32

// Programmatic dependent launch (sm_90). The host launches decode kernels with programmatic stream
// serialization, so a kernel's blocks may start while the kernel before it still runs (the launch latency and
// the predecessor's tail overlap). pdl_wait() returns once every earlier kernel has finished and its writes
// are visible: a kernel calls it before it reads anything a kernel writes or writes anything a kernel reads.
// Only reads of data no kernel writes (weights) may come before it. pdl_launch_dependents() lets the next
// kernel start launching. Both are no-ops for a kernel launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The start of every kernel that reads or writes activations: let the next kernel launch, then wait for
// the previous ones.
__device__ __forceinline__ void pdl_enter() {
    pdl_launch_dependents();
    pdl_wait();
}

// This block's rank in its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// The generic address of `p`'s counterpart in the shared memory of block `rank` of this cluster.
__device__ __forceinline__ float* cluster_map(float* p, unsigned rank) {
    uint64_t q;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(q) : "l"(p), "r"(rank));
    return reinterpret_cast<float*>(q);
}

// A cluster-wide barrier in two halves: arrive (release: this thread's earlier memory accesses, shared memory of
// other blocks included, are ordered before what others do after their wait) and wait (acquire). Every thread of
// the cluster's blocks takes both, alternately.
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// Timing probes for diagnosis, compiled only with -DTT_TRACE (bench/gpu_trace_attention.py builds such a cubin;
// the product's cubin has none): TT_MARK(slot) stores the global nanosecond timer and the SM clock of thread 0.
#ifdef TT_TRACE
#define TT_TRACE_SLOTS 8192
__device__ unsigned long long tt_trace[TT_TRACE_SLOTS][2];
#define TT_MARK(slot)                                                                  \
    do {                                                                               \
        if (threadIdx.x == 0 && (slot) < TT_TRACE_SLOTS) {                             \
            unsigned long long ns;                                                     \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns)::"memory");                  \
            tt_trace[(slot)][0] = ns;                                                  \
            tt_trace[(slot)][1] = clock64();                                           \
        }                                                                              \
    } while (0)
#else
#define TT_MARK(slot) ((void)(slot))
#endif

// bf16 -> fp32 is exact: the 16 bits are the top half of an fp32.
__device__ __forceinline__ float bf16_to_float(bf16_t v) { return __uint_as_float(((uint32_t)v) << 16); }

// Unpack one 32-bit word holding two consecutive bf16 values (little endian: low half first).
__device__ __forceinline__ void bf16x2_to_float(uint32_t w, float& lo, float& hi) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
}

// Butterfly sum over a warp: every lane ends with the same value, and the order of the additions is fixed
// by the lane pattern alone, so the result is bit-identical from run to run.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = TT_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = TT_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A block's team: the threads that take part in its collective steps (the block reductions below, input staging,
// attention). TEAM 0: every thread of the block, synchronised by __syncthreads. TEAM > 0: threads 0 .. TEAM - 1,
// synchronised on named barrier 1, so that threads past them (the persistent decode kernel's producer warp, which
// streams weights on its own) never join. Either way the reductions' trees depend on the team's size alone.
template <int TEAM>
__device__ __forceinline__ unsigned team_size() {  // unsigned, as blockDim.x is: the same arithmetic
    if constexpr (TEAM > 0)
        return TEAM;
    else
        return blockDim.x;
}

template <int TEAM>
__device__ __forceinline__ void team_sync() {
    if constexpr (TEAM > 0)
        asm volatile("bar.sync 1, %0;" ::"n"(TEAM) : "memory");
    else
        __syncthreads();
}

// Block-wide sum with a fixed tree: warp butterflies, then warp 0 folds the per-warp partials the same way.
// `scratch` holds at least 32 floats; the team is a multiple of 32 threads. Every thread of the team receives the
// total.
template <int TEAM = 0>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP, nwarps = team_size<TEAM>() / TT_WARP;
    v = warp_sum(v);
    team_sync<TEAM>();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    team_sync<TEAM>();
    if (warp == 0) {
        float p = lane < nwarps ? scratch[lane] : 0.0f;
        p = warp_sum(p);
        if (lane == 0) scratch[0] = p;
    }
    team_sync<TEAM>();
    return scratch[0];
}

// N block-wide sums at once, each with block_sum's tree (so each is bit-identical to it), sharing its barriers.
// `scratch` holds at least 32 * N floats.
template <int N, int TEAM = 0>
__device__ __forceinline__ void block_sums(float (&v)[N], float* scratch) {
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP, nwarps = team_size<TEAM>() / TT_WARP;
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
    team_sync<TEAM>();
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < N; ++i) scratch[32 * i + warp] = v[i];
    }
    team_sync<TEAM>();
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const float p = warp_sum(lane < nwarps ? scratch[32 * i + lane] : 0.0f);
            if (lane == 0) scratch[32 * i] = p;
        }
    }
    team_sync<TEAM>();
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = scratch[32 * i];
}

template <int TEAM = 0>
__device__ __forceinline__ float2 block_sum2(float a, float b, float* scratch) {
    float v[2] = {a, b};
    block_sums<2, TEAM>(v, scratch);
    return make_float2(v[0], v[1]);
}

template <int TEAM = 0>
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP, nwarps = team_size<TEAM>() / TT_WARP;
    v = warp_max(v);
    team_sync<TEAM>();
    if (lane == 0) scratch[warp] = v;
    team_sync<TEAM>();
    if (warp == 0) {
        float p = lane < nwarps ? scratch[lane] : -INFINITY;
        p = warp_max(p);
        if (lane == 0) scratch[0] = p;
    }
    team_sync<TEAM>();
    return scratch[0];
}

// silu(g) * u, as Hugging Face's act_fn(gate) * up. One expression for the swiglu kernel and the gate|up GEMV's
// SwiGLU output, so both give the same bits.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// A load of an activation: with CG, through L2 only (ld.global.cg). The persistent decode kernel reads values that
// other blocks of the same launch wrote after its start; L2 is where every SM sees them, while a line this SM's L1
// kept from an earlier layer could be stale. Kernels that read only what earlier launches wrote pass false.
template <bool CG, class T>
__device__ __forceinline__ T load_activation(const T* p) {
    if constexpr (CG)
        return __ldcg(p);
    else
        return *p;
}

// A value that the host either passes directly or leaves in device memory (for captured graphs, where
// the token and position change between replays). One kernel body serves both forms.
__device__ __forceinline__ int host_or_device(const int* ptr, int host_value) { return ptr ? *ptr : host_value; }
