// Grid-wide barriers inside one persistent kernel, whose blocks are all resident at once (a cooperative launch of
// at most one block per SM guarantees it; a barrier among blocks that are not all resident would never open).
//
// One monotonic counter per launch: every block arrives once per phase, so phase i (0-based) is complete once the
// counter reaches (i + 1) * gridDim.x. A block can only arrive at phase i + 1 after it has seen phase i complete,
// so the counter first reaches (i + 1) * gridDim.x when every block has finished phase i. The launch's last
// arrival resets the counter to zero for the next launch (every other block has then passed its last wait).
// Memory order: a block barrier, then thread 0 counts with a release (cumulative: it publishes every thread's
// writes that the barrier ordered before it); the waiting thread 0 spins with relaxed loads (an acquire load would
// also invalidate the SM's L1 on every try), then fences (acquire) and releases its block with a block barrier.
// Measured on an H200 (docs/cuda-speed-notes.md #61): spreading the count over 8 or 16 counters, sleeping between
// polls, per-block flags instead of a counter, or cooperative groups' full fences were no faster or slower.
#pragma once
#include "common.cuh"

__device__ __forceinline__ unsigned ld_relaxed_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// This block has finished the phase: every thread's writes of it are published with thread 0's count.
template <int TEAM = 0>
__device__ __forceinline__ void grid_arrive(unsigned* counter) {
    team_sync<TEAM>();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}

// Returns to every thread of the block once the counter reaches `target` (every block has arrived that often).
template <int TEAM = 0>
__device__ __forceinline__ void grid_wait(const unsigned* counter, unsigned target) {
    if (threadIdx.x == 0) {
        while (ld_relaxed_gpu(counter) < target) {
        }
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    team_sync<TEAM>();
}

// The launch's final arrival of this block, of `total` in all: the last one leaves the counter at zero.
template <int TEAM = 0>
__device__ __forceinline__ void grid_arrive_last(unsigned* counter, unsigned total) {
    team_sync<TEAM>();
    if (threadIdx.x == 0) {
        unsigned before;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
        if (before == total - 1) atomicExch(counter, 0u);
    }
}
