// CUDA dequantisation kernels: raw GGUF blocks -> fp16, exactly (dequant.cuh states the contract).
//
// Per type <nm> (the suffixes of dequant.cuh's STRATA_TYPE lines), two extern "C" kernels:
//   dequant_rows_<nm>(const unsigned long long* ptrs, int n_ptrs, int n_rows, int row_blocks, uint16_t* out)
//       for each g < n_ptrs: ptrs[g] is the device address of n_rows·row_blocks contiguous blocks (one
//       matrix, e.g. an expert blob); out [n_ptrs, n_rows, row_blocks·QK] fp16 bits. Grid: (x, n_ptrs).
//   dequant_<nm>(const uint8_t* src, long long n_blocks, uint16_t* out)
//       one matrix of n_blocks blocks -> out [n_blocks·QK] (dense weights at load). Grid: (x, 1).
//   dequant_f32_<nm>(const uint8_t* src, long long n_blocks, float* out)
//       the same, the float32 values unrounded (a prompt's embedding rows: the reference's exact f32).
// One thread per part (PART weights, 32 for block formats, 1 for F32/F16/BF16): consecutive threads write
// consecutive 64-byte pieces of out, as 16-byte stores (out must be 16-byte aligned). Grid x is a
// grid-stride loop.
#include "dequant.cuh"

template <class Q>
__device__ __forceinline__ void store_part(const float* v, uint16_t* o) {
    if constexpr (Q::PART % 8 == 0) {
        STRATA_UNROLL
        for (int i = 0; i < Q::PART; i += 8) {
            uint4 w;
            w.x = f32_to_f16_bits(v[i + 0]) | ((uint32_t)f32_to_f16_bits(v[i + 1]) << 16);
            w.y = f32_to_f16_bits(v[i + 2]) | ((uint32_t)f32_to_f16_bits(v[i + 3]) << 16);
            w.z = f32_to_f16_bits(v[i + 4]) | ((uint32_t)f32_to_f16_bits(v[i + 5]) << 16);
            w.w = f32_to_f16_bits(v[i + 6]) | ((uint32_t)f32_to_f16_bits(v[i + 7]) << 16);
            *reinterpret_cast<uint4*>(o + i) = w;
        }
    } else {
        STRATA_UNROLL
        for (int i = 0; i < Q::PART; ++i) o[i] = f32_to_f16_bits(v[i]);
    }
}

template <class Q>
__device__ __forceinline__ void store_part(const float* v, float* o) {
    STRATA_UNROLL
    for (int i = 0; i < Q::PART; ++i) o[i] = v[i];
}

// blocks [n_blocks] of type Q at src -> out [n_blocks·QK] (fp16 bits or float32), threads (blockIdx.x, threadIdx.x)
template <class Q, class O>
__device__ __forceinline__ void dequant_span(const uint8_t* src, long long n_blocks, O* out) {
    constexpr int PARTS = Q::QK / Q::PART;
    const long long n_parts = n_blocks * PARTS;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n_parts; t += stride) {
        const long long blk = t / PARTS;
        const int p = (int)(t - blk * PARTS);
        float v[Q::PART];
        Q::dq_part(src + blk * Q::SIZE, p, v);
        store_part<Q>(v, out + t * Q::PART);  // = blk·QK + p·PART
    }
}

#define STRATA_KERNELS(nm)                                                                                   \
    extern "C" __global__ void dequant_rows_##nm(const unsigned long long* ptrs, int n_ptrs, int n_rows,     \
                                                 int row_blocks, uint16_t* out) {                            \
        const int g = blockIdx.y;                                                                            \
        if (g >= n_ptrs) return;                                                                             \
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
