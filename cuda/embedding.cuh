// Embedding gather: out[t, :] = table[token_t, :] as fp32.
#pragma once
#include "common.cuh"

// tokens: device array of n_tokens ids, or nullptr to use token_host (n_tokens must then be 1).
// An id outside [0, vocab) fills its row with NaN so the error cannot pass as a plausible answer.
extern "C" __global__ void embed_gather(const bf16_t* __restrict__ table, const int* __restrict__ tokens,
                                        int token_host, float* __restrict__ out, int hidden, int vocab) {
    pdl_enter();
    const int t = blockIdx.x;
    const int tok = tokens ? tokens[t] : token_host;
    float* row = out + (size_t)t * hidden;
    if (tok < 0 || tok >= vocab) {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) row[i] = __int_as_float(0x7fc00000);
        return;
    }
    const bf16_t* src = table + (size_t)tok * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) row[i] = bf16_to_float(src[i]);
}
