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

// out fp32 [H·hd] for the query q fp32 [H, hd] at position pos[0], keys 0..pos[0]; sc fp32 [H, ld_sc] scratch.
// One block per head. The prompt path's arithmetic (attention: attn_kernels.cu, or attn_qperm, cuBLAS and
// attn_softmax): fp16 q and k, fp32 scores scaled in the softmax, weights normalised then rounded to fp16, fp32
// sums over fp16 v.
extern "C" __global__ void attn_decode(float* out, const float* q, const half_t* kc, const half_t* vc,
                                       const int* pos, float* sc, int ld_sc, int H, int Hkv, int hd, float scale) {
    __shared__ float sh[33];
    extern __shared__ float qs[];  // [hd]
    const int h = blockIdx.x, j = h / (H / Hkv), S = pos[0] + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = h2f(f2h(q[(long long)h * hd + d]));
    __syncthreads();
    float* x = sc + (long long)h * ld_sc;
    float mx = -3.0e38f;
    for (int s = warp; s < S; s += nw) {
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
    for (int s = threadIdx.x; s < S; s += blockDim.x) sum += expf(x[s] * scale - mx);
    sum = block_sum(sum, sh);
    const float inv = 1.f / sum;
    for (int s = threadIdx.x; s < S; s += blockDim.x) x[s] = h2f(f2h(expf(x[s] * scale - mx) * inv));
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < S; s++) a += x[s] * h2f(vc[((long long)s * Hkv + j) * hd + d]);
        out[(long long)h * hd + d] = a;
    }
}
