// Tagged words: a hand-over between blocks with no barrier, counter or fence. Each value travels as one 64-bit word,
// its float bits below a 32-bit tag that names the phase that wrote it; the writer stores the word and the reader
// polls it with relaxed gpu-scope accesses. An aligned 64-bit access is single-copy atomic, so a word that carries
// the expected tag holds that phase's value, whatever else is in flight. Why: on an H200 a fence waits behind the
// SM's own weight copies in flight, relaxed accesses do not (docs/cuda-speed-notes.md #102, #104).
#pragma once
#include "common.cuh"

__device__ __forceinline__ void st_tagged(unsigned long long* p, float v, unsigned tag) {
    const unsigned long long word = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(word) : "memory");
}

__device__ __forceinline__ unsigned long long ld_tagged(const unsigned long long* p) {
    unsigned long long word;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(word) : "l"(p) : "memory");
    return word;
}

__device__ __forceinline__ bool tag_is(unsigned long long word, unsigned tag) { return (unsigned)(word >> 32) == tag; }

__device__ __forceinline__ float tagged_value(unsigned long long word) { return __uint_as_float((unsigned)word); }

// Polls beyond this many tries trap: a word that never carries its tag is a bug, and a launch error beats a hang.
#define TAGGED_MAX_POLLS (1u << 26)

// Between failed tries a poller sleeps `sleep_ns` (0: it spins), which thins the polls' traffic to the L2 lines the
// writers are storing to.
__device__ __forceinline__ void poll_pause(unsigned& tries, int sleep_ns) {
    if (++tries == TAGGED_MAX_POLLS) __trap();
    if (sleep_ns > 0) __nanosleep(sleep_ns);
}

// The value of the word at p once it carries `tag`.
__device__ __forceinline__ float poll_tagged(const unsigned long long* p, unsigned tag, int sleep_ns = 0) {
    unsigned long long word = ld_tagged(p);
    for (unsigned tries = 0; !tag_is(word, tag); word = ld_tagged(p)) poll_pause(tries, sleep_ns);
    return tagged_value(word);
}

// float4s e0, e0 + stride, ... (B of them, those below n4; words 32-byte aligned) of a run of tagged words, polled
// together (one round of loads a try) until every word carries `tag`. Entries past n4 are left as they are.
template <int B>
__device__ __forceinline__ void poll_tagged4_batch(float4 (&v)[B], const unsigned long long* words, int e0, int stride,
                                                   int n4, unsigned tag, int sleep_ns = 0) {
    unsigned long long w[B][4];
    for (unsigned tries = 0;;) {
#pragma unroll
        for (int i = 0; i < B; ++i) {
            if (e0 + i * stride < n4) {
                const unsigned long long* p = words + 4 * (e0 + i * stride);
                asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[i][0]), "=l"(w[i][1]) : "l"(p)
                             : "memory");
                asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[i][2]), "=l"(w[i][3]) : "l"(p + 2)
                             : "memory");
            }
        }
        bool ready = true;
#pragma unroll
        for (int i = 0; i < B; ++i)
            if (e0 + i * stride < n4)
                ready = ready && tag_is(w[i][0], tag) && tag_is(w[i][1], tag) && tag_is(w[i][2], tag) &&
                        tag_is(w[i][3], tag);
        if (ready) break;
        poll_pause(tries, sleep_ns);
    }
#pragma unroll
    for (int i = 0; i < B; ++i)
        if (e0 + i * stride < n4)
            v[i] = make_float4(tagged_value(w[i][0]), tagged_value(w[i][1]), tagged_value(w[i][2]),
                               tagged_value(w[i][3]));
}
