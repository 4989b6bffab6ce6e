// Per-head q/k RMSNorm (Qwen3), rotary embedding (Hugging Face rotate_half convention) and the KV-cache write.
// qkv holds, per token, q (n_heads * head_dim), then k and v (n_kv_heads * head_dim each), the layout of
// the fused q|k|v weight. qk_norm_rope_cache (prefill) rotates q heads in place, rotates k heads into k_cache
// and copies the matching v head to v_cache, at absolute position pos0 + t; decode attention
// (attention_decode.cuh) calls head_norm_rope_values itself. Caches are bf16 [max_ctx, n_kv_heads, head_dim]
// (kv_cache.cuh).
// The rotation's cosines and sines come from a table that rope_table fills once per model: position p's row is
// cos(p * inv_freq_i) for i < head_dim / 2, then the sines. Prefill and decode read the same table, so their cache
// rows stay bit-identical, and decode spends no powf, cosf or sinf on its critical path.
#pragma once
#include "common.cuh"
#include "kv_cache.cuh"

// Hugging Face's angles: inv_freq = 1 / theta^(2i/d) in fp32, angle = pos * inv_freq.
// grid (n_positions), block (head_dim / 2).
extern "C" __global__ void rope_table(float* __restrict__ table, int head_dim, float theta) {
    pdl_enter();
    const int p = blockIdx.x, i = threadIdx.x, half = head_dim / 2;
    if (i >= half) return;
    const float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
    const float angle = (float)p * inv_freq;
    table[(size_t)p * head_dim + i] = cosf(angle);
    table[(size_t)p * head_dim + half + i] = sinf(angle);
}

// Thread d's cosine and sine at position pos (element d % (head_dim / 2) of the table's row); 0 for d >= head_dim.
__device__ __forceinline__ float2 rope_cos_sin(const float* __restrict__ table, int pos, int head_dim) {
    const int d = threadIdx.x, half = head_dim / 2;
    if (d >= head_dim) return make_float2(0.0f, 0.0f);
    const float* row = table + (size_t)pos * head_dim + d % half;
    return make_float2(row[0], row[half]);
}

// One head vector normalised (has_norm: with RMSNorm weights, Qwen3; without: Llama, Qwen2) and rotated
// (rotate_half). Thread d < head_dim passes element d as `v`, its norm weight as `norm_wd` and its rope_cos_sin as
// `cs` (all loaded by the caller, so they can travel with other loads; others pass 0) and receives element d
// (others 0). Every thread of the block calls it (block_sum);
// whatever the block size, the sum of squares is bit-identical (absent warps add zeros). `head` is head_dim floats
// of shared scratch.
template <int TEAM = 0>
__device__ __forceinline__ float head_norm_rope_values(float v, bool has_norm, float norm_wd, float2 cs, int head_dim,
                                                       float eps, float* head, float* scratch) {
    const int d = threadIdx.x;
    const bool active = d < head_dim;  // blocks have whole warps; head_dim may be 16
    if (has_norm) {
        const float ss = block_sum<TEAM>(v * v, scratch);
        if (active) v = v * rsqrtf(ss / (float)head_dim + eps) * norm_wd;
    }
    if (active) head[d] = v;
    team_sync<TEAM>();
    float out = 0.0f;
    if (active) {
        const int half = head_dim / 2;
        const float rotated = d < half ? -head[d + half] : head[d - half];
        out = fmaf(v, cs.x, rotated * cs.y);  // one explicit rounding pattern in every caller
    }
    team_sync<TEAM>();  // head is free again
    return out;
}

// q and k of one head pair at once (decode attention's block that writes the new token's cache row): the two sums
// of squares share one reduction's barriers and the two rotations one angle. Each result is bit-identical to
// head_norm_rope_values's for the same inputs. `heads` is 2 * head_dim floats of shared scratch, `scratch` 64.
template <int TEAM = 0>
__device__ __forceinline__ float2 head_norm_rope_pair(float q, float k, bool q_has_norm, bool k_has_norm, float q_wd,
                                                      float k_wd, float2 cs, int head_dim, float eps, float* heads,
                                                      float* scratch) {
    const int d = threadIdx.x;
    const bool active = d < head_dim;
    if (q_has_norm || k_has_norm) {
        const float2 ss = block_sum2<TEAM>(q * q, k * k, scratch);
        if (active && q_has_norm) q = q * rsqrtf(ss.x / (float)head_dim + eps) * q_wd;
        if (active && k_has_norm) k = k * rsqrtf(ss.y / (float)head_dim + eps) * k_wd;
    }
    if (active) {
        heads[d] = q;
        heads[head_dim + d] = k;
    }
    team_sync<TEAM>();
    float2 out = make_float2(0.0f, 0.0f);
    if (active) {
        const int half = head_dim / 2, partner = d < half ? d + half : d - half;
        const float q_rot = d < half ? -heads[partner] : heads[partner];
        const float k_rot = d < half ? -heads[head_dim + partner] : heads[head_dim + partner];
        out.x = fmaf(q, cs.x, q_rot * cs.y);
        out.y = fmaf(k, cs.x, k_rot * cs.y);
    }
    team_sync<TEAM>();  // heads is free again
    return out;
}

// The same, loading element d of src and of norm_w (nullptr: no norm) and the rope table's row itself.
__device__ __forceinline__ float head_norm_rope(const float* __restrict__ src, const bf16_t* __restrict__ norm_w,
                                                const float* __restrict__ rope, int pos, int head_dim, float eps,
                                                float* head, float* scratch) {
    const bool active = threadIdx.x < head_dim;
    const float v = active ? src[threadIdx.x] : 0.0f;
    const float w = active && norm_w ? bf16_to_float(norm_w[threadIdx.x]) : 0.0f;
    return head_norm_rope_values(v, norm_w != nullptr, w, rope_cos_sin(rope, pos, head_dim), head_dim, eps, head,
                                 scratch);
}

// kv head kh of one token's raw q|k|v row: k normalised and rotated into k_cache's row pos, v copied to v_cache's.
// Every thread of the block calls it (block max(32, head_dim)).
__device__ __forceinline__ void kv_row_to_cache(const float* __restrict__ row, const bf16_t* __restrict__ k_norm,
                                                kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache, int pos,
                                                int kh, int n_heads, int n_kv_heads, int head_dim,
                                                const float* __restrict__ rope, float eps, float* head,
                                                float* scratch) {
    const int d = threadIdx.x, q_width = n_heads * head_dim, kv_width = n_kv_heads * head_dim;
    const float out = head_norm_rope(row + q_width + kh * head_dim, k_norm, rope, pos, head_dim, eps, head, scratch);
    if (d >= head_dim) return;
    const size_t c = ((size_t)pos * n_kv_heads + kh) * head_dim + d;
    k_cache[c] = kv_from_float(out);
    v_cache[c] = kv_from_float(row[q_width + kv_width + kh * head_dim + d]);
}

// Prefill: grid (n_tokens, n_heads + n_kv_heads), block max(32, head_dim) threads; rope from rope_table.
extern "C" __global__ void qk_norm_rope_cache(float* __restrict__ qkv, const bf16_t* __restrict__ q_norm,
                                              const bf16_t* __restrict__ k_norm, kv_t* __restrict__ k_cache,
                                              kv_t* __restrict__ v_cache, const int* pos_ptr, int pos_host,
                                              int n_heads, int n_kv_heads, int head_dim,
                                              const float* __restrict__ rope, float eps) {
    pdl_enter();
    __shared__ float head[256];
    __shared__ float scratch[32];
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const int pos = host_or_device(pos_ptr, pos_host) + t;
    const int q_width = n_heads * head_dim, kv_width = n_kv_heads * head_dim;
    float* row = qkv + (size_t)t * (q_width + 2 * kv_width);
    if (h >= n_heads) {
        kv_row_to_cache(row, k_norm, k_cache, v_cache, pos, h - n_heads, n_heads, n_kv_heads, head_dim, rope, eps, head,
                        scratch);
        return;
    }
    float* src = row + h * head_dim;
    const float out = head_norm_rope(src, q_norm, rope, pos, head_dim, eps, head, scratch);
    if (d < head_dim) src[d] = out;
}
