// The KV cache's element: bf16, as the model's weights. Keys and values are computed in fp32 and rounded to nearest
// (ties to even) as they are stored; every attention reads them back exactly (bf16 -> fp32), the new token's own k
// and v included, so prefill, decode, chains and the persistent kernel attend over the same values. Why: a decode
// step reads every cached row of every layer, and fp32 rows doubled those bytes (Qwen3-1.7B: 224 KiB a position
// instead of 112; docs/cuda-speed-notes.md #67, #109). The CPU engine rounds the same way
// (decoder_service/engines/cpu/kv_cache.py).
#pragma once
#include "common.cuh"

typedef bf16_t kv_t;

// Round to nearest, ties to even; NaN stays NaN (decoder_service/models/bf16.py's rule, bit for bit).
__device__ __forceinline__ kv_t kv_from_float(float v) {
    const uint32_t bits = __float_as_uint(v);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (kv_t)((bits >> 16) | 0x40u);
    return (kv_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float kv_load(const kv_t* p) { return bf16_to_float(*p); }

// Four entries as one 8-byte word holds them.
__device__ __forceinline__ float4 kv_unpack4(uint2 w) {
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xFFFF0000u), __uint_as_float(w.y << 16),
                       __uint_as_float(w.y & 0xFFFF0000u));
}

// Entries 4i .. 4i + 3 from p (8-byte aligned), in one load.
__device__ __forceinline__ float4 kv_load4(const kv_t* p, size_t i) {
    return kv_unpack4(reinterpret_cast<const uint2*>(p)[i]);
}
