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

// Exclusive prefix sums of v[0 .. n) in place; returns the total. Every thread of the block calls it (blockDim a
// multiple of 32, at most 1024); wsum: 32 ints of shared memory. Thread t sums a run of consecutive entries, a warp
// scan and a scan of the warps' totals give each run its start.
__device__ __forceinline__ int block_scan(int* v, int n, int* wsum) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int per = (n + blockDim.x - 1) / blockDim.x, a = min(n, tid * per), b = min(n, a + per);
    int sum = 0;
    for (int i = a; i < b; i++) sum += v[i];
    int x = sum;                                                        // inclusive, within the warp
    for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? wsum[lane] : 0;
        for (int d = 1; d < 32; d <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += y;
        }
        if (lane < nw) wsum[lane] = w;                                  // inclusive, over the warps
    }
    __syncthreads();
    int run = x - sum + (warp > 0 ? wsum[warp - 1] : 0);
    for (int i = a; i < b; i++) {
        const int c = v[i];
        v[i] = run;
        run += c;
    }
    const int total = wsum[nw - 1];
    __syncthreads();                                                    // wsum is the next call's
    return total;
}

// Before a prompt layer's routing sync (presync.py states the rule, plan_host is it on the host): from the counts
// (hist's first nt tiles), off [E] <- each routed expert's first row, order[0 .. n_order) first, the others by id
// (0 for the unrouted); and J launch groups, G a group in row order: groups [0, J1) over the routed experts among
// order[0 .. nc1), groups [J1, J) over those among order[nc1 .. nc). ptrs [J][2][W][G] (set 0 every member's blob
// + offs[w], set 1 the same where the member takes the GEMM, else 0), tiles [J][sf + sg][3] (g, r0, r1):
// expert_rows' of rows_tile rows, then the GEMM's of bm rows, each padded with (0, 0, 0) to nf / ng (the launches'
// grids), spans [J][2] the group's rows. order holds distinct experts. One block: the row order's offsets and the
// groups' members by prefix sums over the E positions of that order, a group's tiles by one thread each, then the
// threads write the tables. One thread walking the order did it in 19-21 us a call with its upload's pull at
// qwen3's shape, this in 13 (bench/plan_groups_ab.py, bench/results/h200/plan_ab_q8_stop54.log).
// The sizes come in the host's upload with the order (prm: nt, E, n_order, nc1, nc, W, J1, J, G, few_rows,
// rows_tile, bm, sf, sg, nf, ng): a launch of 9 arguments, not 24, costs the host ~15 us less (CuPy converts each).
extern "C" __global__ void __launch_bounds__(256) plan_groups(
        int* off, unsigned long long* ptrs, int* tiles, int* spans, const int* hist, const int* prm, const int* order,
        const unsigned long long* cptr, const unsigned long long* offs) {
    const int nt = prm[0], E = prm[1], n_order = prm[2], nc1 = prm[3], nc = prm[4], W = prm[5], J1 = prm[6],
              J = prm[7], G = prm[8], few_rows = prm[9], rows_tile = prm[10], bm = prm[11], sf = prm[12], sg = prm[13],
              nf = prm[14], ng = prm[15];
    extern __shared__ int sh[];
    int* cnt = sh;                      // [E] pairs of each expert
    int* pos = cnt + E;                 // [E] position in order, -1 past it; then a class's member ranks
    int* seq = pos + E;                 // [E] the expert at each position of the row order
    int* sc = seq + E;                  // [E] its pairs
    int* so = sc + E;                   // [E] its first row
    int* k2 = so + E;                   // [E] the second class's member ranks
    int* memb = k2 + E;                 // [J·G] each member's index into order, -1 for none
    int* mst = memb + J * G;            // [J·G] its first row
    int* mtb = mst + J * G;             // [J·G] its first tile in its group's table
    int* gsz = mtb + J * G;             // [J][2] tiles a group's two tables hold
    int* wsum = gsz + 2 * J;            // [32] block_scan's
    const int tid = threadIdx.x, JG = J * G, ts = sf + sg;
    for (int e = tid; e < E; e += blockDim.x) {
        cnt[e] = 0;
        pos[e] = -1;
    }
    for (int q = tid; q < JG; q += blockDim.x) memb[q] = -1;
    __syncthreads();
    for (int x = tid; x < nt * E; x += blockDim.x) atomicAdd(&cnt[x % E], hist[x]);   // integer: any order
    for (int i = tid; i < n_order; i += blockDim.x) pos[order[i]] = i;
    __syncthreads();
    // the experts past the order, by id: their ranks among those
    for (int e = tid; e < E; e += blockDim.x) so[e] = pos[e] < 0;
    __syncthreads();
    block_scan(so, E, wsum);
    for (int i = tid; i < n_order; i += blockDim.x) seq[i] = order[i];
    for (int e = tid; e < E; e += blockDim.x)
        if (pos[e] < 0) seq[n_order + so[e]] = e;
    __syncthreads();
    for (int i = tid; i < E; i += blockDim.x) {
        const int c = cnt[seq[i]];
        sc[i] = so[i] = c;
        pos[i] = c > 0 && i < nc1;                                      // the first class's members
        k2[i] = c > 0 && i >= nc1 && i < nc;                            // the second's
    }
    __syncthreads();
    block_scan(so, E, wsum);
    block_scan(pos, E, wsum);
    block_scan(k2, E, wsum);
    for (int i = tid; i < E; i += blockDim.x) {
        const int c = sc[i];
        off[seq[i]] = c > 0 ? so[i] : 0;
        if (c > 0 && i < nc1 && pos[i] < J1 * G) {
            memb[pos[i]] = i;
            mst[pos[i]] = so[i];
        } else if (c > 0 && i >= nc1 && i < nc && J1 * G + k2[i] < JG) {
            memb[J1 * G + k2[i]] = i;
            mst[J1 * G + k2[i]] = so[i];
        }
    }
    __syncthreads();
    for (int j = tid; j < J; j += blockDim.x) {
        int nfj = 0, ngj = 0, q1 = j * G - 1;             // q1: the group's last member
        for (int q = j * G; q < (j + 1) * G && memb[q] >= 0; q1 = q++) {
            const int c = sc[memb[q]];
            if (c <= few_rows) {
                mtb[q] = nfj;
                nfj += (c + rows_tile - 1) / rows_tile;
            } else {
                mtb[q] = ngj;
                ngj += (c + bm - 1) / bm;
            }
        }
        gsz[2 * j] = nfj;
        gsz[2 * j + 1] = ngj;
        const int q0 = j * G;
        spans[2 * j] = q0 <= q1 ? mst[q0] : 0;
        spans[2 * j + 1] = q0 <= q1 ? mst[q1] + sc[memb[q1]] : 0;
    }
    __syncthreads();
    for (int q = tid; q < JG; q += blockDim.x) {
        const int j = q / G, p = q - j * G, i = memb[q];
        const int c = i >= 0 ? sc[i] : 0;
        const unsigned long long base = i >= 0 ? cptr[i] : 0ull;
        for (int w = 0; w < W; w++) {
            ptrs[((long long)(2 * j) * W + w) * G + p] = i >= 0 ? base + offs[w] : 0ull;
            ptrs[((long long)(2 * j + 1) * W + w) * G + p] = i >= 0 && c > few_rows ? base + offs[w] : 0ull;
        }
        if (i < 0) continue;
        const int size = c <= few_rows ? rows_tile : bm;
        int* t = tiles + 3 * ((long long)j * ts + (c <= few_rows ? 0 : sf) + mtb[q]);
        for (int r = mst[q]; r < mst[q] + c; r += size, t += 3) {
            t[0] = p;
            t[1] = r;
            t[2] = min(r + size, mst[q] + c);
        }
    }
    for (int j = 0; j < J; j++) {                     // the empty tiles up to each launch's grid
        int* t = tiles + 3 * (long long)j * ts;
        for (int u = gsz[2 * j] + tid; u < nf; u += blockDim.x) t[3 * u] = t[3 * u + 1] = t[3 * u + 2] = 0;
        t += 3 * sf;
        for (int u = gsz[2 * j + 1] + tid; u < ng; u += blockDim.x) t[3 * u] = t[3 * u + 1] = t[3 * u + 2] = 0;
    }
}
