// A prompt chunk's causal attention in one pass over the keys (kernels.py `attention`; FlashAttention-2's
// tiling: Dao, 2023). NVRTC source. Legend: T queries, H/Hkv heads, g = H/Hkv query heads a kv head, HD head
// size, M = T·g rows of one kv head (row m: query t = m / g of head j·g + m % g), S keys.
//
// Why: the cuBLAS path (cuda_kernels.py `_attention_blocked`) writes every score to memory in fp32, reads it back
// for the softmax, writes fp16 probabilities and reads them again, and computes the masked half of each block:
// at 2,048 tokens it ran at ~18 TFLOPS and took 15.2 of qwen3's 67.8 ms (prefill_ops_q8_stop16.log). Here scores
// and probabilities stay in registers. Arithmetic: fp16 q, k, v; fp32 scores, scaled, masked; each row's max and
// sum of exp; probabilities normalised, then rounded to fp16 for P·V; fp32 sums. The cuBLAS path's maths in
// another summation order (not its bits): the tolerance of test_gpu_kernels.py.
#include "common.cuh"
#include "mma.cuh"

#define FA_ROWS 64      // rows a block: 4 warps of 16
#define FA_KEYS 64      // keys a step
#define FA_THREADS 128
#define FA_NEG_INF __int_as_float(0xff800000)   // -inf without math.h (NVRTC)

// the key rows k0 .. k0+63 of kv head j (rows past `last` as zeros) -> dst [64][LD] fp16, by cp.async
template <int HD, int LD>
__device__ __forceinline__ void load_keys(half_t (*dst)[LD], const half_t* src, long long ldk, int j, int k0, int last,
                                          int tid) {
    constexpr int CH = HD / 8;                                         // 16-byte chunks a key row
    for (int i = tid; i < FA_KEYS * CH; i += FA_THREADS) {
        const int r = i / CH, c = (i % CH) * 8, s = k0 + r;
        const bool ok = s <= last;
        cp_async16(&dst[r][c], src + (long long)(ok ? s : 0) * ldk + (long long)j * HD + c, ok);
    }
    cp_async_commit();
}

// sc = scale · (the warp's 16 query rows) · (keys k0 .. k0+63)ᵀ, fp32, keys past a row's position -inf
// (thread layout: sc[n][0..1] row gid, sc[n][2..3] row gid + 8, keys k0 + 8n + 2·t4 + 0..1)
template <int HD, int LD>
__device__ __forceinline__ void scores(float (*sc)[4], const u32 (*qf)[4], const half_t (*Ks)[LD], int k0, int la,
                                       int lb, float scale, int lane) {
    const int t4 = lane & 3;
#pragma unroll
    for (int n = 0; n < FA_KEYS / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; n += 2) {
            u32 r[4];
            ldmatrix_x4(r, &Ks[n * 8 + (lane & 7) + (lane >> 4) * 8][kk * 16 + ((lane >> 3) & 1) * 8]);
            const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma16816(sc[n], qf[kk], b0);
            mma16816(sc[n + 1], qf[kk], b1);
        }
    }
#pragma unroll
    for (int n = 0; n < FA_KEYS / 8; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int s = k0 + n * 8 + t4 * 2 + e;
            sc[n][e] = s <= la ? sc[n][e] * scale : FA_NEG_INF;
            sc[n][2 + e] = s <= lb ? sc[n][2 + e] * scale : FA_NEG_INF;
        }
}

// the block's query rows m0 .. m0+ROWS-1 of kv head j as fp16 (zeros past M): row m is query m / g of head
// j·g + m % g
template <int HD, int LD, int ROWS>
__device__ __forceinline__ void stage_q(half_t (*dst)[LD], const float* q, int m0, int M, int g, int H, int j,
                                        int tid) {
    for (int i = tid; i < ROWS * HD; i += FA_THREADS) {
        const int r = i / HD, d = i % HD, m = m0 + r;
        float v = 0.f;
        if (m < M) v = q[((long long)(m / g) * H + j * g + m % g) * HD + d];
        dst[r][d] = f2h(v);
    }
}

// pass 1's step for one m16 block: the rows' running max over this step's NB n-blocks of masked scores sc (the 4
// threads of a row agree on it), then their running sums of exp(score - max), rescaled to the new max
template <int NB>
__device__ __forceinline__ void max_sum_step(const float (*sc)[4], float& mx_a, float& mx_b, float& l_a, float& l_b) {
    float nm_a = mx_a, nm_b = mx_b;
#pragma unroll
    for (int n = 0; n < NB; n++) {
        nm_a = fmaxf(nm_a, fmaxf(sc[n][0], sc[n][1]));
        nm_b = fmaxf(nm_b, fmaxf(sc[n][2], sc[n][3]));
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {                                  // the 4 threads that share a row
        nm_a = fmaxf(nm_a, __shfl_xor_sync(0xffffffffu, nm_a, x));
        nm_b = fmaxf(nm_b, __shfl_xor_sync(0xffffffffu, nm_b, x));
    }
    float sa = 0.f, sb = 0.f;
#pragma unroll
    for (int n = 0; n < NB; n++) {
        sa += expf(sc[n][0] - nm_a) + expf(sc[n][1] - nm_a);
        sb += expf(sc[n][2] - nm_b) + expf(sc[n][3] - nm_b);
    }
    l_a = l_a * expf(mx_a - nm_a) + sa;
    l_b = l_b * expf(mx_b - nm_b) + sb;
    mx_a = nm_a, mx_b = nm_b;
}

// one m16 block's outputs: rows ra (o[n][0..1]) and rb (o[n][2..3]) of kv head j, columns n·8 + 2·t4 + 0..1
template <int HD>
__device__ __forceinline__ void store_rows(float* out, const float (*o)[4], int ra, int rb, int M, int g, int H, int j,
                                           int t4) {
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        const int d = n * 8 + t4 * 2;
        if (ra < M) {
            float* dst = out + ((long long)(ra / g) * H + j * g + ra % g) * HD + d;
            dst[0] = o[n][0];
            dst[1] = o[n][1];
        }
        if (rb < M) {
            float* dst = out + ((long long)(rb / g) * H + j * g + rb % g) * HD + d;
            dst[0] = o[n][2];
            dst[1] = o[n][3];
        }
    }
}

// Two passes over the keys, so each probability is normalised before its fp16 rounding, as attn_softmax and
// attn_decode round it (prompt and decode keep one arithmetic): the first finds each row's max and sum (running,
// rescaled per step), the second recomputes the scores and accumulates P·V. The second Q·Kᵀ costs 1.5x the
// products of one pass; normalising after rounding (one pass) flipped a top-1 token in test_cpu_share's
// reference comparison on the H200.
template <int HD>
__device__ __forceinline__ void flash_attention(float* out, const float* q, const half_t* kc, const half_t* vc,
                                                int T, int H, int Hkv, int pos0, float scale) {
    constexpr int LD = HD + 8;                 // smem row: HD halves + 16 bytes, ldmatrix's 8 rows on 32 banks
    __shared__ __align__(16) half_t Ks[FA_KEYS][LD];
    __shared__ __align__(16) half_t Vs[FA_KEYS][LD];
    const int j = blockIdx.y, g = H / Hkv, M = T * g, m0 = blockIdx.x * FA_ROWS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, t4 = lane & 3;
    const long long ldk = (long long)Hkv * HD;
    // Q: the block's 64 rows as fp16 (staged through Ks), then each warp's 16 rows as A fragments
    stage_q<HD, LD, FA_ROWS>(Ks, q, m0, M, g, H, j, tid);
    __syncthreads();
    u32 qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) ldmatrix_x4(qf[kk], &Ks[warp * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
    // this thread's two rows (gid, gid + 8 of the warp's 16) and the last key each may see
    const int ra = m0 + warp * 16 + gid, rb = ra + 8;
    const int la = pos0 + min(ra, M - 1) / g, lb = pos0 + min(rb, M - 1) / g;
    const int last = pos0 + (min(m0 + FA_ROWS, M) - 1) / g;          // the block's last visible key
    float sc[FA_KEYS / 8][4];
    // pass 1: each row's max and sum of exp(score - max); key 0 is visible to every row, so the max is finite
    float mx_a = FA_NEG_INF, mx_b = FA_NEG_INF, l_a = 0.f, l_b = 0.f;
    for (int k0 = 0; k0 <= last; k0 += FA_KEYS) {
        __syncthreads();                                               // every warp is done with the last step
        load_keys<HD, LD>(Ks, kc, ldk, j, k0, last, tid);
        cp_async_wait_all();
        __syncthreads();
        scores<HD, LD>(sc, qf, Ks, k0, la, lb, scale, lane);
        max_sum_step<FA_KEYS / 8>(sc, mx_a, mx_b, l_a, l_b);
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {                                  // each of a row's 4 threads holds a part
        l_a += __shfl_xor_sync(0xffffffffu, l_a, x);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, x);
    }
    const float ia = 1.f / l_a, ib = 1.f / l_b;
    // pass 2: P = exp(score - max) / sum rounded to fp16, O += P·V
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    for (int k0 = 0; k0 <= last; k0 += FA_KEYS) {
        __syncthreads();
        load_keys<HD, LD>(Ks, kc, ldk, j, k0, last, tid);
        load_keys<HD, LD>(Vs, vc, ldk, j, k0, last, tid);
        asm volatile("cp.async.wait_group 1;");                        // K landed (V may still be in flight)
        __syncthreads();
        scores<HD, LD>(sc, qf, Ks, k0, la, lb, scale, lane);
        u32 pf[FA_KEYS / 16][4];                                       // P as the A fragments of P·V
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; n++) {
            // C layout of n-block n = A layout of k16 step n / 2: (n even) a0 row gid, a1 row gid + 8; (odd) a2, a3
            pf[n / 2][(n & 1) * 2] = (u32)f2h(expf(sc[n][0] - mx_a) * ia) | ((u32)f2h(expf(sc[n][1] - mx_a) * ia) << 16);
            pf[n / 2][(n & 1) * 2 + 1] =
                (u32)f2h(expf(sc[n][2] - mx_b) * ib) | ((u32)f2h(expf(sc[n][3] - mx_b) * ib) << 16);
        }
        cp_async_wait_all();                                           // V landed
        __syncthreads();
        // V [keys][HD] row-major is the k x n operand: its fragments by transposed ldmatrix
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; kk++) {
#pragma unroll
            for (int n = 0; n < HD / 8; n += 2) {
                u32 r[4];
                ldmatrix_x4_trans(r, &Vs[kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][(n + (lane >> 4)) * 8]);
                const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma16816(o[n], pf[kk], b0);
                mma16816(o[n + 1], pf[kk], b1);
            }
        }
    }
    store_rows<HD>(out, o, ra, rb, M, g, H, j, t4);
}

// The same attention with 32 query rows a warp (two m16 blocks, 128 rows a block): each K or V fragment loaded from
// shared memory feeds both blocks' MMAs, two thirds of the 16-row kernel's shared-memory reads a product, and a
// block loads each key step once for 128 rows. Every output keeps the 16-row kernel's bits: pass 1 takes the same
// 64-key steps (each row's max and sum in the same order; steps past a row's last key are fully masked, exact
// no-ops); pass 2 takes 32 keys at a time, which leaves each row's P·V the same MMAs in ascending k16 order. Q sits
// in registers for pass 1 and is read from shared memory in pass 2, where the two blocks' accumulators need the
// registers.
#define FB_ROWS 128     // rows a block: 4 warps of 32
#define FB_HALF 32      // pass 2's keys a sub-step

template <int HD>
__device__ __forceinline__ void flash_attention_w32(float* out, const float* q, const half_t* kc, const half_t* vc,
                                                    int T, int H, int Hkv, int pos0, float scale) {
    constexpr int LD = HD + 8;
    extern __shared__ __align__(16) unsigned char fb_smem[];
    half_t (*Qs)[LD] = reinterpret_cast<half_t (*)[LD]>(fb_smem);                      // [FB_ROWS][LD]
    half_t (*Ks)[LD] = Qs + FB_ROWS;                                                    // [FA_KEYS][LD]
    half_t (*Vs)[LD] = Ks + FA_KEYS;                                                    // [FA_KEYS][LD]
    const int j = blockIdx.y, g = H / Hkv, M = T * g, m0 = blockIdx.x * FB_ROWS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, t4 = lane & 3;
    const long long ldk = (long long)Hkv * HD;
    stage_q<HD, LD, FB_ROWS>(Qs, q, m0, M, g, H, j, tid);
    __syncthreads();
    // this thread's rows: block b of the warp's two, rows gid (a) and gid + 8 (b) of it
    int ra[2], rb[2], la[2], lb[2];
#pragma unroll
    for (int b = 0; b < 2; b++) {
        ra[b] = m0 + warp * 32 + b * 16 + gid;
        rb[b] = ra[b] + 8;
        la[b] = pos0 + min(ra[b], M - 1) / g;
        lb[b] = pos0 + min(rb[b], M - 1) / g;
    }
    const int last = pos0 + (min(m0 + FB_ROWS, M) - 1) / g;
    float mx_a[2], mx_b[2], l_a[2], l_b[2];
    {   // pass 1, 64-key steps as flash_attention's: each row's max and sum of exp(score - max)
        u32 qf[2][HD / 16][4];
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                ldmatrix_x4(qf[b][kk], &Qs[warp * 32 + b * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
#pragma unroll
        for (int b = 0; b < 2; b++) mx_a[b] = mx_b[b] = FA_NEG_INF, l_a[b] = l_b[b] = 0.f;
        float sc[2][FA_KEYS / 8][4];
        for (int k0 = 0; k0 <= last; k0 += FA_KEYS) {
            __syncthreads();
            load_keys<HD, LD>(Ks, kc, ldk, j, k0, last, tid);
            cp_async_wait_all();
            __syncthreads();
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int n = 0; n < FA_KEYS / 8; n++) sc[b][n][0] = sc[b][n][1] = sc[b][n][2] = sc[b][n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int n = 0; n < FA_KEYS / 8; n += 2) {
                    u32 r[4];
                    ldmatrix_x4(r, &Ks[n * 8 + (lane & 7) + (lane >> 4) * 8][kk * 16 + ((lane >> 3) & 1) * 8]);
                    const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int b = 0; b < 2; b++) {
                        mma16816(sc[b][n], qf[b][kk], b0);
                        mma16816(sc[b][n + 1], qf[b][kk], b1);
                    }
                }
            }
#pragma unroll
            for (int b = 0; b < 2; b++) {
#pragma unroll
                for (int n = 0; n < FA_KEYS / 8; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int s = k0 + n * 8 + t4 * 2 + e;
                        sc[b][n][e] = s <= la[b] ? sc[b][n][e] * scale : FA_NEG_INF;
                        sc[b][n][2 + e] = s <= lb[b] ? sc[b][n][2 + e] * scale : FA_NEG_INF;
                    }
                max_sum_step<FA_KEYS / 8>(sc[b], mx_a[b], mx_b[b], l_a[b], l_b[b]);
            }
        }
    }
    float ia[2], ib[2];
#pragma unroll
    for (int b = 0; b < 2; b++) {
#pragma unroll
        for (int x = 1; x < 4; x <<= 1) {
            l_a[b] += __shfl_xor_sync(0xffffffffu, l_a[b], x);
            l_b[b] += __shfl_xor_sync(0xffffffffu, l_b[b], x);
        }
        ia[b] = 1.f / l_a[b], ib[b] = 1.f / l_b[b];
    }
    // pass 2: 64 keys loaded a step, taken 32 at a time: P = exp(score - max) / sum rounded to fp16, O += P·V
    float o[2][HD / 8][4];
#pragma unroll
    for (int b = 0; b < 2; b++)
#pragma unroll
        for (int n = 0; n < HD / 8; n++) o[b][n][0] = o[b][n][1] = o[b][n][2] = o[b][n][3] = 0.f;
    for (int k0 = 0; k0 <= last; k0 += FA_KEYS) {
        __syncthreads();
        load_keys<HD, LD>(Ks, kc, ldk, j, k0, last, tid);
        load_keys<HD, LD>(Vs, vc, ldk, j, k0, last, tid);
        asm volatile("cp.async.wait_group 1;");                        // K landed (V may still be in flight)
        __syncthreads();
#pragma unroll
        for (int h = 0; h < FA_KEYS / FB_HALF; h++) {
            if (k0 + h * FB_HALF > last) break;                        // every row's keys end before this half
            float sc[2][FB_HALF / 8][4];
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int n = 0; n < FB_HALF / 8; n++) sc[b][n][0] = sc[b][n][1] = sc[b][n][2] = sc[b][n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                u32 qa[2][4];
#pragma unroll
                for (int b = 0; b < 2; b++)
                    ldmatrix_x4(qa[b], &Qs[warp * 32 + b * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
#pragma unroll
                for (int n = 0; n < FB_HALF / 8; n += 2) {
                    u32 r[4];
                    ldmatrix_x4(r, &Ks[h * FB_HALF + n * 8 + (lane & 7) + (lane >> 4) * 8]
                                      [kk * 16 + ((lane >> 3) & 1) * 8]);
                    const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int b = 0; b < 2; b++) {
                        mma16816(sc[b][n], qa[b], b0);
                        mma16816(sc[b][n + 1], qa[b], b1);
                    }
                }
            }
            u32 pf[2][FB_HALF / 16][4];
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int n = 0; n < FB_HALF / 8; n++) {
                    float v[4];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int s = k0 + h * FB_HALF + n * 8 + t4 * 2 + e;
                        v[e] = s <= la[b] ? sc[b][n][e] * scale : FA_NEG_INF;
                        v[2 + e] = s <= lb[b] ? sc[b][n][2 + e] * scale : FA_NEG_INF;
                    }
                    pf[b][n / 2][(n & 1) * 2] =
                        (u32)f2h(expf(v[0] - mx_a[b]) * ia[b]) | ((u32)f2h(expf(v[1] - mx_a[b]) * ia[b]) << 16);
                    pf[b][n / 2][(n & 1) * 2 + 1] =
                        (u32)f2h(expf(v[2] - mx_b[b]) * ib[b]) | ((u32)f2h(expf(v[3] - mx_b[b]) * ib[b]) << 16);
                }
            if (h == 0) {
                cp_async_wait_all();                                   // V landed
                __syncthreads();
            }
#pragma unroll
            for (int kk = 0; kk < FB_HALF / 16; kk++) {
#pragma unroll
                for (int n = 0; n < HD / 8; n += 2) {
                    u32 r[4];
                    ldmatrix_x4_trans(r, &Vs[h * FB_HALF + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8]
                                            [(n + (lane >> 4)) * 8]);
                    const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int b = 0; b < 2; b++) {
                        mma16816(o[b][n], pf[b][kk], b0);
                        mma16816(o[b][n + 1], pf[b][kk], b1);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int b = 0; b < 2; b++)
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            const int d = n * 8 + t4 * 2;
            if (ra[b] < M) {
                float* dst = out + ((long long)(ra[b] / g) * H + j * g + ra[b] % g) * HD + d;
                dst[0] = o[b][n][0];
                dst[1] = o[b][n][1];
            }
            if (rb[b] < M) {
                float* dst = out + ((long long)(rb[b] / g) * H + j * g + rb[b] % g) * HD + d;
                dst[0] = o[b][n][2];
                dst[1] = o[b][n][3];
            }
        }
}

#define STRATA_FLASH(hd)                                                                                         \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                                     \
        flash_attention_##hd(float* out, const float* q, const half_t* kc, const half_t* vc, int T, int H,      \
                             int Hkv, int pos0, float scale) {                                                   \
        flash_attention<hd>(out, q, kc, vc, T, H, Hkv, pos0, scale);                                             \
    }

STRATA_FLASH(64)
STRATA_FLASH(128)

#define STRATA_FLASH_W32(hd)                                                                                     \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                                     \
        flash_attention_w32_##hd(float* out, const float* q, const half_t* kc, const half_t* vc, int T, int H,  \
                                 int Hkv, int pos0, float scale) {                                               \
        flash_attention_w32<hd>(out, q, kc, vc, T, H, Hkv, pos0, scale);                                         \
    }

STRATA_FLASH_W32(64)
STRATA_FLASH_W32(128)
