// Exact dequantisers of every Strata weight type, one ggml block at a time, for CUDA (NVRTC/nvcc) and g++.
//
// Contract (docs/NUMERICS.md, kernels.py `dequant`): each weight is the float32 that strata.quants'
// numpy dequantiser computes (which mirrors ggml's dequantize_row_*: same operations, same order, no FMA),
// then rounded to fp16 by f32_to_f16_bits (nearest even). Every product and sum goes through fmul/fadd/fsub,
// which the device compiles to __fmul_rn/__fadd_rn/__fsub_rn: never contracted into an FMA, whatever -fmad
// says. Flushing subnormals (CuPy always passes -ftz=true to NVRTC) cannot change an fp16 result: every
// float32 computed here is 0 or >= 2^-126 in magnitude (multiples of 2^-27: fp16 scales times small
// fractions), except MXFP4's with scale exponent e < 2 (k·2^-128), which are a zero of the same sign in fp16
// flushed or not; F32/BF16 weights are moved as bits, never computed. The g++ twin flushes nothing.
//
// Each type `nm` gives dq_<nm>_part(block, p, y): PART weights p·PART.. of the block into y (the unit of work
// of one GPU thread), and dq_<nm>(block, y): the whole block (QK weights) = every part in order; nm_t is
// its traits struct for the kernel templates (dequant_kernels.cu). Offsets below are byte offsets in a block.
#pragma once

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef short int16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#else
#include <cstdint>
#include <cstring>
#endif

#if defined(__CUDACC__)
// device-only: the tables are __device__ arrays, which host code may not read (g++ builds the host twin)
#define STRATA_HD __device__ __forceinline__
#define STRATA_CONST static __device__ const
#define STRATA_UNROLL _Pragma("unroll")
#else
#define STRATA_HD inline
#define STRATA_CONST static const
#define STRATA_UNROLL
#endif

#include "iq_tables.cuh"

// --- bit-exact scalar helpers ------------------------------------------------------------------------------
STRATA_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

STRATA_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}

// IEEE float32 arithmetic, rounded to nearest, one rounding per operation (never fused)
#if defined(__CUDA_ARCH__)
STRATA_HD float fmul(float a, float b) { return __fmul_rn(a, b); }
STRATA_HD float fadd(float a, float b) { return __fadd_rn(a, b); }
STRATA_HD float fsub(float a, float b) { return __fsub_rn(a, b); }
#else
STRATA_HD float fmul(float a, float b) { return a * b; }
STRATA_HD float fadd(float a, float b) { return a + b; }
STRATA_HD float fsub(float a, float b) { return a - b; }
#endif

STRATA_HD float i2f(int32_t i) { return (float)i; }  // C's int -> float (exact for the small ints used here)

// little-endian loads by bytes: blocks sit at any byte offset (17-, 18-, 84-byte blocks)
STRATA_HD uint32_t ld_u16(const uint8_t* p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
STRATA_HD uint32_t ld_u32(const uint8_t* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }

// fp16 bits -> float32, exact: subnormals, infinities, NaN (payload kept)
STRATA_HD float f16_to_f32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {  // zero or subnormal: m·2^-24 is exact in float32
        const float v = (float)m * 5.9604644775390625e-08f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (e == 31) return bits_f32(sign | 0x7F800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// float32 -> fp16 bits, round to nearest even (= __float2half_rn on finite values and infinities, numpy's
// astype(float16)). Every NaN becomes the canonical 0x7E00: CUDA and x86 produce different NaN bits for the
// same float32 operation (inf·0), so only "NaN" can be exact, not its sign or payload.
STRATA_HD uint16_t f32_to_f16_bits(float f) {
    const uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return 0x7E00u;
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // |f| >= 65520 rounds to inf
    if (ax >= 0x38800000u) {                                   // normal half: |f| >= 2^-14
        uint32_t h = (ax >> 13) - (112u << 10);
        const uint32_t rest = ax & 0x1FFFu;
        h += (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ? 1u : 0u;  // a carry may reach the exponent
        return (uint16_t)(sign | h);
    }
    const uint32_t e = ax >> 23;  // subnormal half: round |f| / 2^-24 to an integer 0..1024
    if (e < 102) return (uint16_t)sign;  // |f| < 2^-25 (float32 subnormals included): rounds to zero
    const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u, shift = 126u - e;  // shift in 14..24
    uint32_t q = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += (rest > half || (rest == half && (q & 1u))) ? 1u : 0u;
    return (uint16_t)(sign | q);
}

STRATA_HD float f16_at(const uint8_t* p) { return f16_to_f32(ld_u16(p)); }

// ggml_e8m0_to_fp32_half: 2^(e-128) as float32 bits (e < 2 gives the subnormals 2^-128, 2^-127)
STRATA_HD float e8m0_half(uint32_t e) { return bits_f32(e < 2 ? (0x00200000u << e) : ((e - 1u) << 23)); }

#define STRATA_TYPE(nm, qk, size, part)                                                                      \
    struct nm##_t {                                                                                          \
        static constexpr int QK = qk, SIZE = size, PART = part;                                              \
        STRATA_HD static void dq_part(const uint8_t* b, int p, float* y) { dq_##nm##_part(b, p, y); }        \
    };                                                                                                       \
    STRATA_HD void dq_##nm(const uint8_t* b, float* y) {                                                     \
        for (int p = 0; p < (qk) / (part); ++p) dq_##nm##_part(b, p, y + p * (part));                        \
    }

#include "dequant_legacy.cuh"
#include "dequant_kquants.cuh"
#include "dequant_iquants.cuh"
