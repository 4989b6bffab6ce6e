// Bulk copies from global to shared memory (sm_90's TMA unit, cp.async.bulk) and the shared-memory barriers that
// count their bytes (mbarrier). One thread can keep tens of kilobytes in flight this way without holding them in
// registers, which is what a weight stream needs at batch 1.
#pragma once
#include "common.cuh"

__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A thread's own 16-byte copy (cp.async, through L2 only), counted in its copy groups rather than on a barrier.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_address(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most `pending` of this thread's committed copy groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
}

// Before any thread uses the barrier: `count` arrivals complete a phase (plus the bytes announced by expect_tx).
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
}

// Makes initialised barriers visible to the copy unit; the block synchronises after it.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Orders this thread's earlier shared-memory accesses before later ones of the copy unit (reuse of a slot).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One arrival that also announces `bytes` still to land through bulk copies completing on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

// Returns once the barrier's phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_address(bar)),
        "r"(parity)
        : "memory");
}

// An L2 policy for data read once per step (weights): evicted first, so activations and the KV cache stay.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) and counts them on `bar` when they land.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                    uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        ::"r"(smem_address(dst)), "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
        : "memory");
}

// Where a block's running tile count i stands in a ring of `stages` slots served by `consumers` warps (slot s by
// warp s % consumers), kept by increments: the two integer divisions a tile would take made half of a consumer's
// instructions (docs/cuda-speed-notes.md #94).
struct RingCursor {
    int slot = 0;   // i % stages
    int use = 0;    // i / stages: how often the slot was filled before
    int owner = 0;  // slot % consumers: the warp that reduces the tile
    __device__ __forceinline__ void advance(int stages, int consumers) {
        if (++slot == stages) {
            slot = 0, owner = 0, ++use;
        } else if (++owner == consumers) {
            owner = 0;
        }
    }
};
