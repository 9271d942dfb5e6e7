// A part's float32 weights stored as fp16 bits (dequant.cuh's rounding) or as float32: the dequantisation kernels'
// (dequant_kernels.cu) and the quantised GEMM's (gemm_q_kernels.cu) one store, so both give the same bits.
#pragma once

// float32 -> fp16 bits as f32_to_f16_bits (nearest even; NaN -> 0x7E00) by the cvt instruction: the same bits
// for every non-NaN value (cvt.rn is IEEE round-to-nearest-even, overflow to inf, f16 subnormals exact)
__device__ __forceinline__ uint16_t f16_bits_rn(float f) {
    unsigned short h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return f != f ? (uint16_t)0x7E00u : (uint16_t)h;
}

template <class Q>
__device__ __forceinline__ void store_part(const float* v, uint16_t* o) {
    if constexpr (Q::PART % 8 == 0) {
        STRATA_UNROLL
        for (int i = 0; i < Q::PART; i += 8) {
            uint4 w;
            w.x = f16_bits_rn(v[i + 0]) | ((uint32_t)f16_bits_rn(v[i + 1]) << 16);
            w.y = f16_bits_rn(v[i + 2]) | ((uint32_t)f16_bits_rn(v[i + 3]) << 16);
            w.z = f16_bits_rn(v[i + 4]) | ((uint32_t)f16_bits_rn(v[i + 5]) << 16);
            w.w = f16_bits_rn(v[i + 6]) | ((uint32_t)f16_bits_rn(v[i + 7]) << 16);
            *reinterpret_cast<uint4*>(o + i) = w;
        }
    } else {
        STRATA_UNROLL
        for (int i = 0; i < Q::PART; ++i) o[i] = f16_bits_rn(v[i]);
    }
}

template <class Q>
__device__ __forceinline__ void store_part(const float* v, float* o) {
    STRATA_UNROLL
    for (int i = 0; i < Q::PART; ++i) o[i] = v[i];
}
