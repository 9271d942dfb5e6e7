// Decode-step kernels of the captured decode graph (strata/accel/decode_graph.py; kernels.py states each contract).
// Legend: P = T·K (token, k) pairs, N/Kd a matrix's rows/row length, RB ggml blocks per row (Kd = RB·QK),
// H/Hkv heads, hd head size, S keys. Everything that varies between tokens (position, routed ids, residency) is
// read from device memory, so one capture serves every token.
#include "dequant.cuh"
#include "common.cuh"

// ---- experts straight from their quantised blobs --------------------------------------------------------------
// out[p, n] = Σ_k f16(W_e[n, k]) · f16(x[p / x_div, k]) for expert e = ids[p], fp32 accumulation. W_e is the
// matrix at byte `off` of e's blob: cache slot slot_of[e] when >= 0, else its blob in the pinned arena, which the
// GPU reads over PCIe (host memory from cudaHostAlloc is device-addressable under UVA). Both sources run this one
// kernel, so residency never changes the arithmetic. A warp owns a row; per step it stages 32 parts (1,024 weights
// of a block type) with 4-byte loads into shared memory (one read of each byte, coalesced: what a zero-copy read
// over PCIe needs), then each lane dequantises its part exactly (dequant.cuh) and rounds it to fp16. x sits in
// shared memory with a pad float after every 32 (XS), so the 32 lanes reading their parts' weight j hit 32 banks.
#define MG_WARPS 8
#define MG_STAGE 1152  // bytes: 32 parts of any type (Q8_0's 32 blocks take 1,088)
#define XS(i) ((i) + ((i) >> 5))

template <class Q>
__device__ __forceinline__ void moe_gemv(float* out, int ldo, const float* x, const half_t* xh, int ldx, int x_div,
                                         const int* ids, const int* slot_of, const uint8_t* cache,
                                         long long slot_bytes, const uint8_t* arena, long long blob_bytes,
                                         long long off, int N, int RB, int glu) {
    extern __shared__ __align__(16) unsigned char sm[];
    constexpr int PPB = Q::QK / Q::PART;  // parts per block
    constexpr int BPS = 32 / PPB;         // blocks per warp step
    const int Kd = RB * Q::QK;
    float* xs = reinterpret_cast<float*>(sm);
    const int p = blockIdx.y, e = ids[p], s = slot_of[e];
    const uint8_t* W = (s >= 0 ? cache + (long long)s * slot_bytes : arena + (long long)e * blob_bytes) + off;
    const long long xr = (long long)(p / x_div) * ldx;
    // glu: x is gate|up f32 [.., 2·Kd] and the row is SwiGLU's fp16 intermediate (a swiglu launch a layer saved)
    for (int i = threadIdx.x; i < Kd; i += blockDim.x)
        xs[XS(i)] = x ? h2f(glu ? swiglu_h(x[xr + i], x[xr + Kd + i]) : f2h(x[xr + i])) : h2f(xh[xr + i]);
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t* st = sm + (long long)XS(Kd) * 4 + warp * MG_STAGE;
    const long long row_bytes = (long long)RB * Q::SIZE;
    // Rows of whole 4-byte words: the next step's words are loaded into registers before this step's products, so
    // a warp keeps a step's reads in flight while it computes (blobs read over PCIe: 1.02-1.54x a call,
    // bench/results/h200/moe_gemv_ab_stop44.log); other rows stage each step as it comes (warp_stage). The same
    // parts, dequantised and added in the same order either way.
    constexpr int WPL = (BPS * Q::SIZE / 4 + 31) / 32;       // 4-byte words a lane holds of a full step
    const bool words = (BPS * Q::SIZE) % 4 == 0 && row_bytes % 4 == 0 && ((unsigned long long)W & 3ull) == 0;
    for (int n = blockIdx.x * MG_WARPS + warp; n < N; n += gridDim.x * MG_WARPS) {
        const uint8_t* row = W + n * row_bytes;
        float acc = 0.f;
        u32 r[WPL];
        auto fetch = [&](int b0) {                            // step b0's words, lane-strided (coalesced)
            const int nw = min(BPS, RB - b0) * Q::SIZE / 4;
            const u32* src = reinterpret_cast<const u32*>(row + (long long)b0 * Q::SIZE);
            STRATA_UNROLL
            for (int j = 0; j < WPL; j++)
                if (lane + 32 * j < nw) r[j] = src[lane + 32 * j];
        };
        if (words) fetch(0);
        for (int b0 = 0; b0 < RB; b0 += BPS) {
            const int nb = min(BPS, RB - b0);
            if (words) {
                const int nw = nb * Q::SIZE / 4;
                STRATA_UNROLL
                for (int j = 0; j < WPL; j++)
                    if (lane + 32 * j < nw) reinterpret_cast<u32*>(st)[lane + 32 * j] = r[j];
                __syncwarp();
                if (b0 + BPS < RB) fetch(b0 + BPS);
            } else {
                warp_stage(st, row + (long long)b0 * Q::SIZE, nb * Q::SIZE, lane);
            }
            if (lane < nb * PPB) {
                float v[Q::PART];
                Q::dq_part(st + (lane / PPB) * Q::SIZE, lane % PPB, v);
                const float* xv = xs + XS(b0 * Q::QK + lane * Q::PART);     // a part never crosses a pad
                STRATA_UNROLL
                for (int i = 0; i < Q::PART; ++i) acc = fmaf(h2f(f2h(v[i])), xv[i], acc);
            }
            __syncwarp();
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) out[(long long)p * ldo + n] = acc;
    }
}

#define STRATA_MOE_GEMV(nm)                                                                                      \
    extern "C" __global__ void moe_gemv_##nm(float* out, int ldo, const float* x, const half_t* xh, int ldx,    \
                                             int x_div, const int* ids, const int* slot_of,                      \
                                             const uint8_t* cache, long long slot_bytes, const uint8_t* arena,   \
                                             long long blob_bytes, long long off, int N, int RB, int glu) {      \
        moe_gemv<nm##_t>(out, ldo, x, xh, ldx, x_div, ids, slot_of, cache, slot_bytes, arena, blob_bytes, off,  \
                         N, RB, glu);                                                                            \
    }

STRATA_MOE_GEMV(f32)
STRATA_MOE_GEMV(f16)
STRATA_MOE_GEMV(bf16)
STRATA_MOE_GEMV(q4_0)
STRATA_MOE_GEMV(q4_1)
STRATA_MOE_GEMV(q5_0)
STRATA_MOE_GEMV(q5_1)
STRATA_MOE_GEMV(q8_0)
STRATA_MOE_GEMV(q2_0)
STRATA_MOE_GEMV(iq4_nl)
STRATA_MOE_GEMV(mxfp4)
STRATA_MOE_GEMV(iq4_xs)
STRATA_MOE_GEMV(q2_k)
STRATA_MOE_GEMV(q3_k)
STRATA_MOE_GEMV(q4_k)
STRATA_MOE_GEMV(q5_k)
STRATA_MOE_GEMV(q6_k)
STRATA_MOE_GEMV(iq2_xxs)
STRATA_MOE_GEMV(iq2_xs)
STRATA_MOE_GEMV(iq2_s)
STRATA_MOE_GEMV(iq3_xxs)
STRATA_MOE_GEMV(iq3_s)
STRATA_MOE_GEMV(iq1_s)
STRATA_MOE_GEMV(iq1_m)

// ---- attention of one token at the position in pos[0] ----------------------------------------------------------
// kc/vc row pos[0] <- k/v [Hkv·hd] (kv_store's rounding)
extern "C" __global__ void kv_store_at(half_t* kc, half_t* vc, const float* k, const float* v, const int* pos, int n) {
    const long long off = (long long)pos[0] * n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        kc[off + i] = f2h(k[i]);
        vc[off + i] = f2h(v[i]);
    }
}

// One query q fp32 [H, hd] at position pos[0] over the keys 0..pos[0] (S of them), split over the keys
// (flash-decoding) where one block a head had walked every key in series, and decode slowed with the context
// (bench/results/h200/decode_attn_ab_*_stop28.log). Block (b, c) takes
// the GB query heads b·GB.. (a divisor of H/Hkv, <= AD_MAXG), which share one kv head: their keys and values of
// part c are read once for all of them. Part c holds keys [c·CH, min(S, c·CH + CH)), CH = 32·ceil(S /
// (32·AD_PARTS)); AD_PARTS blocks a group whatever S, those past S idle, so one captured graph serves every
// position. The prompt path's fp16 q and k, fp32 scores scaled in the softmax, fp32 sums over fp16 v; a part's
// weights exp(score − its max) are rounded to fp16, and the merge rescales the parts by exp(max_c − max) over the
// sum of the exponentials. sc fp32 [H, ld_sc]: the scores in [0, S), then the parts' (max, sum, o[hd]) in the last
// AD_PARTS·(hd + 2) floats of each head's row (cuda_decode.attn_decode_cols). hd <= 32·AD_MAXD.
#define AD_PARTS 128
#define AD_WARPS 4    // 128 threads a block (cuda_decode.AD_THREADS)
#define AD_MAXD 8
#define AD_MAXG 8

__device__ __forceinline__ int ad_chunk(int S) { return 32 * ((S + 32 * AD_PARTS - 1) / (32 * AD_PARTS)); }

extern "C" __global__ void attn_dec_part(const float* q, const half_t* kc, const half_t* vc, const int* pos,
                                         float* sc, int ld_sc, int H, int Hkv, int hd, float scale, int GB) {
    __shared__ float shm[AD_WARPS][AD_MAXG];
    __shared__ float shs[AD_WARPS][AD_MAXG];
    extern __shared__ float smem[];  // qs [GB][hd] | red [AD_WARPS][GB][hd]
    const int h0 = blockIdx.x * GB, c = blockIdx.y, j = h0 / (H / Hkv), S = pos[0] + 1, CH = ad_chunk(S);
    const int s0 = c * CH, s1 = min(S, s0 + CH);
    if (s0 >= S) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = AD_WARPS;
    float* qs = smem;
    float* red = smem + GB * hd;
    for (int i = threadIdx.x; i < GB * hd; i += blockDim.x) qs[i] = h2f(f2h(q[(long long)h0 * hd + i]));
    __syncthreads();
    const int h8 = hd >> 3;          // hd % 8 == 0 (attn_decode_takes): key rows are whole 16-byte loads
    float mx[AD_MAXG];
#pragma unroll
    for (int g = 0; g < AD_MAXG; g++) mx[g] = -3.0e38f;
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) {        // scores: a thread a key, its row read once
        const half_t* kr = kc + ((long long)s * Hkv + j) * hd;
        const uint4* k4 = reinterpret_cast<const uint4*>(kr);
        float a[AD_MAXG];
#pragma unroll
        for (int g = 0; g < AD_MAXG; g++) a[g] = 0.f;
        for (int i = 0; i < h8; i++) {
            const uint4 u = k4[i];
            const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const float k0 = h2f((half_t)(w[t] & 0xffffu)), k1 = h2f((half_t)(w[t] >> 16));
#pragma unroll
                for (int g = 0; g < AD_MAXG; g++)
                    if (g < GB) {
                        a[g] += qs[g * hd + 8 * i + 2 * t] * k0;
                        a[g] += qs[g * hd + 8 * i + 2 * t + 1] * k1;
                    }
            }
        }
#pragma unroll
        for (int g = 0; g < AD_MAXG; g++)
            if (g < GB) {
                sc[(long long)(h0 + g) * ld_sc + s] = a[g];
                mx[g] = fmaxf(mx[g], a[g] * scale);
            }
    }
#pragma unroll
    for (int g = 0; g < AD_MAXG; g++) {
        for (int o = 16; o > 0; o >>= 1) mx[g] = fmaxf(mx[g], __shfl_xor_sync(0xffffffffu, mx[g], o));
        if (lane == 0) shm[warp][g] = mx[g];
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < AD_MAXG; g++) {
        mx[g] = shm[0][g];
        for (int i = 1; i < nw; i++) mx[g] = fmaxf(mx[g], shm[i][g]);
    }
    float sum[AD_MAXG];
#pragma unroll
    for (int g = 0; g < AD_MAXG; g++) sum[g] = 0.f;
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
#pragma unroll
        for (int g = 0; g < AD_MAXG; g++)
            if (g < GB) {
                float* xs = sc + (long long)(h0 + g) * ld_sc + s;
                const float e = expf(*xs * scale - mx[g]);
                sum[g] += e;
                *xs = h2f(f2h(e));
            }
    }
#pragma unroll
    for (int g = 0; g < AD_MAXG; g++) {
        for (int o = 16; o > 0; o >>= 1) sum[g] += __shfl_xor_sync(0xffffffffu, sum[g], o);
        if (lane == 0) shs[warp][g] = sum[g];
    }
    __syncthreads();                                                   // also publishes the rounded weights
    if (threadIdx.x < GB) {
        const int g = threadIdx.x;
        float l = 0.f;
        for (int i = 0; i < nw; i++) l += shs[i][g];
        float* part = sc + (long long)(h0 + g) * ld_sc + ld_sc - AD_PARTS * (hd + 2) + c * (hd + 2);
        part[0] = mx[g];
        part[1] = l;
    }
    float acc[AD_MAXG][AD_MAXD];
#pragma unroll
    for (int g = 0; g < AD_MAXG; g++)
#pragma unroll
        for (int i = 0; i < AD_MAXD; i++) acc[g][i] = 0.f;
    for (int s = s0 + warp; s < s1; s += nw) {                       // Σ p·v: a warp a key, lanes over hd
        const half_t* vr = vc + ((long long)s * Hkv + j) * hd;
        float v[AD_MAXD];
#pragma unroll
        for (int i = 0; i < AD_MAXD; i++) v[i] = lane + 32 * i < hd ? h2f(vr[lane + 32 * i]) : 0.f;
#pragma unroll
        for (int g = 0; g < AD_MAXG; g++)
            if (g < GB) {
                const float p = sc[(long long)(h0 + g) * ld_sc + s];
#pragma unroll
                for (int i = 0; i < AD_MAXD; i++) acc[g][i] += p * v[i];
            }
    }
#pragma unroll
    for (int g = 0; g < AD_MAXG; g++)
        if (g < GB)
#pragma unroll
            for (int i = 0; i < AD_MAXD; i++)
                if (lane + 32 * i < hd) red[(warp * GB + g) * hd + lane + 32 * i] = acc[g][i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < GB * hd; idx += blockDim.x) {
        const int g = idx / hd, d = idx - g * hd;
        float a = 0.f;
        for (int w = 0; w < nw; w++) a += red[(w * GB + g) * hd + d];
        sc[(long long)(h0 + g) * ld_sc + ld_sc - AD_PARTS * (hd + 2) + c * (hd + 2) + 2 + d] = a;
    }
}

// out fp32 [H·hd] = Σ_c exp(max_c − max) · o_c / Σ_c exp(max_c − max) · sum_c over the parts of attn_dec_part, in
// part order (the same order for every thread: deterministic). One block per head.
extern "C" __global__ void attn_dec_merge(float* out, const int* pos, const float* sc, int ld_sc, int hd) {
    const int h = blockIdx.x, S = pos[0] + 1, np = (S + ad_chunk(S) - 1) / ad_chunk(S);
    const float* parts = sc + (long long)h * ld_sc + ld_sc - AD_PARTS * (hd + 2);
    float mx = -3.0e38f;
    for (int c = 0; c < np; c++) mx = fmaxf(mx, parts[c * (hd + 2)]);
    float l = 0.f;
    for (int c = 0; c < np; c++) l += expf(parts[c * (hd + 2)] - mx) * parts[c * (hd + 2) + 1];
    const float inv = 1.f / l;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int c = 0; c < np; c++) a += expf(parts[c * (hd + 2)] - mx) * parts[c * (hd + 2) + 2 + d];
        out[(long long)h * hd + d] = a * inv;
    }
}
