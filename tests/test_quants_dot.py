"""q8-path dots: every vec_dot equals a slow scalar transcription of ggml's generic C loops (Python ints per
block, np.float32 scalars in the documented order) and is close to the float path; q8_matmul plumbing.

The scalar versions decode the bytes the way ggml-cpu/quants.c does (uint32 kmask tricks, pointer walks), not
the way strata.quants does, so they check the unpacking as well as the arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest

import strata.quants as Q
from strata.quants import iq_grids as G
from strata.quants.testing import assert_bits_equal

F = np.float32


# --- byte helpers (little-endian, Python ints) ---------------------------------------------------------------
def h(b, o):
    return F(np.frombuffer(bytes(b[o : o + 2]), np.float16)[0])


def u16(b, o):
    return int(b[o]) | int(b[o + 1]) << 8


def u32(b, o):
    return u16(b, o) | u16(b, o + 2) << 16


def s8(v):
    v = int(v)
    return v - 256 if v > 127 else v


def q8_0(a):
    return h(a, 0), [s8(v) for v in a[2:34]]


def q8_k(a):
    d = F(np.frombuffer(bytes(a[0:4]), np.float32)[0])
    return d, [s8(v) for v in a[4:260]], [int(v) for v in np.frombuffer(bytes(a[260:292]), np.int16)]


def sgn(mask, j):
    return -1 if mask & (1 << j) else 1


# --- per-block scalar values (x: one weight block, ys: its activation block(s)) ------------------------------
def bv_q4_0(x, ys):
    d8, q8 = q8_0(ys[0])
    s0 = sum(((x[2 + j] & 0xF) - 8) * q8[j] for j in range(16))
    s1 = sum(((x[2 + j] >> 4) - 8) * q8[j + 16] for j in range(16))
    return F(s0 + s1) * h(x, 0) * d8


def _q5_codes(x, off):
    qh = u32(x, off)
    lo = [(x[off + 4 + j] & 0xF) | (((qh >> j) << 4) & 0x10) for j in range(16)]
    hi = [(x[off + 4 + j] >> 4) | ((qh >> (j + 12)) & 0x10) for j in range(16)]
    return lo + hi


def bv_q5_0(x, ys):
    d8, q8 = q8_0(ys[0])
    sumi = sum((c - 16) * q for c, q in zip(_q5_codes(x, 2), q8))
    return (h(x, 0) * d8) * F(sumi)


def _bv_x_1(x, ys, codes):
    d8, s8_, q8 = h(ys[0], 0), h(ys[0], 2), [s8(v) for v in ys[0][4:36]]
    sumi = sum(c * q for c, q in zip(codes, q8))
    return (h(x, 0) * d8) * F(sumi) + h(x, 2) * s8_


def bv_q4_1(x, ys):
    return _bv_x_1(x, ys, [x[4 + j] & 0xF for j in range(16)] + [x[4 + j] >> 4 for j in range(16)])


def bv_q5_1(x, ys):
    return _bv_x_1(x, ys, _q5_codes(x, 4))


def bv_q8_0(x, ys):
    d8, q8 = q8_0(ys[0])
    return F(sum(s8(x[2 + j]) * q8[j] for j in range(32))) * (h(x, 0) * d8)


def bv_iq4_nl(x, ys):
    d8, q8 = q8_0(ys[0])
    kv = G.KVALUES_IQ4NL.tolist()
    s = sum(q8[j] * kv[x[2 + j] & 0xF] + q8[j + 16] * kv[x[2 + j] >> 4] for j in range(16))
    return (d8 * h(x, 0)) * F(s)


def bv_mxfp4(x, ys):
    d8, q8 = q8_0(ys[0])
    kv = G.KVALUES_MXFP4.tolist()
    e = int(x[0])
    half = F(np.array([(0x00200000 << e) if e < 2 else ((e - 1) << 23)], np.uint32).view(np.float32)[0])
    s = sum(q8[j] * kv[x[1 + j] & 0xF] + q8[j + 16] * kv[x[1 + j] >> 4] for j in range(16))
    return (d8 * half) * F(s)


def bv_q2_0(x, ys):
    sumi = F(0.0)
    for k in range(2):
        d1, q8 = q8_0(ys[k])
        sb = sum(
            (((x[2 + 8 * k + b] >> (2 * i)) & 3) - 1) * q8[4 * b + i] for b in range(8) for i in range(4)
        )
        sumi = sumi + d1 * F(sb)
    return h(x, 0) * sumi


def bv_q2_k(x, ys):
    d8, q8, bsums = q8_k(ys[0])
    sc, q2 = x[0:16], x[16:80]
    summs = sum(bsums[j] * (sc[j] >> 4) for j in range(16))
    dall, dmin = d8 * h(x, 80), d8 * h(x, 82)
    isum, is_, qo, yo = 0, 0, 0, 0
    for _ in range(2):
        for shift in (0, 2, 4, 6):
            for lo in (0, 16):
                d = sc[is_] & 0xF
                is_ += 1
                isum += d * sum(q8[yo + l] * ((q2[qo + l] >> shift) & 3) for l in range(lo, lo + 16))
            yo += 32
        qo += 32
    return dall * F(isum) - dmin * F(summs)


def bv_q3_k(x, ys):  # ggml's lanes aux32[0..7] are partial integer sums: their total is isum
    d8, q8, _ = q8_k(ys[0])
    hm, q3 = x[0:32], x[32:96]
    a, m = [], 1
    for n in range(2):
        for shift in (0, 2, 4, 6):
            a += [((q3[32 * n + l] >> shift) & 3) - (0 if hm[l] & m else 4) for l in range(32)]
            m <<= 1
    k1, k2 = 0x03030303, 0x0F0F0F0F
    a0, a1, tmp = u32(x, 96), u32(x, 100), u32(x, 104)
    words = [
        (a0 & k2) | (((tmp >> 0) & k1) << 4),
        (a1 & k2) | (((tmp >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ]
    scales = [s8((w >> (8 * i)) & 0xFF) for w in words for i in range(4)]
    isum = sum((scales[j] - 32) * sum(q8[16 * j + l] * a[16 * j + l] for l in range(16)) for j in range(16))
    return (h(x, 108) * d8) * F(isum)


def _utmp_scales_mins(x):
    k1, k2, k3 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303
    u = [u32(x, 4), u32(x, 8), u32(x, 12), 0]
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4)
    uaux = u[1] & k1
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4)
    u[2] = uaux
    u[0] &= k1
    by = [(w >> (8 * i)) & 0xFF for w in u for i in range(4)]
    return by[0:8], by[8:16]


def _bv_q45_k(x, ys, a):
    d8, q8, bsums = q8_k(ys[0])
    scales, mins = _utmp_scales_mins(x)
    sumi = sum(bsums[j] * mins[j // 2] for j in range(16))
    isum = sum(scales[j] * sum(q8[32 * j + l] * a[32 * j + l] for l in range(32)) for j in range(8))
    return (h(x, 0) * d8) * F(isum) - (h(x, 2) * d8) * F(sumi)


def bv_q4_k(x, ys):
    a = []
    for j in range(4):
        a += [x[16 + 32 * j + l] & 0xF for l in range(32)] + [x[16 + 32 * j + l] >> 4 for l in range(32)]
    return _bv_q45_k(x, ys, a)


def bv_q5_k(x, ys):
    a, m = [], 1
    for j in range(4):
        q4 = x[48 + 32 * j : 48 + 32 * j + 32]
        a += [(q4[l] & 0xF) + (16 if x[16 + l] & m else 0) for l in range(32)]
        a += [(q4[l] >> 4) + (16 if x[16 + l] & (m << 1) else 0) for l in range(32)]
        m <<= 2
    return _bv_q45_k(x, ys, a)


def bv_q6_k(x, ys):
    d8, q8, _ = q8_k(ys[0])
    a = [0] * 256
    for n in range(2):
        ql, qh = x[64 * n : 64 * n + 64], x[128 + 32 * n : 160 + 32 * n]
        for l in range(32):
            a[128 * n + l] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32
            a[128 * n + l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32
            a[128 * n + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32
            a[128 * n + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32
    isum = sum(s8(x[192 + j]) * sum(q8[16 * j + l] * a[16 * j + l] for l in range(16)) for j in range(16))
    return (h(x, 208) * d8) * F(isum)


def _grid_dot(grid, idx, signs_mask, q8):
    return sum(int(grid[idx][j]) * q8[j] * sgn(signs_mask, j) for j in range(len(grid[idx])))


def bv_iq2_xxs(x, ys):
    d8, q8, _ = q8_k(ys[0])
    bsum = 0
    for ib in range(8):
        a0, a1 = x[2 + 8 * ib : 6 + 8 * ib], u32(x, 6 + 8 * ib)
        ls = 2 * (a1 >> 28) + 1
        s = sum(
            _grid_dot(G.IQ2XXS_GRID, a0[l], int(G.KSIGNS[(a1 >> 7 * l) & 127]), q8[32 * ib + 8 * l :])
            for l in range(4)
        )
        bsum += s * ls
    return ((h(x, 0) * d8) * F(bsum)) * F(0.125)


def _bv_iq2_xs_s(x, ys, idx_sign, scales_off):
    d8, q8, _ = q8_k(ys[0])
    bsum = 0
    for ib in range(8):
        sc = x[scales_off + ib]
        for half, ls in ((0, 2 * (sc & 0xF) + 1), (1, 2 * (sc >> 4) + 1)):
            s = 0
            for l in (2 * half, 2 * half + 1):
                grid, idx, mask = idx_sign(ib, l)
                s += _grid_dot(grid, idx, mask, q8[32 * ib + 8 * l :])
            bsum += s * ls
    return ((h(x, 0) * d8) * F(bsum)) * F(0.125)


def bv_iq2_xs(x, ys):
    def idx_sign(ib, l):
        q = u16(x, 2 + 2 * (4 * ib + l))
        return G.IQ2XS_GRID, q & 511, int(G.KSIGNS[q >> 9])

    return _bv_iq2_xs_s(x, ys, idx_sign, 66)


def bv_iq2_s(x, ys):
    def idx_sign(ib, l):
        idx = x[2 + 4 * ib + l] | ((x[66 + ib] << (8 - 2 * l)) & 0x300)
        return G.IQ2S_GRID, idx, int(x[34 + 4 * ib + l])

    return _bv_iq2_xs_s(x, ys, idx_sign, 74)


def bv_iq3_xxs(x, ys):
    d8, q8, _ = q8_k(ys[0])
    bsum = 0
    for ib in range(8):
        aux = u32(x, 66 + 4 * ib)
        s = 0
        for l in range(4):
            mask = int(G.KSIGNS[(aux >> 7 * l) & 127])
            g1, g2 = G.IQ3XXS_GRID[x[2 + 8 * ib + 2 * l]], G.IQ3XXS_GRID[x[2 + 8 * ib + 2 * l + 1]]
            y = q8[32 * ib + 8 * l :]
            s += sum(
                int(g1[j]) * y[j] * sgn(mask, j) + int(g2[j]) * y[j + 4] * sgn(mask, j + 4) for j in range(4)
            )
        bsum += s * (2 * (aux >> 28) + 1)
    return ((h(x, 0) * d8) * F(bsum)) * F(0.25)


def bv_iq3_s(x, ys):
    d8, q8, _ = q8_k(ys[0])
    bsum = 0
    for ib in range(8):
        ls = 2 * ((x[106 + ib // 2] >> (4 * (ib % 2))) & 0xF) + 1
        qh, s = x[66 + ib], 0
        for l in range(4):
            i1 = x[2 + 8 * ib + 2 * l] | ((qh << (8 - 2 * l)) & 256)
            i2 = x[2 + 8 * ib + 2 * l + 1] | ((qh << (7 - 2 * l)) & 256)
            mask, y = int(x[74 + 4 * ib + l]), q8[32 * ib + 8 * l :]
            s += sum(
                int(G.IQ3S_GRID[i1][j]) * y[j] * sgn(mask, j)
                + int(G.IQ3S_GRID[i2][j]) * y[j + 4] * sgn(mask, j + 4)
                for j in range(4)
            )
        bsum += s * ls
    return (h(x, 0) * d8) * F(bsum)


def bv_iq1_s(x, ys):
    d8, q8, bsums = q8_k(ys[0])
    sumi = sumi1 = 0
    for ib in range(8):
        qh = u16(x, 34 + 2 * ib)
        ls, delta = 2 * ((qh >> 12) & 7) + 1, (-1 if qh & 0x8000 else 1)
        lsum = sum(
            int(G.IQ1S_GRID[x[2 + 4 * ib + l] | (((qh >> 3 * l) & 7) << 8)][j]) * q8[32 * ib + 8 * l + j]
            for l in range(4)
            for j in range(8)
        )
        sumi += ls * lsum
        sumi1 += ls * delta * (bsums[2 * ib] + bsums[2 * ib + 1])
    return (h(x, 0) * d8) * (F(sumi) + F(0.125) * F(sumi1))


def bv_iq1_m(x, ys):
    d8, q8, _ = q8_k(ys[0])
    sc = [u16(x, 48 + 2 * i) for i in range(4)]
    bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)
    d = F(np.array([bits], np.uint16).view(np.float16)[0])
    sumi1 = sumi2 = 0
    for ib in range(8):
        qh = x[32 + 2 * ib : 34 + 2 * ib]
        delta = [
            -1 if qh[0] & 0x08 else 1,
            -1 if qh[0] & 0x80 else 1,
            -1 if qh[1] & 0x08 else 1,
            -1 if qh[1] & 0x80 else 1,
        ]
        s1, s2 = [0, 0], [0, 0]
        for l in range(4):
            idx = x[4 * ib + l] | ((int(qh[l // 2]) << (8 - 4 * (l % 2))) & 0x700)
            y = q8[32 * ib + 8 * l : 32 * ib + 8 * l + 8]
            s1[l // 2] += sum(int(G.IQ1S_GRID[idx][j]) * y[j] for j in range(8))
            s2[l // 2] += sum(y) * delta[l]
        ls1 = 2 * ((sc[ib // 2] >> (6 * (ib % 2))) & 7) + 1
        ls2 = 2 * ((sc[ib // 2] >> (6 * (ib % 2) + 3)) & 7) + 1
        sumi1 += s1[0] * ls1 + s1[1] * ls2
        sumi2 += s2[0] * ls1 + s2[1] * ls2
    return (d * d8) * (F(sumi1) + F(0.125) * F(sumi2))


def units_iq4_xs(x, ys):  # ggml adds one value per 32-weight sub-block to the row sum: return those units
    d8, q8, _ = q8_k(ys[0])
    kv = G.KVALUES_IQ4NL.tolist()
    d4d8, hbits, out = h(x, 0) * d8, u16(x, 2), []
    for ib in range(8):
        ls = ((x[4 + ib // 2] >> (4 * (ib % 2))) & 0xF) | (((hbits >> (2 * ib)) & 3) << 4)
        qs, y = x[8 + 16 * ib : 24 + 16 * ib], q8[32 * ib : 32 * ib + 32]
        s = sum(y[j] * kv[qs[j] & 0xF] + y[j + 16] * kv[qs[j] >> 4] for j in range(16))
        out.append((d4d8 * F(ls - 32)) * F(s))
    return out


BLOCK_VALUE = {
    "Q4_0": bv_q4_0,
    "Q4_1": bv_q4_1,
    "Q5_0": bv_q5_0,
    "Q5_1": bv_q5_1,
    "Q8_0": bv_q8_0,
    "IQ4_NL": bv_iq4_nl,
    "MXFP4": bv_mxfp4,
    "Q2_0": bv_q2_0,
    "Q2_K": bv_q2_k,
    "Q3_K": bv_q3_k,
    "Q4_K": bv_q4_k,
    "Q5_K": bv_q5_k,
    "Q6_K": bv_q6_k,
    "IQ2_XXS": bv_iq2_xxs,
    "IQ2_XS": bv_iq2_xs,
    "IQ2_S": bv_iq2_s,
    "IQ3_XXS": bv_iq3_xxs,
    "IQ3_S": bv_iq3_s,
    "IQ1_S": bv_iq1_s,
    "IQ1_M": bv_iq1_m,
    "IQ4_XS": lambda x, ys: units_iq4_xs(x, ys),
}


def scalar_dot(cls, w, a):
    """w [N, B, S], a [T, Ba, Sa] -> [T, N]: block values accumulated in float32 from +0.0, in order."""
    per = a.shape[1] // w.shape[1]  # activation blocks per weight block (2 for Q2_0)
    out = np.zeros((a.shape[0], w.shape[0]), F)
    for t in range(a.shape[0]):
        for n in range(w.shape[0]):
            acc = F(0.0)
            for b in range(w.shape[1]):
                v = BLOCK_VALUE[cls.name](w[n, b].tolist(), [a[t, per * b + k].tolist() for k in range(per)])
                for u in v if isinstance(v, list) else [v]:
                    acc = acc + u
            out[t, n] = acc
    return out


def scalar_float_dot(cls, w, a):
    """Float weights: f32 products, Python-float (double) sum in k order, rounded once."""
    act = Q.get(cls.vec_dot_type)
    wf = cls.dequantize(w.reshape(-1, cls.type_size)).reshape(w.shape[0], -1)
    af = act.dequantize(a.reshape(-1, act.type_size)).reshape(a.shape[0], -1)
    return np.array(
        [
            [F(sum(float(F(af[t, k] * wf[n, k])) for k in range(wf.shape[1]))) for n in range(len(wf))]
            for t in range(len(af))
        ],
        F,
    )


WEIGHTS = [c for c in Q.registered() if c.weight]


def operands(cls, rng, t=3, n=3, blocks=2):
    """Weights: random valid blocks plus encoded Gaussian rows; activations: Gaussian rows with one zero row
    and one row with a single huge value, quantised to the vec_dot_type."""
    k = cls.block_size * blocks if cls.block_size > 1 else 64
    w = np.concatenate(
        [
            cls.random_blocks(rng, (n - 1) * (k // cls.block_size), 0.05),
            cls.quantize(rng.standard_normal((k // cls.block_size, cls.block_size)).astype(F)),
        ]
    )
    x = rng.standard_normal((t, k)).astype(F)
    x[0] = 0
    x[1, 3] = 300.0
    a = Q.quantize_act(x, cls.vec_dot_type)
    act = Q.get(cls.vec_dot_type)
    return w.reshape(n, -1, cls.type_size), a.reshape(t, -1, act.type_size), x


@pytest.mark.parametrize("cls", WEIGHTS, ids=lambda c: c.name)
def test_vec_dot_equals_scalar_transcription(cls):
    rng = np.random.default_rng(cls.qtype)
    w, a, _ = operands(cls, rng)
    ref = scalar_float_dot(cls, w, a) if cls.block_size == 1 else scalar_dot(cls, w, a)
    assert_bits_equal(cls.vec_dot(w, a), ref, 1, f"{cls.name} vec_dot")


# Tolerance vs the float path: the q8 path rounds each block's float32 formula (a few ops) and the float32
# running sum; with B blocks the error is below ~(B + 8)·2^-24·Σ|w·a| (term magnitudes, where cancellation of
# d·isum against dmin·summs is bounded by the same Σ|w|·|a|). We allow 4× that.
@pytest.mark.parametrize("cls", WEIGHTS, ids=lambda c: c.name)
def test_vec_dot_close_to_float_path(cls):
    rng = np.random.default_rng(1000 + cls.qtype)
    w, a, _ = operands(cls, rng, t=4, n=5, blocks=8)
    act = Q.get(cls.vec_dot_type)
    wf = cls.dequantize(w.reshape(-1, cls.type_size)).reshape(w.shape[0], -1).astype(np.float64)
    af = act.dequantize(a.reshape(-1, act.type_size)).reshape(a.shape[0], -1).astype(np.float64)
    y = cls.vec_dot(w, a).astype(np.float64)
    ref = af @ wf.T  # integer-valued or exactly representable products: float64 is ample here
    mag = np.abs(af) @ np.abs(wf).T
    if cls.name in ("Q2_K", "Q4_K", "Q5_K", "Q4_1", "Q5_1"):  # a min term: bound by the two parts' magnitudes
        mag = mag * 2 + np.abs(af).sum(axis=1, keepdims=True) * np.abs(wf).max()
    tol = 4 * (w.shape[1] * (cls.block_size // 32 or 1) + 8) * 2.0**-24 * mag + 1e-30
    if act.name == "Q8_1":  # s = fp16(d·Σq) is rounded to fp16 (2^-11 relative): m·s carries that error
        m = np.abs(w[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64))  # [N, B]
        s_ = np.abs(a[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64))  # [T, B]
        tol = tol + 2.0**-10 * (s_ @ m.T)
    bad = np.abs(y - ref) > tol
    assert (
        not bad.any()
    ), f"{cls.name}: |q8 - float| up to {np.abs(y - ref).max():.3g}, tol {tol[bad].min():.3g}"


def test_q8_matmul_plumbing():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 512)).astype(F)
    w = Q.quantize_rows(rng.standard_normal((3, 512)).astype(F), 12)
    a = Q.quantize_act(x, 15)
    assert_bits_equal(Q.q8_matmul(x, w, 12), Q.get(12).vec_dot(w.reshape(3, 2, 144), a.reshape(2, 2, 292)), 1)
    with pytest.raises(ValueError, match="hold 512 values"):
        Q.q8_matmul(x[:, :256], w, 12)
    with pytest.raises(ValueError, match="activations must be Q8_K"):
        Q.get(12).vec_dot(w.reshape(3, 2, 144), Q.quantize_act(x, 8).reshape(2, 16, 34))
    with pytest.raises(Q.UnsupportedQuantType, match="activation format"):
        Q.q8_matmul(x, a, 15)


def test_row_sum_is_block_ordered_float32():
    # Q8_0 blocks with values 2^24, 1, 1 (block 0: dx = 1024, dy = 128, sumi = 64·2 = 128 -> 2^24 exactly):
    # in float32, ((0 + 2^24) + 1) + 1 = 2^24 (each +1 is a tie to even), summed the other way it is 2^24 + 2
    w = np.zeros((1, 3, 34), np.uint8)
    a = np.zeros((1, 3, 34), np.uint8)
    for blk, (dx, dy, qw, qa) in enumerate([(1024.0, 128.0, 64, 2), (1.0, 1.0, 1, 1), (1.0, 1.0, 1, 1)]):
        w[0, blk, :2] = np.float16(dx).reshape(1, 1).view(np.uint8)
        a[0, blk, :2] = np.float16(dy).reshape(1, 1).view(np.uint8)
        w[0, blk, 2], a[0, blk, 2] = qw, qa
    assert Q.get(8).vec_dot(w, a)[0, 0] == F(2.0**24)


def test_hand_built_q4_k_dot():
    # weights: the Q4_K block of test_quants_formats HAND (sub-block values 0, 4, 3, 8, 5, 12, 7, 16; scales
    # s + 1, codes 1/2, m0 = 2, d = 1, dmin = 0.5); activation: Q8_K d = 0.5, all qs 2 (every a = 1.0).
    # isum = 64·(1 + 4 + 3 + 8 + 5 + 12 + 7 + 16) = 3584, summs = (32 + 32)·2 = 128,
    # block value = (1·0.5)·3584 - (0.5·0.5)·128 = 1792 - 32 = 1760 = 32·55, the float-path sum
    w = np.zeros((1, 1, 144), np.uint8)
    w[0, 0, 0:4] = np.array([1.0, 0.5], np.float16).view(np.uint8)
    w[0, 0, 4:16] = [1, 2, 3, 4, 2, 0, 0, 0, 5, 6, 7, 8]
    w[0, 0, 16:] = 0x21
    a = np.zeros((1, 1, 292), np.uint8)
    a[0, 0, 0:4] = np.array([0.5], np.float32).view(np.uint8)
    a[0, 0, 4:260] = 2
    a[0, 0, 260:292] = np.full(16, 32, np.int16).view(np.uint8)
    assert Q.get(12).vec_dot(w, a)[0, 0] == F(1760.0)
