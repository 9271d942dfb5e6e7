// Float types, the 32-weight legacy formats, Q2_0 and the 4-bit lookup formats (part of dequant.cuh).
// Each function names the strata.quants class and ggml function it mirrors; "f(i)" is int -> float.
#pragma once

// --- F32, F16, BF16: one weight per block (strata.quants.floats) -------------------------------------------
STRATA_HD void dq_f32_part(const uint8_t* b, int, float* y) { y[0] = bits_f32(ld_u32(b)); }
STRATA_HD void dq_f16_part(const uint8_t* b, int, float* y) { y[0] = f16_to_f32(ld_u16(b)); }
STRATA_HD void dq_bf16_part(const uint8_t* b, int, float* y) { y[0] = bits_f32(ld_u16(b) << 16); }
STRATA_TYPE(f32, 1, 4, 1)
STRATA_TYPE(f16, 1, 2, 1)
STRATA_TYPE(bf16, 1, 2, 1)

// --- legacy: block_q4_0 .. block_q8_0, dequantize_row_q*_0/1 ----------------------------------------------
// code j of a 16-byte nibble array: low nibbles are weights 0..15, high nibbles weights 16..31
STRATA_HD uint32_t nib32(const uint8_t* qs, int j) { return j < 16 ? (qs[j] & 0xFu) : (qs[j - 16] >> 4); }

// 5-bit code j of Q5_0/Q5_1: nibble j | bit j of qh << 4
STRATA_HD int32_t q5(const uint8_t* qs, uint32_t qh, int j) {
    return (int32_t)(nib32(qs, j) | (((qh >> j) & 1u) << 4));
}

// Q4_0: fp16 d @0 | qs[16] @2; y = f(q - 8)·d
STRATA_HD void dq_q4_0_part(const uint8_t* b, int, float* y) {
    const float d = f16_at(b);
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fmul(i2f((int32_t)nib32(b + 2, j) - 8), d);
}

// Q4_1: fp16 d @0 | fp16 m @2 | qs[16] @4; y = f(q)·d + m
STRATA_HD void dq_q4_1_part(const uint8_t* b, int, float* y) {
    const float d = f16_at(b), m = f16_at(b + 2);
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fadd(fmul(i2f((int32_t)nib32(b + 4, j)), d), m);
}

// Q5_0: fp16 d @0 | u32 qh @2 (bit j = 5th bit of weight j) | qs[16] @6; y = f(q - 16)·d
STRATA_HD void dq_q5_0_part(const uint8_t* b, int, float* y) {
    const float d = f16_at(b);
    const uint32_t qh = ld_u32(b + 2);
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fmul(i2f(q5(b + 6, qh, j) - 16), d);
}

// Q5_1: fp16 d @0 | fp16 m @2 | u32 qh @4 | qs[16] @8; y = f(q)·d + m
STRATA_HD void dq_q5_1_part(const uint8_t* b, int, float* y) {
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint32_t qh = ld_u32(b + 4);
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fadd(fmul(i2f(q5(b + 8, qh, j)), d), m);
}

// Q8_0: fp16 d @0 | int8 qs[32] @2; y = f(qs)·d
STRATA_HD void dq_q8_0_part(const uint8_t* b, int, float* y) {
    const float d = f16_at(b);
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fmul(i2f((int8_t)b[2 + j]), d);
}

STRATA_TYPE(q4_0, 32, 2 + 16, 32)
STRATA_TYPE(q4_1, 32, 2 + 2 + 16, 32)
STRATA_TYPE(q5_0, 32, 2 + 4 + 16, 32)
STRATA_TYPE(q5_1, 32, 2 + 2 + 4 + 16, 32)
STRATA_TYPE(q8_0, 32, 2 + 32, 32)

// Q2_0 (strata.quants.q2_0, dequantize_row_q2_0): fp16 d @0 | qs[16] @2, code j = (qs[j/4] >> 2(j%4)) & 3;
// y = f(code - 1)·d. Part p = weights 32p..32p+31.
STRATA_HD void dq_q2_0_part(const uint8_t* b, int p, float* y) {
    const float d = f16_at(b);
    const uint8_t* qs = b + 2 + 8 * p;
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fmul(i2f((int32_t)((qs[j >> 2] >> (2 * (j & 3))) & 3u) - 1), d);
}
STRATA_TYPE(q2_0, 64, 2 + 16, 32)

// --- 4-bit lookups (strata.quants.iq4) --------------------------------------------------------------------
// IQ4_NL (dequantize_row_iq4_nl): fp16 d @0 | qs[16] @2; y = d·f(kvalues_iq4nl[q])
STRATA_HD void dq_iq4_nl_part(const uint8_t* b, int, float* y) {
    const float d = f16_at(b);
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fmul(d, i2f(kvalues_iq4nl[nib32(b + 2, j)]));
}
STRATA_TYPE(iq4_nl, 32, 2 + 16, 32)

// MXFP4 (dequantize_row_mxfp4): E8M0 e @0 | qs[16] @1; y = f(kvalues_mxfp4[q])·2^(e-128)
STRATA_HD void dq_mxfp4_part(const uint8_t* b, int, float* y) {
    const float d = e8m0_half(b[0]);
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fmul(i2f(kvalues_mxfp4[nib32(b + 1, j)]), d);
}
STRATA_TYPE(mxfp4, 32, 1 + 16, 32)

// IQ4_XS (dequantize_row_iq4_xs): fp16 d @0 | u16 scales_h @2 | scales_l[4] @4 | qs[128] @8. Sub-block p
// (32 weights): ls = nibble (p%2) of scales_l[p/2] | ((scales_h >> 2p) & 3) << 4; codes = nibbles of
// qs[16p..16p+16]; y = (d·f(ls - 32))·f(kvalues_iq4nl[q]).
STRATA_HD void dq_iq4_xs_part(const uint8_t* b, int p, float* y) {
    const uint32_t low = (b[4 + (p >> 1)] >> (4 * (p & 1))) & 0xFu, high = (ld_u16(b + 2) >> (2 * p)) & 3u;
    const uint32_t ls = low | (high << 4);
    const float dl = fmul(f16_at(b), i2f((int32_t)ls - 32));
    STRATA_UNROLL
    for (int j = 0; j < 32; ++j) y[j] = fmul(dl, i2f(kvalues_iq4nl[nib32(b + 8 + 16 * p, j)]));
}
STRATA_TYPE(iq4_xs, 256, 2 + 2 + 4 + 128, 32)
