// Tensor-core pieces of the prompt experts' grouped GEMMs (engine_kernels.cu gemm_grouped_mma and
// gemm_grouped_mma128): the block tiles, PTX wrappers for m16n8k16 MMAs, ldmatrix and cp.async (sm_80+), and the
// per-warp fragment, MMA and store steps, templated on the m16 row blocks a warp holds (MI).
#pragma once
#include "common.cuh"

#define BM 64
#define BN 128
#define BK 32
#define PAD 8          // halves after each 32-half smem row: rows 80 bytes apart, so ldmatrix's 8 rows hit 32 banks
#define STAGES 3
#define LDS (BK + PAD)
#define MMA_THREADS 128  // 4 warps (2 x 2), each a 32x64 tile of the 64x128 block tile
#define BM_BIG 128       // gemm_grouped_mma128: 4 warps (2 x 2), each a 64x64 tile of a 128x128 block tile
#define STAGES_BIG 4     // its pipeline depth (dynamic shared memory: STAGES_BIG x (BM_BIG + BN) x LDS halves)

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

// The A operand's loader: a stage is the tile's ROWS rows x BK halves in 16-byte chunks by cp.async; thread tid
// takes chunk tid & 3 of rows tid >> 2, + 32, ... (ROWS / 32 rows). Rows past r1 load zeros (and read nothing).
template <int ROWS>
struct ALoader {
    const half_t* src[ROWS / 32];
    bool ok[ROWS / 32];
    int lr, lc;
    __device__ __forceinline__ ALoader(const half_t* A, int lda, int r0, int r1, int tid)
        : lr(tid >> 2), lc((tid & 3) * 8) {
#pragma unroll
        for (int i = 0; i < ROWS / 32; i++) {
            const int r = r0 + lr + 32 * i;
            ok[i] = r < r1;
            src[i] = A + (long long)(ok[i] ? r : r0) * lda + lc;
        }
    }
    __device__ __forceinline__ void load(half_t (*As)[LDS], int k0) const {
#pragma unroll
        for (int i = 0; i < ROWS / 32; i++) cp_async16(&As[lr + 32 * i][lc], src[i] + k0, ok[i]);
    }
};

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// wait until at most S - 2 of this thread's cp.async groups are in flight (the oldest of S stages has landed)
template <int S>
__device__ __forceinline__ void cp_async_wait_stages() { asm volatile("cp.async.wait_group %0;" ::"n"(S - 2)); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;"); }

// A warp's accumulators: MI m16 row blocks x 8 n8 column blocks (MI = 2: a 32x64 warp tile, 4: 64x64)
template <int MI>
__device__ __forceinline__ void zero_acc(float (*acc)[8][4]) {
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
}

// the A operand's fragments for k16 step kk: rows wm..wm+16·MI-1 of the smem tile (MI m16 blocks)
template <int MI, int LDA>
__device__ __forceinline__ void frag_a(u32 (*a)[4], const half_t (*As)[LDA], int wm, int kk, int lane) {
#pragma unroll
    for (int i = 0; i < MI; i++) ldmatrix_x4(a[i], &As[wm + i * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
}

// the W operand's fragments for k16 step kk: smem rows wn..wn+63 (eight n8 blocks, two per ldmatrix)
__device__ __forceinline__ void frag_b(u32 (*b)[2], const half_t (*Bs)[LDS], int wn, int kk, int lane) {
    const int br = (lane & 7) + (lane >> 4) * 8, bc = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        u32 r[4];
        ldmatrix_x4(r, &Bs[wn + j * 8 + br][kk + bc]);
        b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
    }
}

// acc[i][j] += the warp's (16·MI)x64 tile over one BK step: ascending k16 steps, the fixed order every output
// keeps. Row blocks i >= live (no row of the tile there) are skipped: a warp-uniform bound, and skipping them
// changes no other output.
template <int MI>
__device__ __forceinline__ void mma_step(float (*acc)[8][4], const half_t (*As)[LDS], const half_t (*Bs)[LDS],
                                         int wm, int wn, int lane, int live = MI) {
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        u32 a[MI][4], b[8][2];
        frag_a<MI, LDS>(a, As, wm, kk, lane);
        frag_b(b, Bs, wn, kk, lane);
#pragma unroll
        for (int i = 0; i < MI; i++)
            if (i < live)
#pragma unroll
                for (int j = 0; j < 8; j++) mma16816(acc[i][j], a[i], b[j]);
    }
}

// C[r, n] = acc for the warp's rows r < r1 and columns n < N (fp32, row stride ldc)
template <int MI>
__device__ __forceinline__ void store_acc(float* C, int ldc, const float (*acc)[8][4], int rw, int r1, int nw, int N,
                                          int lane) {
    const int gid = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int n = nw + j * 8 + t4 * 2;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = rw + i * 16 + gid + h * 8;
                if (r < r1) {
                    if (n < N) C[(long long)r * ldc + n] = acc[i][j][2 * h];
                    if (n + 1 < N) C[(long long)r * ldc + n + 1] = acc[i][j][2 * h + 1];
                }
            }
        }
}
