// Experts with few rows in a prompt, straight from their quantised blobs (kernels.py `expert_rows` states the
// contract). Legend: N/Kd a matrix's rows/row length, RB ggml blocks per row (Kd = RB·QK), RT rows per tile.
//
// Why: below ~16 tokens an expert's product is a GEMV in disguise. Dequantising its blob to fp16 first writes
// and reads back ~5x the blob's bytes (IQ2_XS: 2.3 bits a weight -> 16), and a 64-row MMA tile then runs mostly
// empty. Here each warp owns one weight row at a time, reads the blob's bytes once (moe_gemv's staging,
// decode_kernels.cu), dequantises each part exactly (dequant.cuh), rounds it to fp16, and uses it for up to RT
// input rows held in registers' reach (L1): fp32 accumulation, one warp sum per row at the end.
// The arithmetic depends only on the expert's rows and weights, never on the launch's other experts or on where
// the blob sits (cache slot or ring slot).
#include "dequant.cuh"
#include "common.cuh"

#define ER_WARPS 8
#define ER_RT 8        // rows per tile (moe.py ROWS_TILE)
#define ER_STAGE 1152  // bytes: 32 parts of any type (moe_gemv's MG_STAGE)

// acc += Σ_i v[i] · x[i] over one part of PART weights; x fp16 at a 16-byte boundary when vec
template <int PART>
__device__ __forceinline__ float dot_part(const float* v, const half_t* x, float acc, bool vec) {
    if constexpr (PART % 8 == 0) {
        if (vec) {
            STRATA_UNROLL
            for (int i = 0; i < PART; i += 8) {
                const uint4 w = *reinterpret_cast<const uint4*>(x + i);
                const u32 u[4] = {w.x, w.y, w.z, w.w};
                STRATA_UNROLL
                for (int j = 0; j < 4; ++j) {
                    acc = fmaf(v[i + 2 * j], h2f((half_t)(u[j] & 0xFFFFu)), acc);
                    acc = fmaf(v[i + 2 * j + 1], h2f((half_t)(u[j] >> 16)), acc);
                }
            }
            return acc;
        }
    }
    STRATA_UNROLL
    for (int i = 0; i < PART; ++i) acc = fmaf(v[i], h2f(x[i]), acc);
    return acc;
}

// For each tile (g, r0, r1) of tiles (grid x), r1 - r0 <= ER_RT: out[r, n] = Σ_k f16(W_g[n, k]) · A[r, k] for
// r in r0..r1, W_g the N x Kd matrix of type Q at device address ptrs[g]. Grid y strides over n.
template <class Q>
__device__ __forceinline__ void expert_rows(float* out, int ldo, const half_t* A, int lda,
                                            const unsigned long long* ptrs, const int* tiles, int N, int RB,
                                            int vec) {
    __shared__ __align__(16) unsigned char stage[ER_WARPS * ER_STAGE];
    constexpr int PPB = Q::QK / Q::PART;  // parts per block
    constexpr int BPS = 32 / PPB;         // blocks per warp step
    const int* t = tiles + 3 * blockIdx.x;
    const int g = t[0], r0 = t[1], nr = t[2] - t[1];
    if (nr <= 0) return;                        // an empty tile: a grid past the device's tiles (presync.py)
    const uint8_t* W = reinterpret_cast<const uint8_t*>(ptrs[g]);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t* st = stage + warp * ER_STAGE;
    const long long row_bytes = (long long)RB * Q::SIZE;
    const half_t* a0 = A + (long long)r0 * lda;
    for (int n = blockIdx.y * ER_WARPS + warp; n < N; n += gridDim.y * ER_WARPS) {
        const uint8_t* row = W + n * row_bytes;
        float acc[ER_RT];
        STRATA_UNROLL
        for (int r = 0; r < ER_RT; ++r) acc[r] = 0.f;
        for (int b0 = 0; b0 < RB; b0 += BPS) {
            float v[Q::PART];
            if (stage_row_part<Q>(st, row, b0, RB, lane, v)) {
                STRATA_UNROLL
                for (int i = 0; i < Q::PART; ++i) v[i] = h2f(f2h(v[i]));   // the fp16 weight (SPEC §2)
                const half_t* x = a0 + b0 * Q::QK + lane * Q::PART;
                STRATA_UNROLL
                for (int r = 0; r < ER_RT; ++r)
                    if (r < nr) acc[r] = dot_part<Q::PART>(v, x + (long long)r * lda, acc[r], vec);
            }
            __syncwarp();
        }
        STRATA_UNROLL
        for (int r = 0; r < ER_RT; ++r) {
            if (r < nr) {
                float a = acc[r];
                for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
                if (lane == 0) out[(long long)(r0 + r) * ldo + n] = a;
            }
        }
    }
}

#define STRATA_EXPERT_ROWS(nm)                                                                                   \
    extern "C" __global__ void expert_rows_##nm(float* out, int ldo, const half_t* A, int lda,                  \
                                                const unsigned long long* ptrs, const int* tiles, int N,        \
                                                int RB, int vec) {                                               \
        expert_rows<nm##_t>(out, ldo, A, lda, ptrs, tiles, N, RB, vec);                                          \
    }

STRATA_EXPERT_ROWS(f32)
STRATA_EXPERT_ROWS(f16)
STRATA_EXPERT_ROWS(bf16)
STRATA_EXPERT_ROWS(q4_0)
STRATA_EXPERT_ROWS(q4_1)
STRATA_EXPERT_ROWS(q5_0)
STRATA_EXPERT_ROWS(q5_1)
STRATA_EXPERT_ROWS(q8_0)
STRATA_EXPERT_ROWS(q2_0)
STRATA_EXPERT_ROWS(iq4_nl)
STRATA_EXPERT_ROWS(mxfp4)
STRATA_EXPERT_ROWS(iq4_xs)
STRATA_EXPERT_ROWS(q2_k)
STRATA_EXPERT_ROWS(q3_k)
STRATA_EXPERT_ROWS(q4_k)
STRATA_EXPERT_ROWS(q5_k)
STRATA_EXPERT_ROWS(q6_k)
STRATA_EXPERT_ROWS(iq2_xxs)
STRATA_EXPERT_ROWS(iq2_xs)
STRATA_EXPERT_ROWS(iq2_s)
STRATA_EXPERT_ROWS(iq3_xxs)
STRATA_EXPERT_ROWS(iq3_s)
STRATA_EXPERT_ROWS(iq1_s)
STRATA_EXPERT_ROWS(iq1_m)
