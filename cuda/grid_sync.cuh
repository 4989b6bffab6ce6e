// Relaxed gpu-scope polls of a counter in global memory (the probes' barriers and flags). A relaxed load does not
// invalidate the SM's L1 the way an acquire load does, and does not wait behind the SM's own copies in flight the way
// a fence does (docs/cuda-speed-notes.md #61, #102).
//
// The grid-wide barrier the persistent decode kernel used until its tagged form (#107, #108) was built on it: one
// monotonic counter per launch, thread 0 of each block counting with a release add after a block barrier, the
// waiting thread 0 spinning with relaxed loads, then an acquire fence and a block barrier. On an H200 it cost
// 1.4-1.7 µs idle and 3-6 µs beside a weight stream (#61, #102, #107); bench/gpu_handover_probe.cu still measures it.
#pragma once
#include "common.cuh"

__device__ __forceinline__ unsigned ld_relaxed_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
