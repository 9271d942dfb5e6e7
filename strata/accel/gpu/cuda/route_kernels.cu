// A prompt layer's expert-major row tables made on the device from the router's ids (moe_block.py; kernels.py
// `route_hist` and `route_rows` state the contract, rows_host.expert_major the rule: a stable counting sort of the
// (token, k) pairs by their expert's position in row order, each expert's rows holding its tokens in order).
// Legend: P = T·K pairs (token-major), E experts, RT_TILE pairs a block, RT_WARPS warps a block.
//
// Why: at 900 tokens the host's copy of the ids, its counts and its counting sort took ~90 of a narrow layer's
// ~520 us window after the routing sync on the H200's host, with the GPU idle, and writing the row tables into the
// staging ring ~35 more (bench/host_lines.py, bench/results/h200/host_lines_window_q8_stop45a.log). Here the sync
// brings back only the counts; the host orders E experts, and the pairs' rows are made where the ids already are:
// 1.002-1.038x on qwen3's quarter cache below 2K, the same bits (knobs_ab_q8_stop45.log).
#include "common.cuh"

#define RT_TILE 512                  // kernels.py ROUTE_TILE
#define RT_WARPS (RT_TILE / 32)

// hist [tiles, E] <- per tile of RT_TILE consecutive pairs, the pairs routed to each expert (the host's counts are
// its column sums; route_rows takes the tiles before a pair's from it). Peers in a warp add once (__match_any_sync):
// a narrow layer routes most pairs to a few experts.
extern "C" __global__ void __launch_bounds__(RT_TILE) route_hist(int* hist, const int* ids, int P, int E) {
    extern __shared__ int h[];                                           // [E]
    for (int e = threadIdx.x; e < E; e += RT_TILE) h[e] = 0;
    __syncthreads();
    const int p = blockIdx.x * RT_TILE + threadIdx.x, lane = threadIdx.x & 31;
    if (p < P) {
        const int e = ids[p];
        const u32 peers = __match_any_sync(__activemask(), e);
        if (__ffs(peers) - 1 == lane) atomicAdd(&h[e], __popc(peers));
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += RT_TILE) hist[(long long)blockIdx.x * E + e] = h[e];
}

// slot [P] <- the row of each pair, src [P] <- the token of each row. Pair p of expert e takes row off[e] + (e's
// pairs in the tiles before p's: hist) + (e's pairs before p in its tile: the warps before p's, then the lanes).
extern "C" __global__ void __launch_bounds__(RT_TILE) route_rows(int* slot, int* src, const int* ids, const int* off,
                                                                  const int* hist, int P, int E, int K) {
    extern __shared__ int sm[];                                          // base [E] | per warp [RT_WARPS][E]
    int* base = sm;
    int* wcnt = sm + E;
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int e = threadIdx.x; e < E; e += RT_TILE) {
        int b = off[e];
        for (int u = 0; u < t; u++) b += hist[(long long)u * E + e];
        base[e] = b;
    }
    for (int i = threadIdx.x; i < RT_WARPS * E; i += RT_TILE) wcnt[i] = 0;
    __syncthreads();
    const int p = t * RT_TILE + threadIdx.x;
    int e = 0, rank = 0;
    if (p < P) {
        e = ids[p];
        const u32 peers = __match_any_sync(__activemask(), e);
        rank = __popc(peers & ((1u << lane) - 1u));
        if (__ffs(peers) - 1 == lane) wcnt[warp * E + e] = __popc(peers);
    }
    __syncthreads();
    if (p < P) {
        int r = base[e] + rank;
        for (int w = 0; w < warp; w++) r += wcnt[w * E + e];
        slot[p] = r;
        src[r] = p / K;
    }
}
