// K-quants Q2_K..Q6_K (strata.quants.kquants, ggml dequantize_row_q*_K), 256 weights per block; part p =
// weights 32p..32p+31 (part of dequant.cuh). Weight w = 128n + 32j + m where a layout splits it so.
#pragma once

// Q2_K: scales[16] @0 | qs[64] @16 | fp16 d @80 | fp16 dmin @82. Sub-block s = w/16 has byte
// scales[s] = min << 4 | scale; code(w = 128n + 32j + m) = (qs[32n + m] >> 2j) & 3.
// y = (d·f(scale))·f(code) - dmin·f(min)
STRATA_HD void dq_q2_k_part(const uint8_t* b, int p, float* y) {
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    const uint8_t* qs = b + 16 + 32 * (p >> 2);
    const int shift = 2 * (p & 3);
    STRATA_UNROLL
    for (int h = 0; h < 2; ++h) {  // the two 16-weight sub-blocks of the part
        const uint32_t sc = b[2 * p + h];
        const float dl = fmul(d, i2f(sc & 0xFu)), ml = fmul(dmin, i2f(sc >> 4));
        STRATA_UNROLL
        for (int m = 16 * h; m < 16 * h + 16; ++m) y[m] = fsub(fmul(dl, i2f((qs[m] >> shift) & 3u)), ml);
    }
}
STRATA_TYPE(q2_k, 256, 16 + 64 + 2 + 2, 32)

// Q3_K: hmask[32] @0 | qs[64] @32 | scales[12] @96 | fp16 d @108. For w = 128n + 32j + m:
// q = ((qs[32n + m] >> 2j) & 3) - (bit 4n + j of hmask[m] ? 0 : 4). Scale i (16 weights), 6 bits stored + 32:
//   low 4 bits = nibble i/8 of scales[i%8], high 2 bits = bits 2(i/4).. of scales[8 + i%4].
// y = (d·f(scale - 32))·f(q)
STRATA_HD void dq_q3_k_part(const uint8_t* b, int p, float* y) {
    const float d = f16_at(b + 108);
    const uint8_t* qs = b + 32 + 32 * (p >> 2);
    const uint8_t* sc = b + 96;
    const int shift = 2 * (p & 3);  // j = p % 4, n = p / 4, so 4n + j = p
    STRATA_UNROLL
    for (int h = 0; h < 2; ++h) {
        const int i = 2 * p + h;
        const uint32_t low = (sc[i & 7] >> (4 * (i >> 3))) & 0xFu;
        const uint32_t high = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3u;
        const uint32_t s6 = low | (high << 4);
        const float dl = fmul(d, i2f((int32_t)s6 - 32));
        STRATA_UNROLL
        for (int m = 16 * h; m < 16 * h + 16; ++m) {
            const int32_t q = (int32_t)((qs[m] >> shift) & 3u) - (((b[m] >> p) & 1u) ? 0 : 4);
            y[m] = fmul(dl, i2f(q));
        }
    }
}
STRATA_TYPE(q3_k, 256, 32 + 64 + 12 + 2, 32)

// get_scale_min_k4 for sub-block p of Q4_K/Q5_K, 8 scales sc and 8 mins m of 6 bits in 12 bytes q:
//   p < 4:  sc = q[p] & 63,                          m = q[p + 4] & 63
//   p >= 4: sc = q[p + 4] & 0xF | (q[p - 4] >> 6) << 4, m = q[p + 4] >> 4 | (q[p] >> 6) << 4
STRATA_HD void scale_min_k4(const uint8_t* q, int p, uint32_t* sc, uint32_t* m) {
    if (p < 4) {
        *sc = q[p] & 63u;
        *m = q[p + 4] & 63u;
    } else {
        *sc = (q[p + 4] & 0xFu) | ((uint32_t)(q[p - 4] >> 6) << 4);
        *m = (uint32_t)(q[p + 4] >> 4) | ((uint32_t)(q[p] >> 6) << 4);
    }
}

// Q4_K: fp16 d @0 | fp16 dmin @2 | scales[12] @4 | qs[128] @16. Part p = sub-block p = 2g + h:
// code(l) = (qs[32g + l] >> 4h) & 0xF; y = (d·f(sc))·f(code) - dmin·f(m)
STRATA_HD void dq_q4_k_part(const uint8_t* b, int p, float* y) {
    uint32_t sc, mn;
    scale_min_k4(b + 4, p, &sc, &mn);
    const float d1 = fmul(f16_at(b), i2f(sc)), m1 = fmul(f16_at(b + 2), i2f(mn));
    const uint8_t* qs = b + 16 + 32 * (p >> 1);
    const int shift = 4 * (p & 1);
    STRATA_UNROLL
    for (int l = 0; l < 32; ++l) y[l] = fsub(fmul(d1, i2f((qs[l] >> shift) & 0xFu)), m1);
}
STRATA_TYPE(q4_k, 256, 2 + 2 + 12 + 128, 32)

// Q5_K: fp16 d @0 | fp16 dmin @2 | scales[12] @4 | qh[32] @16 | qs[128] @48. Part p = 2g + h:
// code(l) = ((qs[32g + l] >> 4h) & 0xF) + 16·(bit p of qh[l]); y as Q4_K
STRATA_HD void dq_q5_k_part(const uint8_t* b, int p, float* y) {
    uint32_t sc, mn;
    scale_min_k4(b + 4, p, &sc, &mn);
    const float d1 = fmul(f16_at(b), i2f(sc)), m1 = fmul(f16_at(b + 2), i2f(mn));
    const uint8_t* qs = b + 48 + 32 * (p >> 1);
    const int shift = 4 * (p & 1);
    STRATA_UNROLL
    for (int l = 0; l < 32; ++l) {
        const uint32_t code = ((qs[l] >> shift) & 0xFu) + 16u * ((b[16 + l] >> p) & 1u);
        y[l] = fsub(fmul(d1, i2f(code)), m1);
    }
}
STRATA_TYPE(q5_k, 256, 2 + 2 + 12 + 32 + 128, 32)

// Q6_K: ql[128] @0 | qh[64] @128 | int8 scales[16] @192 | fp16 d @208. For w = 128n + 32k + l:
// q = (nibble k/2 of ql[64n + 32(k%2) + l] | ((qh[32n + l] >> 2k) & 3) << 4) - 32; sub-block s = w/16.
// y = (d·f(scales[s]))·f(q)
STRATA_HD void dq_q6_k_part(const uint8_t* b, int p, float* y) {
    const float d = f16_at(b + 208);
    const int n = p >> 2, k = p & 3;
    const uint8_t* ql = b + 64 * n + 32 * (k & 1);
    const uint8_t* qh = b + 128 + 32 * n;
    STRATA_UNROLL
    for (int h = 0; h < 2; ++h) {
        const float dl = fmul(d, i2f((int8_t)b[192 + 2 * p + h]));
        STRATA_UNROLL
        for (int l = 16 * h; l < 16 * h + 16; ++l) {
            const uint32_t u = ((ql[l] >> (4 * (k >> 1))) & 0xFu) | (((qh[l] >> (2 * k)) & 3u) << 4);
            y[l] = fmul(dl, i2f((int32_t)u - 32));
        }
    }
}
STRATA_TYPE(q6_k, 256, 128 + 64 + 16 + 2, 32)
