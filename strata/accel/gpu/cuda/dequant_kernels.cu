// CUDA dequantisation kernels: raw GGUF blocks -> fp16, exactly (dequant.cuh states the contract).
//
// Per type <nm> (the suffixes of dequant.cuh's STRATA_TYPE lines), two extern "C" kernels:
//   dequant_rows_<nm>(const unsigned long long* ptrs, int n_ptrs, int n_rows, int row_blocks, uint16_t* out)
//       for each g < n_ptrs: ptrs[g] is the device address of n_rows·row_blocks contiguous blocks (one
//       matrix, e.g. an expert blob; 0: none, out[g] left as it is); out [n_ptrs, n_rows, row_blocks·QK] fp16
//       bits. Grid: (x, n_ptrs).
//   dequant_<nm>(const uint8_t* src, long long n_blocks, uint16_t* out)
//       one matrix of n_blocks blocks -> out [n_blocks·QK] (dense weights at load). Grid: (x, 1).
//   dequant_f32_<nm>(const uint8_t* src, long long n_blocks, float* out)
//       the same, the float32 values unrounded (a prompt's embedding rows: the reference's exact f32).
// One thread per part (PART weights, 32 for block formats, 1 for F32/F16/BF16): consecutive threads write
// consecutive 64-byte pieces of out, as 16-byte stores (out must be 16-byte aligned). Grid x is a
// grid-stride loop over spans of DQ_THREADS parts; a span's blocks are first copied into shared memory by the
// CUDA block in 16-byte loads, and each thread dequantises its part from there. Read straight from global
// memory, a part was ~30 dependent byte loads a thread, and the kernel ran at ~1.5 TB/s on the H200
// (bench/results/h200/kdq_stop30.log: 133 us for 16 qwen3 Q4_K experts, ~60% of a 56-row group's expert time).
#include "dequant.cuh"
#include "dequant_store.cuh"

#define DQ_THREADS 256   // threads a CUDA block (strata/accel/gpu/dequant.py _THREADS)

// blocks [n_blocks] of type Q at src -> out [n_blocks·QK] (fp16 bits or float32), threads (blockIdx.x, threadIdx.x)
// of DQ_THREADS. A pass of the CUDA block takes BPS consecutive blocks (DQ_THREADS parts): their bytes, from the
// 16-byte boundary at or below the first to the one at or above the end, go to `raw` (an aligned 16-byte load
// never crosses a page, so reading the few bytes around the span is safe wherever src sits).
template <class Q, class O>
__device__ __forceinline__ void dequant_span(const uint8_t* src, long long n_blocks, O* out) {
    constexpr int PARTS = Q::QK / Q::PART;
    constexpr int BPS = DQ_THREADS / PARTS;                     // blocks a pass
    constexpr int RAW16 = (BPS * Q::SIZE + 15) / 16 + 1;        // 16-byte words a pass reads at most
    __shared__ uint4 raw[RAW16];
    const int tid = threadIdx.x;
    for (long long b0 = (long long)blockIdx.x * BPS; b0 < n_blocks; b0 += (long long)gridDim.x * BPS) {
        const int nb = (int)(n_blocks - b0 < BPS ? n_blocks - b0 : BPS);
        const uint8_t* s0 = src + b0 * Q::SIZE;
        const uint4* a0 = reinterpret_cast<const uint4*>(reinterpret_cast<unsigned long long>(s0) & ~15ull);
        const int head = (int)(s0 - reinterpret_cast<const uint8_t*>(a0));
        const int n16 = (head + nb * Q::SIZE + 15) / 16;
        for (int i = tid; i < n16; i += DQ_THREADS) raw[i] = a0[i];
        __syncthreads();
        const int blk = tid / PARTS, p = tid - blk * PARTS;
        if (blk < nb) {
            float v[Q::PART];
            Q::dq_part(reinterpret_cast<const uint8_t*>(raw) + head + blk * Q::SIZE, p, v);
            store_part<Q>(v, out + (b0 * PARTS + tid) * Q::PART);  // part t of the span = blk·QK + p·PART
        }
        __syncthreads();                                        // raw is rewritten by the next pass
    }
}

#define STRATA_KERNELS(nm)                                                                                   \
    extern "C" __global__ void dequant_rows_##nm(const unsigned long long* ptrs, int n_ptrs, int n_rows,     \
                                                 int row_blocks, uint16_t* out) {                            \
        const int g = blockIdx.y;                                                                            \
        if (g >= n_ptrs || !ptrs[g]) return;    /* 0: a member that takes expert_rows (presync.py) */      \
        const long long n_blocks = (long long)n_rows * row_blocks;                                           \
        dequant_span<nm##_t>(reinterpret_cast<const uint8_t*>(ptrs[g]), n_blocks,                            \
                             out + (long long)g * n_blocks * nm##_t::QK);                                    \
    }                                                                                                        \
    extern "C" __global__ void dequant_##nm(const uint8_t* src, long long n_blocks, uint16_t* out) {         \
        dequant_span<nm##_t>(src, n_blocks, out);                                                            \
    }                                                                                                        \
    extern "C" __global__ void dequant_f32_##nm(const uint8_t* src, long long n_blocks, float* out) {        \
        dequant_span<nm##_t>(src, n_blocks, out);                                                            \
    }

STRATA_KERNELS(f32)
STRATA_KERNELS(f16)
STRATA_KERNELS(bf16)
STRATA_KERNELS(q4_0)
STRATA_KERNELS(q4_1)
STRATA_KERNELS(q5_0)
STRATA_KERNELS(q5_1)
STRATA_KERNELS(q8_0)
STRATA_KERNELS(q2_0)
STRATA_KERNELS(iq4_nl)
STRATA_KERNELS(mxfp4)
STRATA_KERNELS(iq4_xs)
STRATA_KERNELS(q2_k)
STRATA_KERNELS(q3_k)
STRATA_KERNELS(q4_k)
STRATA_KERNELS(q5_k)
STRATA_KERNELS(q6_k)
STRATA_KERNELS(iq2_xxs)
STRATA_KERNELS(iq2_xs)
STRATA_KERNELS(iq2_s)
STRATA_KERNELS(iq3_xxs)
STRATA_KERNELS(iq3_s)
STRATA_KERNELS(iq1_s)
STRATA_KERNELS(iq1_m)
