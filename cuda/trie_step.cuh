// Constrained greedy decoding on the device: the compiled token trie (tooltrie/grammar/trie.py's device image),
// the legal-token mask, the sparse head and the step (argmax over legal tokens, score, advance).
//
// One step is two kernels, each reading the sequence's control block `ctl` (device memory, layout below), after
// trie_mask has run once for the answer's first node:
//   trie_mask    materialises the live edges of the current node into `cand` (tokens, then edge ids), in
//                ascending token order, and flags an empty mask
//   sparse_head  one block per candidate slot over a fixed grid of TRIE_HEAD_SLOTS blocks (the graph shape does
//                not depend on the data); slots past the candidate count return at once. The dense head is the
//                vocabulary GEMV; both compute a row with gemv_row_dot, so a logit is the same bits either way.
//                After a decode pass it also applies the model's final norm to the row it stages (the rmsnorm
//                kernel's bits), so the passes before it end at the last layer
//   trie_step    argmax over the candidates (fixed tree, ties to the lower token id), the log-softmax score
//                over the legal logits, the advance, error flags, the published pointer, the loop predicate;
//                with TT_FLAG_FORCED_TAIL, also the rest of the answer when the grammar forces every token of it,
//                and with TT_FLAG_CHAINS the tokens it forces next (a chain, which the next forward pass takes);
//                then the next node's mask, as trie_mask makes it (one kernel fewer on every step's path)
// None of them takes the current token from the host: the forward pass reads ctl[TT_CTL_TOKEN] and
// ctl[TT_CTL_POS] through its device-pointer form, or the host passes them in the host-argument form.
//
// The trie lives in __constant__ when its image fits 64 KiB (ctl's trie pointer is 0), else in global memory.
// A graph does not snapshot constant memory, so the host re-binds it, stream-ordered, before every launch.
#pragma once
#include <cuda_runtime.h>
#include "common.cuh"
#include "gemv.cuh"

#define TRIE_THREADS 256
#define TRIE_HEAD_SLOTS 256       // sparse-head grid; wider nodes need the dense head
#define TRIE_CONST_WORDS 16384    // 64 KiB
#define TT_K_MAX 16
#define TT_MAX_NAME_TOKENS 132    // MCP names have at most 128 characters, every token at least one
#define TT_OUT_HEADER 8           // words before the first record of the published output
#define TT_REC_WORDS (4 + TT_MAX_NAME_TOKENS)

// Control block (int32 words).
#define TT_CTL_TOKEN 0      // the last chosen token: the next forward pass's input
#define TT_CTL_POS 1        // its position
#define TT_CTL_NODE 2
#define TT_CTL_OWED 3
#define TT_CTL_NSPENT 4
#define TT_CTL_DONE 5
#define TT_CTL_ERROR 6
#define TT_CTL_STEPS 7
#define TT_CTL_NALLOWED 8   // -1: no allowed set
#define TT_CTL_NCAND 9
#define TT_CTL_CURLEN 10    // tokens of the pointer being spelled
#define TT_CTL_CURSCORE 11  // its score so far (float bits)
#define TT_CTL_ERRNODE 12   // the node where an error happened
#define TT_CTL_MAXSTEPS 13
#define TT_CTL_TRIE 14      // u64: global trie image, 0 for the constant bank
#define TT_CTL_ALLOWED 16   // u64: sorted allowed pointer ids
#define TT_CTL_FLAGS 18     // TT_FLAG_* bits, set by the host per answer
#define TT_CTL_FORCED 19    // tokens taken without a forward pass of their own (forced tail, chains past their first)
#define TT_CTL_NCHAIN 20    // tokens the next forward pass takes: 1 (TOKEN at POS) or a chain of 2 or more
#define TT_CTL_CHAIN_POS 21 // the chain's first position
#define TT_CTL_CHAIN 24     // TT_CHAIN_TOKENS chain tokens
#define TT_CTL_SPENT 32     // TT_K_MAX spent pointer ids, in answer order
#define TT_CTL_WORDS 64
#define TT_CHAIN_TOKENS 4   // GSTREAM_CHAIN_TOKENS: the most tokens of one forward pass

// Once the grammar leaves one legal token at every remaining step of the answer, the step takes them all: they
// need no logits (the log-softmax over one legal token is 0) and, with nothing left to choose, no forward pass.
// Their step-log rows carry TT_NO_LOGIT for the logit, which was never computed.
#define TT_FLAG_FORCED_TAIL 1
// With TT_FLAG_CHAINS, the tokens the grammar forces after the chosen one (up to TT_CHAIN_TOKENS - 1) join it: the
// next forward pass takes them all (the decode kernels' chain forms, each token's bits those of a step of its own),
// and the step after it chooses from the last one's logits.
#define TT_FLAG_CHAINS 2
#define TT_NO_LOGIT 0x7fc00000  // a quiet NaN

#define TT_ERR_EMPTY_MASK 1
#define TT_ERR_OFF_EDGE 2
#define TT_ERR_NON_FINITE 3
#define TT_ERR_NAME_TOO_LONG 4
#define TT_ERR_STEP_LIMIT 5
#define TT_ERR_TOO_WIDE 6   // more candidates than the sparse head's slots

// Published output (mapped host memory): header [count, finished, error, steps, ...], then one record per
// pointer: [pointer id, token count, score bits, step of its closing token, tokens...]. Tokens of the record
// being spelled are written as they are chosen; `count` moves past a record only once it is complete.
#define TT_OUT_COUNT 0
#define TT_OUT_FINISHED 1
#define TT_OUT_ERROR 2
#define TT_OUT_STEPS 3

__constant__ int tt_trie_const[TRIE_CONST_WORDS];

struct ConstTrie {
    __device__ __forceinline__ int word(int i) const { return tt_trie_const[i]; }
};

struct GlobalTrie {
    const int* __restrict__ p;
    __device__ __forceinline__ int word(int i) const { return __ldg(p + i); }
};

// Offsets of the image's arrays, in words (trie.py: header, node_edge_start, node_terminal, edges).
struct TrieLayout {
    int n_nodes, edge_start, terminal, edges;
};

__device__ __forceinline__ int tt_align4(int words) { return (words + 3) & ~3; }

template <class R>
__device__ __forceinline__ TrieLayout trie_layout(const R& t) {
    TrieLayout l;
    l.n_nodes = t.word(2);
    l.edge_start = 8;
    l.terminal = l.edge_start + tt_align4(l.n_nodes + 3);
    l.edges = l.terminal + tt_align4(l.n_nodes + 2);
    return l;
}

__device__ __forceinline__ const int* ctl_ptr(const int* ctl, int word) {
    return reinterpret_cast<const int*>(*reinterpret_cast<const unsigned long long*>(ctl + word));
}

__device__ __forceinline__ int lower_bound(const int* a, int n, int v) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (a[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Whether edge e of `node` is live (DESIGN.md section 3): a real edge while an allowed, unspent pointer lies in
// its [lo, hi); SEP at a live terminal while another pointer is owed after it, STOP when none is.
template <class R>
__device__ bool edge_live(const R& t, const TrieLayout& l, int node, int e, const int* spent, int n_spent,
                          const int* allowed, int n_allowed, int owed) {
    const int child = t.word(l.edges + 4 * e + 1);
    if (child < l.n_nodes) {
        const int lo = t.word(l.edges + 4 * e + 2), hi = t.word(l.edges + 4 * e + 3);
        const int avail =
            n_allowed < 0 ? hi - lo : lower_bound(allowed, n_allowed, hi) - lower_bound(allowed, n_allowed, lo);
        int used = 0;
        for (int i = 0; i < n_spent; ++i) used += (spent[i] >= lo && spent[i] < hi);
        return avail > used;
    }
    const int p = t.word(l.terminal + node);
    if (p < 0) return false;
    for (int i = 0; i < n_spent; ++i)
        if (spent[i] == p) return false;
    if (n_allowed >= 0) {
        const int i = lower_bound(allowed, n_allowed, p);
        if (i == n_allowed || allowed[i] != p) return false;
    }
    return child == l.n_nodes ? owed > 1 : owed == 1;
}

template <class R>
__device__ void trie_mask_body(const R& t, int* ctl, int* cand, int cand_cap) {
    __shared__ int spent[TT_K_MAX];
    __shared__ int warp_counts[TRIE_THREADS / TT_WARP];
    __shared__ int total;
    const TrieLayout l = trie_layout(t);
    const int node = ctl[TT_CTL_NODE], n_spent = ctl[TT_CTL_NSPENT], owed = ctl[TT_CTL_OWED];
    const int n_allowed = ctl[TT_CTL_NALLOWED];
    const int* allowed = ctl_ptr(ctl, TT_CTL_ALLOWED);
    if (threadIdx.x < TT_K_MAX) spent[threadIdx.x] = ctl[TT_CTL_SPENT + threadIdx.x];
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    const int a = t.word(l.edge_start + node), b = t.word(l.edge_start + node + 1);
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    // Stream compaction in chunks of 256 edges; ballots and a fixed prefix keep ascending token order.
    for (int base = a; base < b; base += TRIE_THREADS) {
        const int e = base + threadIdx.x;
        const bool live = e < b && edge_live(t, l, node, e, spent, n_spent, allowed, n_allowed, owed);
        const unsigned mask = __ballot_sync(0xffffffffu, live);
        if (lane == 0) warp_counts[warp] = __popc(mask);
        __syncthreads();
        int offset = total;
        for (int w = 0; w < warp; ++w) offset += warp_counts[w];
        offset += __popc(mask & ((1u << lane) - 1u));
        if (live && offset < cand_cap) {
            cand[offset] = t.word(l.edges + 4 * e);
            cand[cand_cap + offset] = e;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int w = 0; w < TRIE_THREADS / TT_WARP; ++w) total += warp_counts[w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        ctl[TT_CTL_NCAND] = min(total, cand_cap);
        if (total == 0) {
            ctl[TT_CTL_ERROR] = TT_ERR_EMPTY_MASK;
            ctl[TT_CTL_ERRNODE] = node;
        }
    }
}

// The mask of ctl's node by the whole block (every thread must call it). cand holds cand_cap tokens then cand_cap
// edge ids. A finished or failed sequence is left untouched.
__device__ __forceinline__ void trie_mask_block(int* ctl, int* cand, int cand_cap) {
    if (ctl[TT_CTL_DONE] || ctl[TT_CTL_ERROR]) return;
    const int* g = ctl_ptr(ctl, TT_CTL_TRIE);
    if (g) trie_mask_body(GlobalTrie{g}, ctl, cand, cand_cap);
    else trie_mask_body(ConstTrie{}, ctl, cand, cand_cap);
}

// The answer's first mask; trie_step makes every later one.
extern "C" __global__ void __launch_bounds__(TRIE_THREADS) trie_mask(int* ctl, int* cand, int cand_cap) {
    pdl_enter();
    trie_mask_block(ctl, cand, cand_cap);
}

// Logits of the candidate rows only: block b computes row cand[b] with warps_per_row warps, exactly as the
// dense GEMV computes that row (same staging, same gemv_row_dot, parts added in ascending order).
// norm_w null: x is the normalised row (the prefill's final norm). Else x is the residual stream of the forward
// pass, and each block applies the model's final norm (norm_w, eps) to its last token's row, row ctl[NCHAIN] - 1,
// as it stages it: the rmsnorm kernel's values (gemv_stage_input's), without that kernel on the step's path.
// Dynamic shared memory K * 4 bytes; grid TRIE_HEAD_SLOTS.
extern "C" __global__ void __launch_bounds__(TRIE_THREADS)
sparse_head(const bf16_t* __restrict__ W, const float* __restrict__ x, const int* __restrict__ ctl,
            const int* __restrict__ cand, float* __restrict__ cand_logit, int K, int warps_per_row,
            const bf16_t* __restrict__ norm_w, float eps) {
    pdl_enter();
    extern __shared__ float4 hs4[];
    __shared__ float parts[TRIE_THREADS / TT_WARP];
    __shared__ float scratch[32];
    const int slot = blockIdx.x;
    if (ctl[TT_CTL_DONE] || ctl[TT_CTL_ERROR] || slot >= ctl[TT_CTL_NCAND]) return;  // uniform per block
    const int lane = threadIdx.x % TT_WARP, warp = threadIdx.x / TT_WARP;
    // Start streaming the row before staging the input (warps outside the row's parts load nothing).
    const uint4* wrow = reinterpret_cast<const uint4*>(W + (size_t)cand[slot] * K);
    const GemvPrefetch pf = gemv_prefetch(wrow, warp < warps_per_row ? K : 0, warp, lane, warps_per_row);
    if (norm_w) {
        const int row = max(ctl[TT_CTL_NCHAIN], 1) - 1;
        gemv_stage_input(hs4, x + (size_t)row * K, norm_w, GEMV_IN_RMSNORM, eps, K, scratch);
    } else {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        for (int e = threadIdx.x; e < K / 4; e += blockDim.x) hs4[e] = x4[e];
        __syncthreads();
    }
    if (warp >= warps_per_row) return;
    float acc = gemv_row_dot_from(pf, wrow, hs4, K, warp, lane, warps_per_row);
    if (warps_per_row > 1) {
        if (lane == 0) parts[warp] = acc;
        __syncwarp();
        asm volatile("bar.sync 1, %0;" ::"r"(warps_per_row * TT_WARP));  // only the row's warps take part
        if (warp == 0 && lane == 0)
            for (int p = 1; p < warps_per_row; ++p) acc += parts[p];
    }
    if (warp == 0 && lane == 0) cand_logit[slot] = acc;
}

// The conditional nodes of the device loop's graph (0 outside a graph): the WHILE node's, and the IF node of its
// body that runs the chain's forward pass (else the single token's).
struct LoopConds {
    unsigned long long loop, chain;
};

__device__ __forceinline__ void publish_state(int* ctl, volatile int* out, const LoopConds& cond) {
    const bool go = !ctl[TT_CTL_DONE] && !ctl[TT_CTL_ERROR];
    const bool chain = ctl[TT_CTL_NCHAIN] > 1;
    out[TT_OUT_STEPS] = ctl[TT_CTL_STEPS];
    out[TT_OUT_ERROR] = ctl[TT_CTL_ERROR];
    __threadfence_system();
    out[TT_OUT_FINISHED] = go ? 0 : 1;
    if (cond.loop) cudaGraphSetConditional(cond.loop, go ? 1u : 0u);
    if (cond.chain) cudaGraphSetConditional(cond.chain, go && chain ? 1u : 0u);
}

template <class R>
__device__ void trie_advance(const R& t, int* ctl, volatile int* out, int edge, int token, float logprob) {
    int spent[TT_K_MAX];  // one thread runs the advance
    const TrieLayout l = trie_layout(t);
    const int node = ctl[TT_CTL_NODE], n_spent = ctl[TT_CTL_NSPENT], owed = ctl[TT_CTL_OWED];
    for (int i = 0; i < n_spent; ++i) spent[i] = ctl[TT_CTL_SPENT + i];
    const int a = t.word(l.edge_start + node), b = t.word(l.edge_start + node + 1);
    // The winner must be a live edge of this node: a stale or corrupt mask stops the decoder here.
    if (edge < a || edge >= b || t.word(l.edges + 4 * edge) != token ||
        !edge_live(t, l, node, edge, spent, n_spent, ctl_ptr(ctl, TT_CTL_ALLOWED), ctl[TT_CTL_NALLOWED], owed)) {
        ctl[TT_CTL_ERROR] = TT_ERR_OFF_EDGE;
        ctl[TT_CTL_ERRNODE] = node;
        return;
    }
    const int child = t.word(l.edges + 4 * edge + 1);
    volatile int* rec = out + TT_OUT_HEADER + n_spent * TT_REC_WORDS;
    if (child < l.n_nodes) {
        const int len = ctl[TT_CTL_CURLEN];
        if (len >= TT_MAX_NAME_TOKENS) {
            ctl[TT_CTL_ERROR] = TT_ERR_NAME_TOO_LONG;
            ctl[TT_CTL_ERRNODE] = node;
            return;
        }
        rec[4 + len] = token;
        ctl[TT_CTL_CURLEN] = len + 1;
        ctl[TT_CTL_CURSCORE] = __float_as_int(__int_as_float(ctl[TT_CTL_CURSCORE]) + logprob);
        ctl[TT_CTL_NODE] = child;
    } else {
        const int p = t.word(l.terminal + node);
        rec[0] = p;
        rec[1] = ctl[TT_CTL_CURLEN];
        rec[2] = ctl[TT_CTL_CURSCORE];
        rec[3] = ctl[TT_CTL_STEPS];
        __threadfence_system();  // the record is complete before the host can see the count move past it
        out[TT_OUT_COUNT] = n_spent + 1;
        ctl[TT_CTL_SPENT + n_spent] = p;
        ctl[TT_CTL_NSPENT] = n_spent + 1;
        ctl[TT_CTL_OWED] = owed - 1;
        ctl[TT_CTL_NODE] = 0;
        ctl[TT_CTL_CURLEN] = 0;
        ctl[TT_CTL_CURSCORE] = 0;
        if (child == l.n_nodes + 1) ctl[TT_CTL_DONE] = 1;
    }
}

// The grammar state a step reads from ctl, for walks that must not change it.
struct WalkState {
    int node, owed, n_spent, n_allowed;
    const int* allowed;
    int spent[TT_K_MAX];
    __device__ explicit WalkState(const int* ctl)
        : node(ctl[TT_CTL_NODE]), owed(ctl[TT_CTL_OWED]), n_spent(ctl[TT_CTL_NSPENT]),
          n_allowed(ctl[TT_CTL_NALLOWED]), allowed(ctl_ptr(ctl, TT_CTL_ALLOWED)) {
        for (int i = 0; i < n_spent; ++i) spent[i] = ctl[TT_CTL_SPENT + i];
    }
};

// The one live edge of the walk's node; -1 when it has none or several (the scan stops at the second).
template <class R>
__device__ int sole_live_edge(const R& t, const TrieLayout& l, const WalkState& w) {
    const int a = t.word(l.edge_start + w.node), b = t.word(l.edge_start + w.node + 1);
    int found = -1;
    for (int e = a; e < b; ++e) {
        if (!edge_live(t, l, w.node, e, w.spent, w.n_spent, w.allowed, w.n_allowed, w.owed)) continue;
        if (found >= 0) return -1;
        found = e;
    }
    return found;
}

// Whether the answer ends (STOP) within `budget` more tokens with one legal token at every step: the rules of
// trie_advance, walked on a copy of the state.
template <class R>
__device__ bool tail_is_forced(const R& t, const int* ctl, int budget) {
    const TrieLayout l = trie_layout(t);
    WalkState w(ctl);
    for (int s = 0; s < budget; ++s) {
        const int e = sole_live_edge(t, l, w);
        if (e < 0) return false;
        const int child = t.word(l.edges + 4 * e + 1);
        if (child == l.n_nodes + 1) return true;  // STOP
        if (child < l.n_nodes) {
            w.node = child;
        } else {  // SEP: another pointer is owed, so fewer than k <= TT_K_MAX are spent
            w.spent[w.n_spent++] = t.word(l.terminal + w.node);
            --w.owed;
            w.node = 0;
        }
    }
    return false;
}

// Takes `token` along `edge`: the advance, its step-log row, the next forward pass's token and position, the
// step limit.
template <class R>
__device__ void take_token(const R& t, int* ctl, volatile int* out, int* trace, int edge, int token, int logit_bits,
                           float logprob) {
    const int steps = ctl[TT_CTL_STEPS];
    trie_advance(t, ctl, out, edge, token, logprob);
    if (ctl[TT_CTL_ERROR]) return;
    if (trace) {
        trace[3 * steps] = token;
        trace[3 * steps + 1] = logit_bits;
        trace[3 * steps + 2] = __float_as_int(logprob);
    }
    ctl[TT_CTL_TOKEN] = token;
    ctl[TT_CTL_POS] += 1;
    ctl[TT_CTL_STEPS] = steps + 1;
    if (steps + 1 >= ctl[TT_CTL_MAXSTEPS] && !ctl[TT_CTL_DONE]) ctl[TT_CTL_ERROR] = TT_ERR_STEP_LIMIT;
}

// The step's chosen token, then (TT_FLAG_FORCED_TAIL) the forced tail when what follows it is one, else
// (TT_FLAG_CHAINS) the forced tokens after it, up to a chain of TT_CHAIN_TOKENS; sets the next forward pass's
// tokens.
template <class R>
__device__ void take_step(const R& t, int* ctl, volatile int* out, int* trace, int edge, int token, float top,
                          float logprob) {
    const int first_pos = ctl[TT_CTL_POS] + 1;
    ctl[TT_CTL_NCHAIN] = 1;
    take_token(t, ctl, out, trace, edge, token, __float_as_int(top), logprob);
    const int flags = ctl[TT_CTL_FLAGS];
    if (ctl[TT_CTL_ERROR] || ctl[TT_CTL_DONE] || !(flags & (TT_FLAG_FORCED_TAIL | TT_FLAG_CHAINS))) return;
    const TrieLayout l = trie_layout(t);
    const bool tail = (flags & TT_FLAG_FORCED_TAIL) && tail_is_forced(t, ctl, ctl[TT_CTL_MAXSTEPS] - ctl[TT_CTL_STEPS]);
    if (!tail && !(flags & TT_FLAG_CHAINS)) return;
    int n = 1;
    ctl[TT_CTL_CHAIN] = token;
    while (!ctl[TT_CTL_DONE] && !ctl[TT_CTL_ERROR] && (tail || n < TT_CHAIN_TOKENS)) {
        const int e = sole_live_edge(t, l, WalkState(ctl));  // in a tail, -1 would fail trie_advance's check, loudly
        if (e < 0 && !tail) break;
        const int forced = e < 0 ? -1 : t.word(l.edges + 4 * e);
        take_token(t, ctl, out, trace, e, forced, TT_NO_LOGIT, 0.0f);
        ctl[TT_CTL_FORCED] += 1;
        if (!tail) ctl[TT_CTL_CHAIN + n++] = forced;
    }
    if (!tail && n > 1) {
        ctl[TT_CTL_NCHAIN] = n;
        ctl[TT_CTL_CHAIN_POS] = first_pos;
    }
}

__device__ __forceinline__ bool step_better(float v, int j, float bv, int bj) {
    return bj < 0 || v > bv || (v == bv && j < bj);
}

// dense != 0: logits is the full vocabulary row (read at the candidates' tokens); else the sparse head's
// cand_logit. trace (optional) receives (token, logit bits, log-prob bits) per token (TT_NO_LOGIT for a forced
// tail's and a chain's tokens past its first). cond_*: LoopConds's handles inside a graph, 0 in the host loop.
// cand is read, then rewritten with the next node's mask (no __restrict__: it is not read-only here).
extern "C" __global__ void __launch_bounds__(TRIE_THREADS)
trie_step(int* ctl, int* cand, int cand_cap, const float* __restrict__ logits, int dense, int* trace, int* out,
          unsigned long long cond_loop, unsigned long long cond_chain) {
    const LoopConds cond{cond_loop, cond_chain};
    pdl_enter();
    __shared__ float vals[TRIE_THREADS];
    __shared__ int ids[TRIE_THREADS];
    __shared__ float scratch[32];
    volatile int* vout = out;
    if (ctl[TT_CTL_DONE] || ctl[TT_CTL_ERROR]) {
        if (threadIdx.x == 0) publish_state(ctl, vout, cond);
        return;
    }
    const int n = ctl[TT_CTL_NCAND];
    if (!dense && n > TRIE_HEAD_SLOTS) {
        if (threadIdx.x == 0) {
            ctl[TT_CTL_ERROR] = TT_ERR_TOO_WIDE;
            ctl[TT_CTL_ERRNODE] = ctl[TT_CTL_NODE];
            publish_state(ctl, vout, cond);
        }
        return;
    }
    // Each thread scans candidates j = tid, tid + 256, ... in ascending order (ascending token id).
    float best = -INFINITY;
    int best_j = -1;
    bool bad = false;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = dense ? logits[cand[j]] : logits[j];
        bad |= !isfinite(v);
        if (step_better(v, j, best, best_j)) {
            best = v;
            best_j = j;
        }
    }
    bad = __syncthreads_or(bad);
    vals[threadIdx.x] = best;
    ids[threadIdx.x] = best_j;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const int j = ids[threadIdx.x + s];
            if (j >= 0 && step_better(vals[threadIdx.x + s], j, vals[threadIdx.x], ids[threadIdx.x])) {
                vals[threadIdx.x] = vals[threadIdx.x + s];
                ids[threadIdx.x] = j;
            }
        }
        __syncthreads();
    }
    const float top = vals[0];
    const int win = ids[0];
    float z = 0.0f;
    if (!bad)
        for (int j = threadIdx.x; j < n; j += blockDim.x) z += expf((dense ? logits[cand[j]] : logits[j]) - top);
    z = block_sum(z, scratch);
    if (threadIdx.x == 0) {
        if (bad || win < 0) {
            ctl[TT_CTL_ERROR] = TT_ERR_NON_FINITE;
            ctl[TT_CTL_ERRNODE] = ctl[TT_CTL_NODE];
        } else {
            const float logprob = top - (top + logf(z));  // the CPU engine's expression: logit - logsumexp(legal)
            const int token = cand[win], edge = cand[cand_cap + win];
            const int* g = ctl_ptr(ctl, TT_CTL_TRIE);
            if (g) take_step(GlobalTrie{g}, ctl, vout, trace, edge, token, top, logprob);
            else take_step(ConstTrie{}, ctl, vout, trace, edge, token, top, logprob);
        }
    }
    __syncthreads();  // the advance's ctl and every read of cand come before the next mask
    trie_mask_block(ctl, cand, cand_cap);
    if (threadIdx.x == 0) publish_state(ctl, vout, cond);  // an empty next mask ends the loop now
}
