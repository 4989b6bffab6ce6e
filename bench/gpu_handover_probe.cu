// What one hand-over between blocks costs while weights stream from HBM (docs/cuda-speed-notes.md #102). The
// decode step's phases hand their outputs over through L2: a block writes, publishes (a release), and the next
// phase's blocks see it (a poll, an acquire) and load it. #94 measured a grid barrier at 3 µs from the last arrival
// to the release while a weight stream ran beside it, against 1.1 µs where the stream had stopped; this probe asks
// which part of the memory system makes that, and whether a path that stays off L2 (a thread-block cluster's
// distributed shared memory) escapes it.
//
// One block an SM (the dynamic shared memory sees to it), launched as clusters of `cluster` blocks. Warp 0 of each
// block runs the test; lane 0 of warp 1 streams, with the copy unit, 16 KB pieces of a 1 GiB buffer into a ring of
// `slots` pieces (1 to 12 copies in flight an SM), re-issuing each as soon as it lands (the weight stream without
// arithmetic), until the test ends.
// Where the stream runs: nowhere, on the SMs that take no part in the test ("others"), or on every SM ("all").
// Tests (each repeated `rounds` times after warm-up rounds; nanoseconds per hand-over on the global timer):
//   chase          one thread follows a random cycle through 512 lines of L2-resident memory (ld.cg): one L2
//                  round trip per step;
//   flag_near/far  block 0 and block P pass a counter back and forth (st.release.gpu, polled with ld.acquire.gpu):
//                  P in block 0's cluster (near) or half the grid away (far); half a round trip;
//   flag_relaxed   flag_far with relaxed stores and polls: the same trip without the fences;
//   data_far       the same, with 2 KB written before each release and read back (ld.cg) and checked after each
//                  acquire: a GEMV's hand-over in miniature;
//   data_dsmem     block 0 and its cluster's block 1: the 2 KB written into the partner's shared memory, the flag
//                  stored there with a cluster-scope release and polled in its own shared memory;
//   grid_barrier   every block: the grid barrier of the persistent decode kernel's forms before speed note #108 (a
//                  release add on one counter, relaxed polls, an acquire fence), then one ld.cg of a value another
//                  block wrote before it;
//   two_level      every block: the count first inside the cluster (a cluster-scope release add on rank 0's shared
//                  memory), rank 0 alone on the global counter, then rank 0 releases its cluster's blocks through
//                  their shared memory; then the same dependent read. Checked as grid_barrier is.
// Prints one JSON object: each run's ns per hand-over (barriers: per barrier, the read included), the stream's rate
// while the test ran, and whether every value read back was the one expected (the run fails otherwise).
//   nvcc -arch=sm_90 -O3 -std=c++17 -o build/gpu_handover_probe bench/gpu_handover_probe.cu && build/gpu_handover_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../cuda/async_copy.cuh"
#include "../cuda/grid_sync.cuh"
#include "cuda_check.h"

constexpr int PIECE = 16384;
constexpr int MAX_SLOTS = 12;
constexpr int DATA_FLOATS = 512;  // 2 KB a hand-over
constexpr int CHASE_LINES = 512;
constexpr size_t STREAM_BYTES = (size_t)1 << 30;
// Shared memory a block asks for whatever its ring: enough that two blocks never share an SM.
constexpr size_t BLOCK_SHARED = (size_t)MAX_SLOTS * PIECE + DATA_FLOATS * 4;

enum Test { CHASE = 0, FLAG_NEAR, FLAG_FAR, FLAG_RELAXED, DATA_FAR, DATA_DSMEM, GRID_BARRIER, TWO_LEVEL, TESTS };
enum Where { NOWHERE = 0, OTHERS = 1, ALL = 2 };
const char* test_names[] = {"chase",    "flag_near",  "flag_far",     "flag_relaxed",
                            "data_far", "data_dsmem", "grid_barrier", "two_level"};
const char* where_names[] = {"none", "others", "all"};

struct Params {
    int test, where, slots, rounds, warmup;
};

// Device-side state, zeroed before every launch.
struct State {
    unsigned stop;      // set once the test is over: the streams end
    unsigned counter;   // the grid barriers' count
    unsigned ping[2];   // flag tests: block 0 -> partner, partner -> block 0
    unsigned bad;       // values read back that were not the ones expected
    unsigned long long elapsed_ns;
    unsigned long long streamed_bytes;
    unsigned long long stream_ns;  // the streams' summed running time
};

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned cluster_size() {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}
// The address of this block's shared variable `p` in cluster block `rank`'s shared memory.
__device__ __forceinline__ uint32_t cluster_address(const void* p, unsigned rank) {
    uint32_t out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(smem_address(p)), "r"(rank));
    return out;
}
__device__ __forceinline__ void st_cluster_f32(uint32_t addr, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void st_release_cluster(uint32_t addr, unsigned v) {
    asm volatile("st.release.cluster.shared::cluster.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_cluster(uint32_t addr, unsigned v) {
    asm volatile("red.release.cluster.shared::cluster.add.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire_cluster(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.cluster.shared::cta.u32 %0, [%1];" : "=r"(v) : "r"(smem_address(p)) : "memory");
    return v;
}
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Lane 0 of the producer warp: pieces of `src` into the ring, each re-issued as soon as it lands, until stop.
__device__ void stream_until_stop(const unsigned char* src, unsigned char* ring, uint64_t* full, int slots,
                                  State* st) {
    const uint64_t policy = l2_evict_first_policy();
    // Each block streams its own share of the buffer, over and over: 1 GiB in all, so every piece comes from HBM.
    const size_t share = STREAM_BYTES / PIECE / gridDim.x, first = blockIdx.x * share, last = first + share;
    size_t next = first;
    unsigned long long landed = 0;
    const unsigned long long t0 = global_ns();
    for (int s = 0; s < slots; ++s) {
        mbar_arrive_expect_tx(&full[s], PIECE);
        bulk_copy_to_shared(ring + (size_t)s * PIECE, src + next * PIECE, PIECE, &full[s], policy);
        next = next + 1 == last ? first : next + 1;
    }
    bool stopping = false;
    for (unsigned use = 0; !stopping; ++use) {
        for (int s = 0; s < slots; ++s) {
            mbar_wait(&full[s], use & 1);
            landed += PIECE;
            if (s == 0) stopping = ld_relaxed_gpu(&st->stop) != 0;
            if (stopping) continue;  // drain: every copy in flight lands before the block may exit
            mbar_arrive_expect_tx(&full[s], PIECE);
            bulk_copy_to_shared(ring + (size_t)s * PIECE, src + next * PIECE, PIECE, &full[s], policy);
            next = next + 1 == last ? first : next + 1;
        }
    }
    atomicAdd(&st->streamed_bytes, landed);
    atomicAdd(&st->stream_ns, global_ns() - t0);
}

// The partner's 2 KB of round i: a lane's 16 values requested at once, then compared with what was written.
__device__ __forceinline__ void read_back(const float* in, int i, int lane, State* st) {
    constexpr int PER_LANE = DATA_FLOATS / 32;
    float v[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) v[j] = __ldcg(in + lane + 32 * j);
    int wrong = 0;
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) wrong += v[j] != (float)(i + lane + 32 * j);
    if (wrong) atomicAdd(&st->bad, (unsigned)wrong);
}

__global__ void __launch_bounds__(64, 1)
    handover(const unsigned char* stream_src, const unsigned* chase, float* data, unsigned* slots_out, State* st,
             Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ uint64_t full[MAX_SLOTS];
    __shared__ unsigned dsmem_flag, cl_count, cl_release;
    float* sdata = reinterpret_cast<float*>(smem + (size_t)MAX_SLOTS * PIECE);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned rank = cluster_rank(), csize = cluster_size();
    const int partner = p.test == FLAG_NEAR || p.test == DATA_DSMEM ? 1 : (int)gridDim.x / 2;
    const bool barrier_test = p.test == GRID_BARRIER || p.test == TWO_LEVEL;
    const bool in_test = barrier_test || blockIdx.x == 0 || (p.test != CHASE && (int)blockIdx.x == partner);
    if (threadIdx.x == 0) {
        for (int s = 0; s < MAX_SLOTS; ++s) mbar_init(&full[s], 1);
        dsmem_flag = cl_count = cl_release = 0;
        mbar_init_fence();
    }
    __syncthreads();
    cluster_sync_all();  // every block's shared variables are initialised before any remote access

    if (warp == 1) {
        if (lane == 0 && (p.where == ALL || (p.where == OTHERS && !in_test)))
            stream_until_stop(stream_src, smem, full, p.slots, st);
        __syncwarp();
    } else if (in_test) {
        const int total = p.warmup + p.rounds;
        unsigned long long t0 = 0;
        if (p.test == CHASE) {
            if (lane == 0) {
                unsigned at = 0;
                for (int i = 0; i < total; ++i) {
                    if (i == p.warmup) t0 = global_ns();
                    at = __ldcg(chase + at * 32);
                }
                st->elapsed_ns = global_ns() - t0;
                if (at >= CHASE_LINES) atomicAdd(&st->bad, 1u);
            }
        } else if (p.test == FLAG_NEAR || p.test == FLAG_FAR || p.test == FLAG_RELAXED || p.test == DATA_FAR) {
            const bool relaxed = p.test == FLAG_RELAXED;
            const bool first = blockIdx.x == 0;
            const bool with_data = p.test == DATA_FAR;
            unsigned* mine = &st->ping[first ? 0 : 1];
            unsigned* theirs = &st->ping[first ? 1 : 0];
            float* out = data + (first ? 0 : DATA_FLOATS);
            const float* in = data + (first ? DATA_FLOATS : 0);
            for (int i = 1; i <= total; ++i) {
                if (first && i == p.warmup + 1) t0 = global_ns();
                if (!first) {  // the partner answers round i once block 0's round i has arrived
                    if (lane == 0)
                        while ((relaxed ? ld_relaxed_gpu(theirs) : ld_acquire_gpu(theirs)) < (unsigned)i) {
                        }
                    __syncwarp();
                    if (with_data) read_back(in, i, lane, st);
                }
                if (with_data)
                    for (int e = lane; e < DATA_FLOATS; e += 32) out[e] = (float)(i + e);
                __syncwarp();
                if (lane == 0 && relaxed)
                    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(mine), "r"((unsigned)i) : "memory");
                else if (lane == 0)
                    st_release_gpu(mine, (unsigned)i);  // cumulative: publishes the warp's stores
                if (first) {
                    if (lane == 0)
                        while ((relaxed ? ld_relaxed_gpu(theirs) : ld_acquire_gpu(theirs)) < (unsigned)i) {
                        }
                    __syncwarp();
                    if (with_data) read_back(in, i, lane, st);
                }
            }
            if (first && lane == 0) st->elapsed_ns = global_ns() - t0;
        } else if (p.test == DATA_DSMEM) {
            const bool first = rank == 0;
            const unsigned other = first ? 1 : 0;
            const uint32_t their_flag = cluster_address(&dsmem_flag, other);
            const uint32_t their_data = cluster_address(sdata, other);
            for (int i = 1; i <= total; ++i) {
                if (first && i == p.warmup + 1) t0 = global_ns();
                if (!first) {
                    if (lane == 0)
                        while (ld_acquire_cluster(&dsmem_flag) < (unsigned)i) {
                        }
                    __syncwarp();
                    for (int e = lane; e < DATA_FLOATS; e += 32)
                        if (sdata[e] != (float)(i + e)) atomicAdd(&st->bad, 1u);
                }
                for (int e = lane; e < DATA_FLOATS; e += 32) st_cluster_f32(their_data + e * 4, (float)(i + e));
                __syncwarp();
                if (lane == 0) st_release_cluster(their_flag, (unsigned)i);
                if (first) {
                    if (lane == 0)
                        while (ld_acquire_cluster(&dsmem_flag) < (unsigned)i) {
                        }
                    __syncwarp();
                    for (int e = lane; e < DATA_FLOATS; e += 32)
                        if (sdata[e] != (float)(i + e)) atomicAdd(&st->bad, 1u);
                }
            }
            if (first && lane == 0) st->elapsed_ns = global_ns() - t0;
        } else {  // the barriers: every block's warp 0
            const unsigned clusters = gridDim.x / csize;
            const uint32_t leader_count = cluster_address(&cl_count, 0);
            for (int i = 1; i <= total; ++i) {
                if (blockIdx.x == 0 && i == p.warmup + 1) t0 = global_ns();
                if (lane == 0) __stcg(slots_out + blockIdx.x * 32, (unsigned)i);  // what the next block reads
                __syncwarp();
                if (lane == 0) {
                    if (p.test == GRID_BARRIER) {
                        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&st->counter) : "memory");
                        while (ld_relaxed_gpu(&st->counter) < (unsigned)i * gridDim.x) {
                        }
                        asm volatile("fence.acq_rel.gpu;" ::: "memory");
                    } else {
                        red_release_cluster(leader_count, 1);
                        if (rank == 0) {
                            while (ld_acquire_cluster(&cl_count) < (unsigned)i * csize) {
                            }
                            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&st->counter) : "memory");
                            while (ld_relaxed_gpu(&st->counter) < (unsigned)i * clusters) {
                            }
                            asm volatile("fence.acq_rel.gpu;" ::: "memory");
                            for (unsigned r = 1; r < csize; ++r)
                                st_release_cluster(cluster_address(&cl_release, r), (unsigned)i);
                        } else {
                            while (ld_acquire_cluster(&cl_release) < (unsigned)i) {
                            }
                        }
                    }
                    // the next phase's first dependent load: a value another block wrote before the barrier
                    const unsigned seen = __ldcg(slots_out + ((blockIdx.x + 37) % gridDim.x) * 32);
                    if (seen < (unsigned)i) atomicAdd(&st->bad, 1u);
                }
                __syncwarp();
            }
            if (blockIdx.x == 0 && lane == 0) st->elapsed_ns = global_ns() - t0;
        }
        if (blockIdx.x == 0 && lane == 0) st_release_gpu(&st->stop, 1u);
    }
    __syncthreads();
    cluster_sync_all();  // no block leaves while a partner may still write into its shared memory
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaFuncSetAttribute(handover, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)BLOCK_SHARED));
    unsigned char* src;
    unsigned *chase, *slots_out;
    float* data;
    State* st;
    CHECK(cudaMalloc(&src, STREAM_BYTES));
    CHECK(cudaMemset(src, 1, STREAM_BYTES));
    CHECK(cudaMalloc(&chase, CHASE_LINES * 32 * sizeof(unsigned)));
    CHECK(cudaMalloc(&slots_out, (size_t)sms * 32 * sizeof(unsigned)));
    CHECK(cudaMalloc(&data, 2 * DATA_FLOATS * sizeof(float)));
    CHECK(cudaMalloc(&st, sizeof(State)));
    // A random cycle through the lines (a fixed seed): line a's first word names the next line.
    std::vector<unsigned> order(CHASE_LINES), lines(CHASE_LINES * 32, 0);
    for (int i = 0; i < CHASE_LINES; ++i) order[i] = i;
    uint32_t seed = 12345;
    for (int i = CHASE_LINES - 1; i > 0; --i) {
        seed = seed * 1664525u + 1013904223u;
        std::swap(order[i], order[seed % (i + 1)]);
    }
    for (int i = 0; i < CHASE_LINES; ++i) lines[order[i] * 32] = order[(i + 1) % CHASE_LINES];
    CHECK(cudaMemcpy(chase, lines.data(), lines.size() * sizeof(unsigned), cudaMemcpyHostToDevice));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("{\"device\": \"%s\", \"sms\": %d, \"runs\": [", prop.name, sms);
    bool first_run = true, all_good = true;
    for (int csize : {2, 8}) {
        // As many whole clusters as are resident at once: every block of a barrier test must be.
        cudaLaunchConfig_t cfg{};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = csize, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
        cfg.blockDim = dim3(64), cfg.dynamicSmemBytes = BLOCK_SHARED, cfg.attrs = attr, cfg.numAttrs = 1;
        cfg.gridDim = dim3(sms / csize * csize);
        int clusters = 0;
        CHECK(cudaOccupancyMaxActiveClusters(&clusters, handover, &cfg));
        cfg.gridDim = dim3(std::min(clusters, sms / csize) * csize);
        for (int test = 0; test < TESTS; ++test) {
            if (csize == 8 && test != TWO_LEVEL) continue;
            const bool barrier_test = test == GRID_BARRIER || test == TWO_LEVEL;
            for (int where = 0; where < 3; ++where) {
                if (barrier_test && where == OTHERS) continue;  // every SM takes part
                for (int slots : {1, 2, 3, 4, 6, 12}) {
                    if (where == NOWHERE && slots != 1) continue;
                    const int rounds = test == CHASE ? 4000 : 2000, warmup = test == CHASE ? 2 * CHASE_LINES : 200;
                    const Params p{test, where, slots, rounds, warmup};
                    CHECK(cudaMemset(st, 0, sizeof(State)));
                    CHECK(cudaMemset(slots_out, 0, (size_t)sms * 32 * sizeof(unsigned)));
                    CHECK(cudaMemset(data, 0, 2 * DATA_FLOATS * sizeof(float)));
                    CHECK(cudaLaunchKernelEx(&cfg, handover, (const unsigned char*)src, (const unsigned*)chase, data,
                                             slots_out, st, p));
                    CHECK(cudaDeviceSynchronize());
                    State h;
                    CHECK(cudaMemcpy(&h, st, sizeof(State), cudaMemcpyDeviceToHost));
                    // Flag and data tests time round trips: a hand-over is half of one.
                    const bool round_trips = test >= FLAG_NEAR && test <= DATA_DSMEM;
                    const double per = (double)h.elapsed_ns / p.rounds / (round_trips ? 2 : 1);
                    const double rate = h.stream_ns ? (double)h.streamed_bytes / ((double)h.stream_ns / 1e9) : 0.0;
                    const int streaming_blocks = where == NOWHERE ? 0
                                                 : where == ALL ? (int)cfg.gridDim.x
                                                 : (int)cfg.gridDim.x - (barrier_test ? 0 : test == CHASE ? 1 : 2);
                    printf("%s{\"test\": \"%s\", \"cluster\": %d, \"blocks\": %d, \"stream\": \"%s\", \"slots\": %d, "
                           "\"ns_per_handover\": %.1f, \"stream_TBps\": %.3f, \"bad\": %u}",
                           first_run ? "" : ", ", test_names[test], csize, (int)cfg.gridDim.x, where_names[where],
                           where == NOWHERE ? 0 : slots, per, rate * streaming_blocks / 1e12, h.bad);
                    fflush(stdout);
                    first_run = false;
                    all_good = all_good && h.bad == 0;
                }
            }
        }
    }
    printf("], \"all_values_as_expected\": %s}\n", all_good ? "true" : "false");
    if (!all_good) fprintf(stderr, "a hand-over delivered a value other than the one written\n");
    return all_good ? 0 : 1;
}
