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
                                         long long off, int N, int RB) {
    extern __shared__ __align__(16) unsigned char sm[];
    constexpr int PPB = Q::QK / Q::PART;  // parts per block
    constexpr int BPS = 32 / PPB;         // blocks per warp step
    const int Kd = RB * Q::QK;
    float* xs = reinterpret_cast<float*>(sm);
    const int p = blockIdx.y, e = ids[p], s = slot_of[e];
    const uint8_t* W = (s >= 0 ? cache + (long long)s * slot_bytes : arena + (long long)e * blob_bytes) + off;
    const long long xr = (long long)(p / x_div) * ldx;
    for (int i = threadIdx.x; i < Kd; i += blockDim.x) xs[XS(i)] = x ? h2f(f2h(x[xr + i])) : h2f(xh[xr + i]);
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t* st = sm + (long long)XS(Kd) * 4 + warp * MG_STAGE;
    const long long row_bytes = (long long)RB * Q::SIZE;
    for (int n = blockIdx.x * MG_WARPS + warp; n < N; n += gridDim.x * MG_WARPS) {
        const uint8_t* row = W + n * row_bytes;
        float acc = 0.f;
        for (int b0 = 0; b0 < RB; b0 += BPS) {
            float v[Q::PART];
            if (stage_row_part<Q>(st, row, b0, RB, lane, v)) {
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
                                             long long blob_bytes, long long off, int N, int RB) {               \
        moe_gemv<nm##_t>(out, ldo, x, xh, ldx, x_div, ids, slot_of, cache, slot_bytes, arena, blob_bytes, off,  \
                         N, RB);                                                                                 \
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
// (flash-decoding): a block per (head, part) where a one-block-per-head pass walked every key in series (a
// decode token's attention grew with the context: bench/decode_context.py). Part c of head h holds keys
// [c·CH, min(S, c·CH + CH)), CH = 32·ceil(S / (32·AD_PARTS)); AD_PARTS blocks a head whatever S, those past S idle,
// so one captured graph serves every position. The prompt path's fp16 q and k, fp32 scores scaled in the softmax,
// fp32 sums over fp16 v; a part's weights exp(score − its max) are rounded to fp16, and the merge rescales the
// parts by exp(max_c − max) over the sum of exponentials. sc fp32 [H, ld_sc]: the scores in [0, S), the parts'
// (max, sum, o[hd]) in the last AD_PARTS·(hd + 2) floats of each head's row (cuda_decode.attn_decode_cols).
#define AD_PARTS 32

__device__ __forceinline__ int ad_chunk(int S) { return 32 * ((S + 32 * AD_PARTS - 1) / (32 * AD_PARTS)); }

extern "C" __global__ void attn_dec_part(const float* q, const half_t* kc, const half_t* vc, const int* pos,
                                         float* sc, int ld_sc, int H, int Hkv, int hd, float scale) {
    __shared__ float sh[33];
    extern __shared__ float qs[];  // [hd]
    const int h = blockIdx.x, c = blockIdx.y, j = h / (H / Hkv), S = pos[0] + 1, CH = ad_chunk(S);
    const int s0 = c * CH, s1 = min(S, s0 + CH);
    if (s0 >= S) return;                                               // the whole block: no barrier is skipped
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = h2f(f2h(q[(long long)h * hd + d]));
    __syncthreads();
    float* x = sc + (long long)h * ld_sc;
    float* part = x + ld_sc - AD_PARTS * (hd + 2) + c * (hd + 2);  // [max, sum, o[hd]]
    float mx = -3.0e38f;
    for (int s = s0 + warp; s < s1; s += nw) {
        const half_t* kr = kc + ((long long)s * Hkv + j) * hd;
        float a = 0.f;
        for (int d = lane; d < hd; d += 32) a += qs[d] * h2f(kr[d]);
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0) x[s] = a;
        mx = fmaxf(mx, a * scale);
    }
    if (lane == 0) sh[warp] = mx;
    __syncthreads();
    mx = sh[0];
    for (int i = 1; i < nw; i++) mx = fmaxf(mx, sh[i]);
    __syncthreads();
    float sum = 0.f;
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
        const float e = expf(x[s] * scale - mx);
        sum += e;
        x[s] = h2f(f2h(e));
    }
    sum = block_sum(sum, sh);                                          // its barriers publish x[s0, s1)
    if (threadIdx.x == 0) { part[0] = mx; part[1] = sum; }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
#pragma unroll 4
        for (int s = s0; s < s1; s++) a += x[s] * h2f(vc[((long long)s * Hkv + j) * hd + d]);
        part[2 + d] = a;
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
