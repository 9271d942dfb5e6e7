// The experts' grouped GEMM straight from their quantised blobs (kernels.py `gemm_q` states the contract): for each
// tile (g, r0, r1) = tiles[blockIdx.x], C[r0:r1, n0:n0+BN] = A[r0:r1, :Kd] · deq(W_g)[n0:n0+BN, :Kd]^T, W_g the
// N x Kd matrix of type Q whose blocks start at device address ptrs[g], n0 = blockIdx.y·BN.
// Legend: R rows, N output columns (W rows), Kd the inner size, QK/SIZE a block's weights/bytes, SB the bytes of a
// row's 256 weights (a super-step), RS its stride in shared memory.
//
// Why: dequant + gemm_grouped writes each expert's fp16 copy (~3.7x a Q4_K blob's bytes) and reads it back; at
// ~4.3 TB/s the dequantisation alone was ~40% of a 900-token prompt's expert time (ops_q8_stop54.log). Here a
// super-step's raw bytes of the tile's W rows are staged by cp.async a super-step ahead, and each k step's
// weights are dequantised exactly (dequant.cuh) from shared memory into an fp16 tile, one k step ahead of the MMAs
// that read it. The MMAs are gemm_tile's, in its order, on the fp16 values the dequantisation kernel writes: the
// same bits as dequant + gemm_grouped (test_gemm_q_gives_the_scratch_path_bits). (Stop 30's gemm_q loaded each
// thread's bytes synchronously inside the k loop: 2.3-6.1x slower than the scratch path.)
#include "dequant.cuh"
#include "dequant_store.cuh"
#include "mma.cuh"

// One part of a k step into the fp16 tile: the dequantisation kernels' own dq_part and store_part
template <class Q>
__device__ __forceinline__ void part_to_f16(const uint8_t* b, int p, uint16_t* o, bool aligned) {
    float v[Q::PART];
    Q::dq_part(b, p, v);
    store_part<Q>(v, o);
}

// two floats -> fp16 bits (lo, hi) in one word by one cvt, each rounded as cvt.rn.f16.f32 rounds it
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    uint32_t d;
    asm("{ cvt.rn.f16x2.f32 %0, %2, %1; }" : "=r"(d) : "f"(lo), "f"(hi));
    return d;
}

// Q4_K with its block at a 16-byte boundary and finite scales (any other: the exact path above): dq_q4_k_part's
// values and bits, its 32 codes read as two 16-byte words, each made a float by the exponent trick (2^23 + q
// minus 2^23, exact) and rounded in pairs by one cvt. I2F and F2F issue at a quarter of the FP32 rate on sm_90,
// and the part's byte loads, conversions and NaN checks were the fused kernel's bound (gemm_q_stop55.log).
// Finite d·sc and dmin·m keep every value finite (no NaN to canonicalise; |y| < 2^26).
template <>
__device__ __forceinline__ void part_to_f16<q4_k_t>(const uint8_t* b, int p, uint16_t* o, bool aligned) {
    uint32_t sc, mn;
    scale_min_k4(b + 4, p, &sc, &mn);
    const float d1 = fmul(f16_at(b), i2f(sc)), m1 = fmul(f16_at(b + 2), i2f(mn));
    if (!aligned || !(fabsf(d1) <= 3.0e38f) || !(fabsf(m1) <= 3.0e38f)) {
        float v[32];
        dq_q4_k_part(b, p, v);
        store_part<q4_k_t>(v, o);
        return;
    }
    const uint4* qs = reinterpret_cast<const uint4*>(b + 16 + 32 * (p >> 1));
    const int shift = 4 * (p & 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint4 q = qs[h];
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
        uint32_t out[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t x = (words[i] >> shift) & 0x0F0F0F0Fu;     // codes of weights 4i..4i+3, a byte each
            float y[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float c = fsub(__uint_as_float(__byte_perm(x, 0x4B000000u, 0x7540u | j)), 8388608.f);
                y[j] = fsub(fmul(d1, c), m1);
            }
            out[2 * i] = pack_f16x2(y[0], y[1]);
            out[2 * i + 1] = pack_f16x2(y[2], y[3]);
        }
        reinterpret_cast<uint4*>(o)[2 * h] = make_uint4(out[0], out[1], out[2], out[3]);
        reinterpret_cast<uint4*>(o)[2 * h + 1] = make_uint4(out[4], out[5], out[6], out[7]);
    }
}

template <class Q, int WM, int WN, int MI, int NJ, int S>
struct GemmQ {
    using P = GemmTile<WM, WN, MI, NJ, 64, S>;
    static constexpr int SW = 256;                          // weights of a row's raw super-step: 4 k steps
    static constexpr int SB = SW / Q::QK * Q::SIZE;         // its bytes
    static constexpr int NC = (SB + 15) / 16 + 1;           // 16-byte chunks it spans at most, at any alignment
    static constexpr int RS = NC * 16;
    static constexpr int PPS = P::BK / Q::PART;             // a row's parts a k step
    // As [S][BM][LD] | Bs [2][BN][LD] fp16 | raw [2][BN][RS] bytes (cuda_experts.py GemmLaunch.quantised: the same)
    static constexpr int SMEM = S * P::BM * P::LD * 2 + 2 * P::BN * P::LD * 2 + 2 * P::BN * RS;
};

template <class Q, int WM, int WN, int MI, int NJ, int S>
__device__ __forceinline__ void gemm_q_tile(float* C, int ldc, const half_t* A, int lda,
                                            const unsigned long long* ptrs, const int* tiles, int N, int Kd,
                                            unsigned char* smem) {
    using G = GemmQ<Q, WM, WN, MI, NJ, S>;
    using P = typename G::P;
    constexpr int LD = P::LD, BK = P::BK, BM = P::BM, BN = P::BN, T = P::THREADS;
    static_assert(Q::PART == 32 && G::SW % Q::QK == 0, "block types of 32-weight parts");
    static_assert(BM * P::CH % T == 0, "whole loader passes");
    half_t(*As)[BM][LD] = reinterpret_cast<half_t(*)[BM][LD]>(smem);
    half_t(*Bs)[BN][LD] = reinterpret_cast<half_t(*)[BN][LD]>(smem + S * BM * LD * 2);
    unsigned char* raw = smem + S * BM * LD * 2 + 2 * BN * LD * 2;
    const int g = tiles[3 * blockIdx.x], r0 = tiles[3 * blockIdx.x + 1], r1 = tiles[3 * blockIdx.x + 2];
    if (r0 >= r1) return;                       // an empty tile: a grid past the device's tiles (presync.py)
    const int n0 = blockIdx.y * BN;
    const uint8_t* Wg = reinterpret_cast<const uint8_t*>(ptrs[g]);
    const long long rowb = (long long)(Kd / Q::QK) * Q::SIZE;        // a W row's bytes
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = (warp / WN) * 16 * MI, wn = (warp % WN) * 8 * NJ;
    const int live = min(MI, max(0, (r1 - r0 - wm + 15) >> 4));
    const ARows<P> arows(A, lda, r0, r1, tid);
    const int nk = (Kd + BK - 1) / BK, nss = (Kd + G::SW - 1) / G::SW;
    // super-step ss of every W row of the tile -> raw[buf]: the 16-byte words from the boundary at or below its
    // first byte to the one at or above its last (an aligned 16-byte load never crosses a page); rows past N and
    // words past the row's end read nothing
    auto load_raw = [&](int buf, int ss) {
        const long long off = (long long)ss * G::SB;
        const int nb = (int)min((long long)G::SB, rowb - off);
        for (int c = tid; c < BN * G::NC; c += T) {
            const int r = c / G::NC, j = c - r * G::NC, n = n0 + r;
            const unsigned long long s0 = reinterpret_cast<unsigned long long>(Wg + (long long)(n < N ? n : 0) * rowb + off);
            const unsigned long long a0 = s0 & ~15ull;
            const bool ok = n < N && 16 * j < (int)(s0 - a0) + nb;
            cp_async16(raw + (buf * BN + r) * G::RS + 16 * j, reinterpret_cast<const void*>(a0 + 16 * j), ok);
        }
    };
    // k step kt's weights of the tile's W rows -> Bs[buf], exactly as the dequantisation kernel rounds them. Rows
    // past N are left as they are (they feed only output columns past N, never stored), parts past Kd too (no MMA
    // reads them: Kd is a multiple of 32)
    auto dequant = [&](int buf, int kt) {
        const int ss = kt >> 2, w0 = (kt & 3) * BK;
        const unsigned char* rb = raw + (ss & 1) * BN * G::RS;
        for (int u = tid; u < BN * G::PPS; u += T) {
            const int r = u / G::PPS, j = u - r * G::PPS, n = n0 + r, w = w0 + j * Q::PART;
            if (n >= N || ss * G::SW + w >= Kd) continue;
            const int head = (int)(reinterpret_cast<unsigned long long>(Wg + (long long)n * rowb +
                                                                        (long long)ss * G::SB) & 15ull);
            part_to_f16<Q>(rb + r * G::RS + head + (w / Q::QK) * Q::SIZE, (w % Q::QK) / Q::PART,
                           &Bs[buf][r][j * Q::PART], head == 0 && Q::SIZE % 16 == 0);
        }
    };
    float acc[MI][NJ][4];
    tile_zero<MI, NJ>(acc);
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < nk) arows.load(As[s], s, Kd, tid);
        if (s == 0) load_raw(0, 0);
        cp_async_commit();
    }
    cp_async_wait_stages<S>();
    __syncthreads();                            // super-step 0 landed for every thread
    dequant(0, 0);
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait_stages<S>();
        // A stage kt and Bs[kt & 1] ready for every warp; every warp is done with stage kt - 1's MMAs (and so with
        // Bs[(kt + 1) & 1]); super-step kt / 4 + 1, issued at step kt - 3 or earlier (S <= 4), has landed
        __syncthreads();
        if (kt + S - 1 < nk) arows.load(As[(kt + S - 1) % S], kt + S - 1, Kd, tid);
        if ((kt & 3) == 0 && (kt >> 2) + 1 < nss) load_raw(((kt >> 2) + 1) & 1, (kt >> 2) + 1);
        cp_async_commit();
        if (live) tile_mma<P, MI, NJ>(acc, As[kt % S], Bs[kt & 1], kt * BK, Kd, live, wm, wn, lane);
        if (kt + 1 < nk) dequant((kt + 1) & 1, kt + 1);
    }
    cp_async_wait_all();
    tile_store<MI, NJ>(C, ldc, acc, r0, r1, n0 + wn, wm, N, lane);
}

// gemm_grouped's two tilings (mma.cuh GEMM64_ARGS, GEMM128_ARGS) without their k step: WM, WN, MI, NJ, S
#define GEMMQ64_ARGS 2, 4, 2, 4, 3
#define GEMMQ128_ARGS 2, 2, 4, 8, 3

#define STRATA_GEMM_Q(nm)                                                                                    \
    extern "C" __global__ void __launch_bounds__(GemmTile<GEMM64_ARGS>::THREADS)                             \
        gemm_q_##nm(float* C, int ldc, const half_t* A, int lda, const unsigned long long* ptrs,            \
                    const int* tiles, int N, int Kd) {                                                       \
        extern __shared__ __align__(16) unsigned char smem_raw[];                                            \
        gemm_q_tile<nm##_t, GEMMQ64_ARGS>(C, ldc, A, lda, ptrs, tiles, N, Kd, smem_raw);                     \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(GemmTile<GEMM128_ARGS>::THREADS)                            \
        gemm_q128_##nm(float* C, int ldc, const half_t* A, int lda, const unsigned long long* ptrs,         \
                       const int* tiles, int N, int Kd) {                                                    \
        extern __shared__ __align__(16) unsigned char smem_raw[];                                            \
        gemm_q_tile<nm##_t, GEMMQ128_ARGS>(C, ldc, A, lda, ptrs, tiles, N, Kd, smem_raw);                    \
    }

STRATA_GEMM_Q(q4_0)
STRATA_GEMM_Q(q4_1)
STRATA_GEMM_Q(q5_0)
STRATA_GEMM_Q(q5_1)
STRATA_GEMM_Q(q8_0)
STRATA_GEMM_Q(q2_0)
STRATA_GEMM_Q(iq4_nl)
STRATA_GEMM_Q(mxfp4)
STRATA_GEMM_Q(iq4_xs)
STRATA_GEMM_Q(q2_k)
STRATA_GEMM_Q(q3_k)
STRATA_GEMM_Q(q4_k)
STRATA_GEMM_Q(q5_k)
STRATA_GEMM_Q(q6_k)
STRATA_GEMM_Q(iq2_xxs)
STRATA_GEMM_Q(iq2_xs)
STRATA_GEMM_Q(iq2_s)
STRATA_GEMM_Q(iq3_xxs)
STRATA_GEMM_Q(iq3_s)
STRATA_GEMM_Q(iq1_s)
STRATA_GEMM_Q(iq1_m)
