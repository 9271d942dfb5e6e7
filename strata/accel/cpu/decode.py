"""Block decoders: one packed weight block -> exact integer weights for the q8-path dot products.

Each decoder mirrors the unpacking of its class in strata/quants (the numpy reference, whose docstrings give the
bit layouts) and writes:
  32-weight types (Q8_0 activations / Q8_1)  dst int8[32] codes (Q2_0: int8[64])
  Q2_K, Q3_K and grid i-quants               dst int16[256] = sub-block scale · code (exact, |.| <= 4096)
                                             (IQ1_M: a second int16[256] of scale · delta sign at byte 512)
  (Q4_K, Q5_K, Q6_K at every T and the grids at one token multiply codes held in registers: runs.py)
  IQ4_XS                                     dst int8[256] codes, aux int32[8] = ls − 32 per 32-weight unit
  aux int32[16]                              the integers that meet the Q8_K bsums (mins, signed IQ1_S scales)
Offsets below are byte offsets inside the block (ggml-common.h `block_*`).
"""

from __future__ import annotations

import numpy as np

from strata.accel.cpu._vec import VB, decoder
from strata.quants import iq_grids as G

_KV_IQ4NL = [int(v) for v in G.KVALUES_IQ4NL]
_KV_MXFP4 = [int(v) for v in G.KVALUES_MXFP4]


def _u64_rows(grid: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(grid).view(np.uint8).reshape(grid.shape[0], -1).copy().view("<u8").reshape(-1)


def _u32_rows(grid: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(grid).view(np.uint8).reshape(grid.shape[0], -1).copy().view("<u4").reshape(-1)


_GRIDS = {"iq2xxs": _u64_rows(G.IQ2XXS_GRID), "iq2xs": _u64_rows(G.IQ2XS_GRID), "iq2s": _u64_rows(G.IQ2S_GRID),
          "iq3xxs": _u32_rows(G.IQ3XXS_GRID), "iq3s": _u32_rows(G.IQ3S_GRID),
          "iq1s": _u64_rows(G.IQ1S_GRID.view(np.uint8)), "ksigns": G.KSIGNS.copy()}


def _nib(v: VB, qs):
    """16 bytes -> <32 x i8>: low nibbles (weights 0..15), then high nibbles (16..31)."""
    return v.cat(v.and_(qs, 15), v.shr(qs, 4))


def _bit4(v: VB, off: int):
    """<32 x i8> with bit j of the u32 at `off` moved to bit 4 (Q5_0/Q5_1's fifth bits)."""
    qh = v.ld(off, 1, 32)
    return v.shl(v.tr(v.and_(v.shr(v.bcast(qh, 32), v.K(range(32), 32)), 1), 8), 4)


# --- 32-weight types: dst int8 codes ------------------------------------------------------------------------------
@decoder
def dec_q4_0(v):  # d | qs[16]
    v.put("dst", 0, v.sub(_nib(v, v.ld(2, 16)), 8))


@decoder
def dec_q4_1(v):  # d | m | qs[16]
    v.put("dst", 0, _nib(v, v.ld(4, 16)))


@decoder
def dec_q5_0(v):  # d | qh u32 | qs[16]
    v.put("dst", 0, v.sub(v.or_(_nib(v, v.ld(6, 16)), _bit4(v, 2)), 16))


@decoder
def dec_q5_1(v):  # d | m | qh u32 | qs[16]
    v.put("dst", 0, v.or_(_nib(v, v.ld(8, 16)), _bit4(v, 4)))


@decoder
def dec_iq4_nl(v):  # d | qs[16]
    v.put("dst", 0, v.lut16(_KV_IQ4NL, _nib(v, v.ld(2, 16))))


@decoder
def dec_mxfp4(v):  # e8m0 | qs[16]
    v.put("dst", 0, v.lut16(_KV_MXFP4, _nib(v, v.ld(1, 16))))


@decoder
def dec_q2_0(v):  # d | qs[16]: code j = (qs[j // 4] >> 2(j % 4)) & 3, weight code − 1
    rep = v.shuf(v.ld(2, 16), [j // 4 for j in range(64)])
    v.put("dst", 0, v.sub(v.and_(v.shr(rep, v.K([2 * (j % 4) for j in range(64)])), 3), 1))


# --- K-quants: dst int16 scale·code, aux int32 mins --------------------------------------------------------------
def _half_pairs(v: VB, scales16, s0: int):
    """<32 x i16>: scale s0 for lanes 0..15, s0 + 1 for 16..31 (sub-blocks of 16 weights)."""
    return v.shuf(scales16, [s0] * 16 + [s0 + 1] * 16)


@decoder
def dec_q2_k(v):  # scales[16] | qs[64] | d | dmin
    sc = v.ld(0, 16)
    scales = v.zx(v.and_(sc, 15), 16)
    v.put("aux", 0, v.zx(v.shr(sc, 4), 32))
    for n in range(2):
        q = v.ld(16 + 32 * n, 32)
        for j in range(4):
            c = v.zx(v.and_(v.shr(q, 2 * j), 3), 16)
            v.put("dst", 2 * (128 * n + 32 * j), v.mul(c, _half_pairs(v, scales, 8 * n + 2 * j)))


@decoder
def dec_q3_k(v):  # hmask[32] | qs[64] | scales[12] | d
    hm = v.ld(0, 32)
    q12 = v.ld(96, 12)
    low = v.and_(v.shr(v.shuf(q12, [i % 8 for i in range(16)]), v.K([4 * (i // 8) for i in range(16)])), 15)
    high = v.and_(v.shr(v.shuf(q12, [8 + i % 4 for i in range(16)]), v.K([2 * (i // 4) for i in range(16)])), 3)
    sc = v.sub(v.zx(v.or_(low, v.shl(high, 4)), 16), 32)
    for n in range(2):
        q = v.ld(32 + 32 * n, 32)
        for j in range(4):
            hb = v.and_(v.shr(hm, 4 * n + j), 1)
            qq = v.add(v.sub(v.and_(v.shr(q, 2 * j), 3), 4), v.shl(hb, 2))  # low2 − (hbit ? 0 : 4)
            v.put("dst", 2 * (128 * n + 32 * j), v.mul(v.sx(qq, 16), _half_pairs(v, sc, 8 * n + 2 * j)))


def _scales_k4(v: VB):
    """get_scale_min_k4 on the 12 bytes at 4: (sc <8 x i16>, m <8 x i8>)."""
    q = v.ld(4, 12)
    lo_mask, hi_mask = v.K([63] * 4 + [15] * 4), v.K([0] * 4 + [48] * 4)
    a, b = v.shuf(q, [0, 1, 2, 3, 8, 9, 10, 11]), v.shuf(q, [0, 1, 2, 3, 0, 1, 2, 3])
    sc = v.or_(v.and_(a, lo_mask), v.and_(v.shl(v.shr(b, 6), 4), hi_mask))
    am, bm = v.shuf(q, [4, 5, 6, 7, 8, 9, 10, 11]), v.shuf(q, [4, 5, 6, 7, 4, 5, 6, 7])
    m = v.or_(v.and_(v.shr(am, v.K([0] * 4 + [4] * 4)), lo_mask), v.and_(v.shl(v.shr(bm, 6), 4), hi_mask))
    return v.zx(sc, 16), m


@decoder
def dec_iq4_xs(v):  # d | scales_h u16 | scales_l[4] | qs[128]
    for p in range(4):  # 32 bytes = sub-blocks 2p (bytes 0..15) and 2p + 1 (16..31)
        q = v.ld(8 + 32 * p, 32)
        lo, hi = v.lut16(_KV_IQ4NL, v.and_(q, 15)), v.lut16(_KV_IQ4NL, v.shr(q, 4))
        order = list(range(16)) + list(range(32, 48)) + list(range(16, 32)) + list(range(48, 64))
        v.put("dst", 64 * p, v.shuf(v.cat(lo, hi), order))
    sl = v.ld(4, 4)
    low = v.and_(v.shr(v.shuf(sl, [s // 2 for s in range(8)]), v.K([4 * (s % 2) for s in range(8)])), 15)
    high = v.and_(v.shr(v.bcast(v.ld(2, 1, 16), 8), v.K([2 * s for s in range(8)], 16)), 3)
    v.put("aux", 0, v.sub(v.or_(v.zx(low, 32), v.shl(v.zx(high, 32), 4)), 32))


# --- grid i-quants: dst int16 (2·ls + 1)·(±grid) -------------------------------------------------------------------
def _signed_rows(v: VB, rows, signs, mult, dst_off: int):
    """rows: 4 i64 grid rows (or 8 i32); signs <4 x i8>; mult <32 x i16> -> dst int16[32] at dst_off."""
    g = v.bytes_of(v.pack(rows), 32)
    v.put("dst", dst_off, v.mul(v.sx(v.signed(g, signs), 16), mult))


def _odd(v: VB, ls):
    """2·ls + 1 as i16."""
    w = ls.type.width
    ls16 = ls if w == 16 else (v.tr(ls, 16) if w > 16 else v.zx(ls, 16))
    return v.add(v.shl(ls16, 1), 1)


def _ksigns(v: VB, ks, word, shifts):
    return v.pack([v.tload(ks, v.and_(v.shr(word, s), 127)) for s in shifts])


# Each grid type is written once as 32-weight chunks (chunk index, grid rows, 4 sign bytes, the odd multipliers of
# its two 16-weight halves); `_decoded` stores scale·(±grid) as int16 for dots against many tokens (runs.py reads
# the same chunks for one token). Grid values <= 62 and |a| <= 127 (our quantisers never emit −128) keep every
# i16 pair sum exact.
def _decoded(chunks):
    def build(v):
        for ib, rows, signs, (m0, m1) in chunks(v):
            _signed_rows(v, rows, signs, v.cat(v.bcast(m0, 16), v.bcast(m1, 16)), 64 * ib)

    build.__name__ = "dec_" + chunks.__name__.strip("_")
    return build


def _iq2_xxs(v):  # d | 8 × (u32 a0 = 4 grid bytes, u32 a1 = 4 × 7-bit ksigns | ls << 28)
    grid, ks = v.table("iq2xxs", _GRIDS["iq2xxs"]), v.table("ksigns", _GRIDS["ksigns"])
    for ib in range(8):
        a0, a1 = v.ld(2 + 8 * ib, 1, 32), v.ld(6 + 8 * ib, 1, 32)
        m = _odd(v, v.shr(a1, 28))
        yield ib, [v.tload(grid, v.and_(v.shr(a0, 8 * l), 255)) for l in range(4)], \
            _ksigns(v, ks, a1, (0, 7, 14, 21)), (m, m)


def _iq2_xs(v):  # d | u16 qs[32] (9-bit index | ksigns << 9) | scales[8] (a nibble per 16 weights)
    grid, ks = v.table("iq2xs", _GRIDS["iq2xs"]), v.table("ksigns", _GRIDS["ksigns"])
    for i in range(8):
        qk = [v.ld(2 + 2 * (4 * i + l), 1, 16) for l in range(4)]
        sc = v.ld(66 + i, 1, 8)
        yield i, [v.tload(grid, v.and_(q, 511)) for q in qk], v.pack([v.tload(ks, v.shr(q, 9)) for q in qk]), \
            (_odd(v, v.and_(sc, 15)), _odd(v, v.shr(sc, 4)))


def _iq2_s(v):  # d | qs[32] | signs[32] | qh[8] | scales[8]
    grid = v.table("iq2s", _GRIDS["iq2s"])
    for i in range(8):
        rows = []
        for l in range(4):
            k = 4 * i + l
            hi = v.zx(v.and_(v.shr(v.ld(66 + k // 4, 1, 8), 2 * (k % 4)), 3), 16)
            rows.append(v.tload(grid, v.or_(v.zx(v.ld(2 + k, 1, 8), 16), v.shl(hi, 8))))
        sc = v.ld(74 + i, 1, 8)
        yield i, rows, v.ld(34 + 4 * i, 4), (_odd(v, v.and_(sc, 15)), _odd(v, v.shr(sc, 4)))


def _iq3_xxs(v):  # d | qs[64] (iq3xxs_grid indices, 4 weights each) | u32 aux[8]
    grid, ks = v.table("iq3xxs", _GRIDS["iq3xxs"]), v.table("ksigns", _GRIDS["ksigns"])
    for ib in range(8):
        a = v.ld(66 + 4 * ib, 1, 32)
        m = _odd(v, v.shr(a, 28))
        yield ib, [v.tload(grid, v.ld(2 + 8 * ib + l, 1, 8)) for l in range(8)], \
            _ksigns(v, ks, a, (0, 7, 14, 21)), (m, m)


def _iq3_s(v):  # d | qs[64] | qh[8] | signs[32] | scales[4]
    grid = v.table("iq3s", _GRIDS["iq3s"])
    for ib in range(8):
        qh = v.ld(66 + ib, 1, 8)
        rows = [v.tload(grid, v.or_(v.zx(v.ld(2 + 8 * ib + l, 1, 8), 16),
                                    v.shl(v.zx(v.and_(v.shr(qh, l), 1), 16), 8))) for l in range(8)]
        sb = v.ld(106 + ib // 2, 1, 8)
        m = _odd(v, v.and_(sb, 15) if ib % 2 == 0 else v.shr(sb, 4))
        yield ib, rows, v.ld(74 + 4 * ib, 4), (m, m)


dec_iq2_xxs = decoder(_decoded(_iq2_xxs))
dec_iq2_xs = decoder(_decoded(_iq2_xs))
dec_iq2_s = decoder(_decoded(_iq2_s))
dec_iq3_xxs = decoder(_decoded(_iq3_xxs))
dec_iq3_s = decoder(_decoded(_iq3_s))


@decoder
def dec_iq1_s(v):  # d | qs[32] | u16 qh[8]
    grid = v.table("iq1s", _GRIDS["iq1s"])
    lsigned = []
    for s in range(8):
        qh = v.ld(34 + 2 * s, 1, 16)
        rows = [v.tload(grid, v.or_(v.zx(v.ld(2 + 4 * s + j, 1, 8), 16), v.shl(v.and_(v.shr(qh, 3 * j), 7), 8)))
                for j in range(4)]
        ls = _odd(v, v.and_(v.shr(qh, 12), 7))
        v.put("dst", 64 * s, v.mul(v.sx(v.bytes_of(v.pack(rows), 32), 16), v.bcast(ls, 32)))
        neg = v.b.icmp_unsigned("!=", v.shr(qh, 15), v.c(qh, 0))  # the delta sign, bit 15
        lsigned.append(v.b.select(neg, v.b.neg(v.zx(ls, 32)), v.zx(ls, 32)))
    v.put("aux", 0, v.pack([lsigned[j // 2] for j in range(16)]))


@decoder
def dec_iq1_m(v):  # qs[32] | qh[16] | u16 sc[4] (d's fp16 bits in the top nibbles)
    grid = v.table("iq1s", _GRIDS["iq1s"])
    ls = [_odd(v, v.and_(v.shr(v.ld(48 + 2 * (s // 4), 1, 16), 3 * (s % 4)), 7)) for s in range(16)]
    for i in range(8):  # 32 weights = groups 4i..4i+3 = sub-blocks 2i, 2i + 1
        rows, sgn = [], []
        for l in range(4):
            k = 4 * i + l
            nib = v.and_(v.shr(v.ld(32 + k // 2, 1, 8), 4 * (k % 2)), 15)
            rows.append(v.tload(grid, v.or_(v.zx(v.ld(k, 1, 8), 16), v.shl(v.zx(v.and_(nib, 7), 16), 8))))
            sgn.append(v.b.sub(v.c(nib, 1), v.shr(v.and_(nib, 8), 2)))  # 1 or −1
        mult = v.cat(v.bcast(ls[2 * i], 16), v.bcast(ls[2 * i + 1], 16))
        v.put("dst", 64 * i, v.mul(v.sx(v.bytes_of(v.pack(rows), 32), 16), mult))
        v.put("dst", 512 + 64 * i, v.mul(v.sx(v.shuf(v.pack(sgn), [j // 8 for j in range(32)]), 16), mult))
