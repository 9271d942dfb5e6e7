// Tensor-core pieces: PTX wrappers for m16n8k16 MMAs, ldmatrix and cp.async (sm_80+), used by the prompt's
// attention (attn_kernels.cu), and the experts' grouped GEMM tile (engine_kernels.cu gemm_grouped_mma and
// gemm_grouped_mma128), templated on its warp grid, warp tile, k step and pipeline depth.
#pragma once
#include "common.cuh"

__device__ __forceinline__ void mma16816(float* c, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 s;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(p));
    return s;
}

// 16 bytes global -> shared, bypassing L1; ok == false writes zeros (src-size 0) and reads nothing
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void ldmatrix_x4(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// the same with each 8x8 matrix transposed: B fragments of a row-major [k][n] tile (attention's V)
__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// wait until at most S - 2 of this thread's cp.async groups are in flight (the oldest of S stages has landed)
template <int S>
__device__ __forceinline__ void cp_async_wait_stages() { asm volatile("cp.async.wait_group %0;" ::"n"(S - 2)); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;"); }

// ---- the experts' grouped GEMM --------------------------------------------------------------------------------
// For each tile (g, r0, r1) = tiles[blockIdx.x]: C[r0:r1, n0:n0+BN] = A[r0:r1, :Kd] · W[g][n0:n0+BN, :Kd]^T, A fp16
// [R, Kd] (lda), W fp16 [G, N, Kd], C fp32 (ldc), n0 = blockIdx.y·BN. WM x WN warps, each a (16·MI) x (8·NJ) tile of
// m16n8k16 MMAs fed by ldmatrix; a k step of BK halves a stage, S stages of cp.async in flight, one barrier a step.
// Each output is one fixed-order sum: the MMAs of its row and column in ascending k16 steps into one fp32
// accumulator, whatever the tiling, so the result depends only on its rows and W[g] (residency-invariant), and every
// instantiation gives the same bits (bench/gemm_kernel.py and test_gemm_mma128_gives_mma_bits check it).
// Legend: R rows, G experts, N output columns, Kd the inner size (a multiple of 16).
template <int WM, int WN, int MI, int NJ, int BK_, int S>
struct GemmTile {
    static constexpr int BM = WM * 16 * MI, BN = WN * 8 * NJ, THREADS = WM * WN * 32, BK = BK_;
    static constexpr int LD = BK + 8;      // halves a smem row: rows 16 bytes past a multiple of 128, so ldmatrix's
                                           // 8 rows fall on distinct banks
    static constexpr int CH = BK_ / 8;     // 16-byte chunks of a row a stage
    static constexpr int NA = BM * CH / THREADS, NB = BN * CH / THREADS;     // chunks a thread loads a stage
    static constexpr int SMEM = S * (BM + BN) * LD * 2;                     // dynamic shared memory, bytes
};

// A tile's A rows r0..r1 staged a k step at a time: chunk c = tid + i·THREADS of a stage is row c / CH, halves
// (c % CH)·8.. of it; rows past r1 and halves past Kd load zeros and read nothing
template <class P>
struct ARows {
    const half_t* src[P::NA];
    bool ok[P::NA];

    __device__ __forceinline__ ARows(const half_t* A, int lda, int r0, int r1, int tid) {
#pragma unroll
        for (int i = 0; i < P::NA; i++) {
            const int c = tid + i * P::THREADS, r = r0 + c / P::CH;
            ok[i] = r < r1;
            src[i] = A + (long long)(ok[i] ? r : r0) * lda + (c % P::CH) * 8;
        }
    }

    __device__ __forceinline__ void load(half_t (*as)[P::LD], int kt, int Kd, int tid) const {
        const int k0 = kt * P::BK;
#pragma unroll
        for (int i = 0; i < P::NA; i++) {
            const int c = tid + i * P::THREADS, k = k0 + (c % P::CH) * 8;
            cp_async16(&as[c / P::CH][(c % P::CH) * 8], src[i] + (k < Kd ? k0 : 0), ok[i] && k < Kd);
        }
    }
};

template <int MI, int NJ>
__device__ __forceinline__ void tile_zero(float (*acc)[NJ][4]) {
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
}

// One k step's MMAs of a warp: its (16·MI) x (8·NJ) tile from stage tiles as [BM][LD] (A rows) and bs [BN][LD]
// (W rows), the k16 steps in ascending order, none at or past Kd (k0: the step's first k; a last stage past Kd
// makes no MMA of zeros, so a tail changes no sum). live: this warp's m16 blocks holding rows (warp-uniform;
// skipping a row block changes no other output).
template <class P, int MI, int NJ>
__device__ __forceinline__ void tile_mma(float (*acc)[NJ][4], const half_t (*as)[P::LD], const half_t (*bs)[P::LD],
                                         int k0, int Kd, int live, int wm, int wn, int lane) {
    static_assert(NJ % 2 == 0, "B fragments come two n8 blocks a ldmatrix");
    const int br = (lane & 7) + (lane >> 4) * 8, bc = ((lane >> 3) & 1) * 8;   // ldmatrix rows of the W fragments
#pragma unroll
    for (int kk = 0; kk < P::BK; kk += 16) {
        if (k0 + kk >= Kd) break;
        u32 a[MI][4], b[NJ][2];
#pragma unroll
        for (int i = 0; i < MI; i++) ldmatrix_x4(a[i], &as[wm + i * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
        for (int j = 0; j < NJ; j += 2) {
            u32 r[4];
            ldmatrix_x4(r, &bs[wn + j * 8 + br][kk + bc]);
            b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < MI; i++)
            if (i < live)
#pragma unroll
                for (int j = 0; j < NJ; j++) mma16816(acc[i][j], a[i], b[j]);
    }
}

// A warp's accumulators to C: rows r0 + wm.. below r1, columns c0.. below N (the m16n8 accumulator holds rows
// gid, gid + 8 and columns 2·t4, +1)
template <int MI, int NJ>
__device__ __forceinline__ void tile_store(float* C, int ldc, float (*acc)[NJ][4], int r0, int r1, int c0,
                                           int wm, int N, int lane) {
    const int gid = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int n = c0 + j * 8 + t4 * 2;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = r0 + wm + i * 16 + gid + h * 8;
                if (r < r1) {
                    if (n < N) C[(long long)r * ldc + n] = acc[i][j][2 * h];
                    if (n + 1 < N) C[(long long)r * ldc + n + 1] = acc[i][j][2 * h + 1];
                }
            }
        }
}

template <int WM, int WN, int MI, int NJ, int BK, int S>
__device__ __forceinline__ void gemm_tile(float* C, int ldc, const half_t* A, int lda, const half_t* W,
                                          const int* tiles, int N, int Kd, unsigned char* smem) {
    using P = GemmTile<WM, WN, MI, NJ, BK, S>;
    constexpr int LD = P::LD;
    static_assert(P::BM * P::CH % P::THREADS == 0 && P::BN * P::CH % P::THREADS == 0, "whole loader passes");
    half_t(*As)[P::BM][LD] = reinterpret_cast<half_t(*)[P::BM][LD]>(smem);                 // [S][BM][LD]
    half_t(*Bs)[P::BN][LD] = reinterpret_cast<half_t(*)[P::BN][LD]>(smem + S * P::BM * LD * 2);   // [S][BN][LD]
    const int g = tiles[3 * blockIdx.x], r0 = tiles[3 * blockIdx.x + 1], r1 = tiles[3 * blockIdx.x + 2];
    if (r0 >= r1) return;                       // an empty tile: a grid past the device's tiles (presync.py)
    const int n0 = blockIdx.y * P::BN;
    const half_t* Wg = W + (long long)g * N * Kd;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = (warp / WN) * 16 * MI, wn = (warp % WN) * 8 * NJ;
    const int live = min(MI, max(0, (r1 - r0 - wm + 15) >> 4));     // this warp's m16 blocks holding rows
    // loads: A's as ARows; W's chunk c = tid + i·THREADS of a stage is row c / CH, halves (c % CH)·8.. of it, rows
    // past N and halves past Kd loading zeros and reading nothing
    const ARows<P> arows(A, lda, r0, r1, tid);
    const half_t* bsrc[P::NB];
    bool bok[P::NB];
#pragma unroll
    for (int i = 0; i < P::NB; i++) {
        const int c = tid + i * P::THREADS, n = n0 + c / P::CH;
        bok[i] = n < N;
        bsrc[i] = Wg + (long long)(bok[i] ? n : 0) * Kd + (c % P::CH) * 8;
    }
    const int nk = (Kd + BK - 1) / BK;
    auto load = [&](int stage, int kt) {
        const int k0 = kt * BK;
        arows.load(As[stage], kt, Kd, tid);
#pragma unroll
        for (int i = 0; i < P::NB; i++) {
            const int c = tid + i * P::THREADS, k = k0 + (c % P::CH) * 8;
            cp_async16(&Bs[stage][c / P::CH][(c % P::CH) * 8], bsrc[i] + (k < Kd ? k0 : 0), bok[i] && k < Kd);
        }
    };
    float acc[MI][NJ][4];
    tile_zero<MI, NJ>(acc);
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < nk) load(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait_stages<S>();
        __syncthreads();     // stage kt landed for every thread; every warp is done with stage kt - 1
        if (kt + S - 1 < nk) load((kt + S - 1) % S, kt + S - 1);
        cp_async_commit();
        if (live) tile_mma<P, MI, NJ>(acc, As[kt % S], Bs[kt % S], kt * BK, Kd, live, wm, wn, lane);
    }
    cp_async_wait_all();
    tile_store<MI, NJ>(C, ldc, acc, r0, r1, n0 + wn, wm, N, lane);
}

// the two instantiations' parameters (cuda_experts.py GemmLaunch reads their threads and shared memory):
// 64-row tiles, 8 warps (2 x 4) of 32x32; 128-row tiles, 4 warps (2 x 2) of 64x64; both a k step of 64 in 3 stages
#define GEMM64_ARGS 2, 4, 2, 4, 64, 3
#define GEMM128_ARGS 2, 2, 4, 8, 64, 3
