// Grid i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (strata.quants.iquants / iq1, ggml
// dequantize_row_iq*), 256 weights per block; part p = weights 32p..32p+31 (part of dequant.cuh).
// Signed grids: y = (db·f(grid byte))·(neg ? -1 : 1); negation is exact, so it is written as -v.
#pragma once

STRATA_HD uint32_t byte_of(uint64_t word, int j) { return (uint32_t)(word >> (8 * j)) & 0xFFu; }

// IQ2_XXS, IQ2_XS, IQ2_S: db = (d·(0.5f + f(ls)))·0.25f
STRATA_HD float db_iq2(float d, uint32_t ls) { return fmul(fmul(d, fadd(0.5f, i2f(ls))), 0.25f); }

// 8 weights of grid row `g` with the sign bits of `signs` (bit j = weight j negative)
STRATA_HD void signed8(float db, uint64_t g, uint32_t signs, float* y) {
    STRATA_UNROLL
    for (int j = 0; j < 8; ++j) {
        const float v = fmul(db, i2f(byte_of(g, j)));
        y[j] = ((signs >> j) & 1u) ? -v : v;
    }
}

// IQ2_XXS: fp16 d @0 | per 32 weights p: 8 bytes @2+8p = grid indices[4] | u32 a1 (4 × 7-bit ksigns
// indices, ls = a1 >> 28)
STRATA_HD void dq_iq2_xxs_part(const uint8_t* b, int p, float* y) {
    const uint8_t* q = b + 2 + 8 * p;
    const uint32_t a1 = ld_u32(q + 4);
    const float db = db_iq2(f16_at(b), a1 >> 28);
    STRATA_UNROLL
    for (int k = 0; k < 4; ++k) {
        signed8(db, iq2xxs_grid[q[k]], ksigns_iq2xs[(a1 >> (7 * k)) & 127u], y + 8 * k);
    }
}
STRATA_TYPE(iq2_xxs, 256, 2 + 2 * 32, 32)

// IQ2_XS: fp16 d @0 | u16 qs[32] @2 (9-bit grid index | ksigns index << 9) | scales[8] @66: the 16 weights
// of sub-block s have ls = nibble s%2 of scales[s/2]
STRATA_HD void dq_iq2_xs_part(const uint8_t* b, int p, float* y) {
    const float d = f16_at(b);
    STRATA_UNROLL
    for (int k = 0; k < 4; ++k) {
        const uint32_t q = ld_u16(b + 2 + 2 * (4 * p + k));
        const float db = db_iq2(d, (b[66 + p] >> (4 * (k >> 1))) & 0xFu);
        signed8(db, iq2xs_grid[q & 511u], ksigns_iq2xs[q >> 9], y + 8 * k);
    }
}
STRATA_TYPE(iq2_xs, 256, 2 + 2 * 32 + 8, 32)

// IQ2_S: fp16 d @0 | qs[32] @2 | signs[32] @34 | qh[8] @66 | scales[8] @74. Group k (8 weights): grid index
// qs[k] | ((qh[k/4] >> 2(k%4)) & 3) << 8 into iq2s_grid, sign bits signs[k]; ls as IQ2_XS
STRATA_HD void dq_iq2_s_part(const uint8_t* b, int p, float* y) {
    const float d = f16_at(b);
    STRATA_UNROLL
    for (int k = 0; k < 4; ++k) {
        const int g = 4 * p + k;
        const uint32_t idx = b[2 + g] | (((uint32_t)(b[66 + p] >> (2 * k)) & 3u) << 8);
        const float db = db_iq2(d, (b[74 + p] >> (4 * (k >> 1))) & 0xFu);
        signed8(db, iq2s_grid[idx], b[34 + g], y + 8 * k);
    }
}
STRATA_TYPE(iq2_s, 256, 2 + 32 + 32 + 8 + 8, 32)

// IQ3_XXS: fp16 d @0 | qs[64] @2 (iq3xxs_grid indices, 4 weights each) | u32 aux[8] @66 (per 32 weights:
// 4 × 7-bit ksigns indices for 8 weights each | ls << 28). db = (d·(0.5f + f(ls)))·0.5f
STRATA_HD void dq_iq3_xxs_part(const uint8_t* b, int p, float* y) {
    const uint32_t aux = ld_u32(b + 66 + 4 * p);
    const float db = fmul(fmul(f16_at(b), fadd(0.5f, i2f(aux >> 28))), 0.5f);
    STRATA_UNROLL
    for (int k = 0; k < 4; ++k) {
        const uint32_t signs = ksigns_iq2xs[(aux >> (7 * k)) & 127u];
        const uint8_t* q = b + 2 + 8 * p + 2 * k;  // the two grid rows of group k
        const uint64_t g = iq3xxs_grid[q[0]] | ((uint64_t)iq3xxs_grid[q[1]] << 32);
        signed8(db, g, signs, y + 8 * k);
    }
}
STRATA_TYPE(iq3_xxs, 256, 2 + 64 + 32, 32)

// IQ3_S: fp16 d @0 | qs[64] @2 | qh[8] @66 | signs[32] @74 | scales[4] @106. Index i (4 weights) into
// iq3s_grid = qs[i] | bit i%8 of qh[i/8] << 8; sign bits as IQ2_S; ls = nibble p%2 of scales[p/2];
// db = d·f(1 + 2·ls)
STRATA_HD void dq_iq3_s_part(const uint8_t* b, int p, float* y) {
    const uint32_t ls = (b[106 + (p >> 1)] >> (4 * (p & 1))) & 0xFu;
    const float db = fmul(f16_at(b), i2f(1 + 2 * (int32_t)ls));
    const uint32_t qh = b[66 + p];
    STRATA_UNROLL
    for (int k = 0; k < 4; ++k) {
        const int i0 = 2 * k, i1 = 2 * k + 1;  // the two grid rows of group k within the part
        const uint64_t g = iq3s_grid[b[2 + 8 * p + i0] | (((qh >> i0) & 1u) << 8)] |
                           ((uint64_t)iq3s_grid[b[2 + 8 * p + i1] | (((qh >> i1) & 1u) << 8)] << 32);
        signed8(db, g, b[74 + 4 * p + k], y + 8 * k);
    }
}
STRATA_TYPE(iq3_s, 256, 2 + 64 + 8 + 32 + 4, 32)

// IQ1_S, IQ1_M: y = (d·f(2l + 1))·(f(grid) + delta), grid values in {-1, 0, 1}, delta = ±0.125f (IQ1S_DELTA)
STRATA_HD void iq1_8(float dl, uint64_t g, bool neg_delta, float* y) {
    const float delta = neg_delta ? -0.125f : 0.125f;
    STRATA_UNROLL
    for (int j = 0; j < 8; ++j) y[j] = fmul(dl, fadd(i2f((int8_t)byte_of(g, j)), delta));
}

// IQ1_S: fp16 d @0 | qs[32] @2 | u16 qh[8] @34. Part p, group k (8 weights): row qs[4p + k] |
// ((qh[p] >> 3k) & 7) << 8; l = (qh[p] >> 12) & 7; bit 15 of qh[p] = delta sign
STRATA_HD void dq_iq1_s_part(const uint8_t* b, int p, float* y) {
    const uint32_t qh = ld_u16(b + 34 + 2 * p);
    const float dl = fmul(f16_at(b), i2f(2 * (int32_t)((qh >> 12) & 7u) + 1));
    STRATA_UNROLL
    for (int k = 0; k < 4; ++k) {
        const uint32_t row = b[2 + 4 * p + k] | (((qh >> (3 * k)) & 7u) << 8);
        iq1_8(dl, iq1s_grid[row], (qh & 0x8000u) != 0, y + 8 * k);
    }
}
STRATA_TYPE(iq1_s, 256, 2 + 32 + 2 * 8, 32)

// IQ1_M: qs[32] @0 | qh[16] @32 | u16 sc[4] @48, d's fp16 bits = the top nibbles of sc[0..3]. Group k:
// nibble k%2 of qh[k/2] = top 3 index bits | delta sign << 3; sub-block s (16 weights) has
// l = (sc[s/4] >> 3(s%4)) & 7
STRATA_HD void dq_iq1_m_part(const uint8_t* b, int p, float* y) {
    const uint32_t s0 = ld_u16(b + 48), s1 = ld_u16(b + 50), s2 = ld_u16(b + 52), s3 = ld_u16(b + 54);
    const float d = f16_to_f32((s0 >> 12) | ((s1 >> 8) & 0xF0u) | ((s2 >> 4) & 0xF00u) | (s3 & 0xF000u));
    const uint32_t sc = ld_u16(b + 48 + 2 * (p >> 1));
    STRATA_UNROLL
    for (int k = 0; k < 4; ++k) {
        const int s = 2 * p + (k >> 1), g = 4 * p + k;
        const float dl = fmul(d, i2f(2 * (int32_t)((sc >> (3 * (s & 3))) & 7u) + 1));
        const uint32_t nib = (b[32 + (g >> 1)] >> (4 * (g & 1))) & 0xFu;
        iq1_8(dl, iq1s_grid[b[g] | ((nib & 7u) << 8)], (nib & 8u) != 0, y + 8 * k);
    }
}
STRATA_TYPE(iq1_m, 256, 32 + 16 + 8, 32)
