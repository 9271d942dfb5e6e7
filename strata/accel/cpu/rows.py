"""Row-range q8-path kernels: rows [r0, r1) of a packed weight against T <= 8 quantised activation rows.

    rows_*(qt, w, wrow, r0, r1, a, arow, T, out, ostride)
      w    uint8, the matrix's packed rows (row r at byte r·wrow), read block by block, never dequantised
      a    uint8, T activation rows in the weight type's vec_dot_type, row t at byte t·arow
      out  float32, y[t, r] written to out[t·ostride + r]

Per block: a decoder (decode.py) unpacks exact integers, an intrinsic takes the exact integer dot, and the block
value follows the float32 formula in the quant class's docstring (strata/quants); block values are summed in
float32 in block order from +0.0 (docs/NUMERICS.md). One compiled function per few types (entry.py compiles
only those a model uses: a function holding every type took 25 s of a first run's compile); each type gets its
own inlined loop (loops.py) with its type id as a constant (LLVM folds the shared block functions' type tests).
Legend: T tokens, N rows, B blocks per row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.accel.cpu import decode as D
from strata.accel.cpu import runs as RN
from strata.accel.cpu import runs32 as R32
from strata.accel.cpu._llvm import (bits_f32, dot_i8_i8_32, dot_i16_i8_256, dot_i32_i16_16, e8m0_half, f16_at,
                                    half_to_f32, ld_f32, ld_u8, ld_u16)
from strata.accel.cpu.loops import _loop, _loop_runs, _loop_runs8, _loop_runs32, _loop_token_groups

MAXT = 8  # activation rows per call (SPEC §4 MAXT); callers split larger batches
_F0, _F0125, _F025 = np.float32(0.0), np.float32(0.125), np.float32(0.25)

# ggml type ids
F32_T, F16_T, BF16_T = 0, 1, 30
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_0, IQ4_NL, MXFP4 = 2, 3, 6, 7, 8, 42, 20, 39
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ4_XS, IQ1_M = 16, 17, 18, 19, 21, 22, 23, 29


# --- blocks with Q8_0 / Q8_1 activations (34 / 36 bytes: scale | [s |] qs[32]) --------------------------------
@njit(inline="always")
def blk_q8_0(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # f(sumi)·(dx·dy)
    dx = f16_at(w, o)
    for t in range(T):
        acc[t] += np.float32(dot_i8_i8_32(w, o + 2, a, t * arow + 34 * b + 2)) * (dx * dy[t * nba + b])


@njit(inline="always")
def blk_q4_0(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # (f(sumi)·dx)·dy
    D.dec_q4_0(w, o, codes, aux)
    dx = f16_at(w, o)
    for t in range(T):
        acc[t] += (np.float32(dot_i8_i8_32(codes, 0, a, t * arow + 34 * b + 2)) * dx) * dy[t * nba + b]


@njit(inline="always")
def blk_d_sumi(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # (dx·dy)·f(sumi); MXFP4: dx = 2^(e−128)
    if qt == Q5_0:
        D.dec_q5_0(w, o, codes, aux)
        dx = f16_at(w, o)
    elif qt == IQ4_NL:
        D.dec_iq4_nl(w, o, codes, aux)
        dx = f16_at(w, o)
    else:
        D.dec_mxfp4(w, o, codes, aux)
        dx = e8m0_half(ld_u8(w, o))
    for t in range(T):
        acc[t] += (dx * dy[t * nba + b]) * np.float32(dot_i8_i8_32(codes, 0, a, t * arow + 34 * b + 2))


@njit(inline="always")
def blk_q2_0(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # d·((0 + dy0·f(s0)) + dy1·f(s1))
    D.dec_q2_0(w, o, codes, aux)
    dx = f16_at(w, o)
    for t in range(T):
        i = t * nba + 2 * b        # two Q8_0 activation blocks per 64-weight block
        ao = t * arow + 68 * b
        s0 = np.float32(dot_i8_i8_32(codes, 0, a, ao + 2))
        s1 = np.float32(dot_i8_i8_32(codes, 32, a, ao + 36))
        acc[t] += dx * ((_F0 + dy[i] * s0) + dy[i + 1] * s1)


@njit(inline="always")
def blk_q8_1(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # (dx·dy)·f(sumi) + mx·sy: Q4_1, Q5_1
    if qt == Q4_1:
        D.dec_q4_1(w, o, codes, aux)
    else:
        D.dec_q5_1(w, o, codes, aux)
    dx, mx = f16_at(w, o), f16_at(w, o + 2)
    for t in range(T):
        sumi = np.float32(dot_i8_i8_32(codes, 0, a, t * arow + 36 * b + 4))
        acc[t] += (dx * dy[t * nba + b]) * sumi + mx * sy[t * nba + b]


@njit(nogil=True, cache=True)
def rows_q8_0(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    """Q8_0 (the dense weights' usual type): runs of blocks at one token (runs32.py)."""
    if T == 1:
        _loop_runs32(R32.q8_0_x8, R32.q8_0_x4, R32.q8_0_x2, R32.q8_0_x1, 34, w, wrow, r0, r1, a, out, ws)
    else:
        _loop(blk_q8_0, 34, 34, 1, w, wrow, r0, r1, a, arow, T, out, ostride, Q8_0, ws)


@njit(nogil=True, cache=True)
def rows_q4_0(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    """Q4_0 and IQ4_NL (18-byte blocks), runs of blocks at one token; the type passed as a constant per branch."""
    if T == 1 and qt == Q4_0:
        _loop_runs32(R32.q4_0_x8, R32.q4_0_x4, R32.q4_0_x2, R32.q4_0_x1, 18, w, wrow, r0, r1, a, out, ws)
    elif T == 1:
        _loop_runs32(R32.iq4_nl_x8, R32.iq4_nl_x4, R32.iq4_nl_x2, R32.iq4_nl_x1, 18, w, wrow, r0, r1, a, out, ws)
    elif qt == Q4_0:
        _loop(blk_q4_0, 18, 34, 1, w, wrow, r0, r1, a, arow, T, out, ostride, Q4_0, ws)
    else:
        _loop(blk_d_sumi, 18, 34, 1, w, wrow, r0, r1, a, arow, T, out, ostride, IQ4_NL, ws)


@njit(nogil=True, cache=True)
def rows_q8_other(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    """The other types with Q8_0 / Q8_1 activations (32 weights a block; Q2_0 64)."""
    if qt == Q5_0:
        _loop(blk_d_sumi, 22, 34, 1, w, wrow, r0, r1, a, arow, T, out, ostride, Q5_0, ws)
    elif qt == MXFP4:
        _loop(blk_d_sumi, 17, 34, 1, w, wrow, r0, r1, a, arow, T, out, ostride, MXFP4, ws)
    elif qt == Q2_0:
        _loop(blk_q2_0, 18, 34, 2, w, wrow, r0, r1, a, arow, T, out, ostride, Q2_0, ws)
    elif qt == Q4_1:
        _loop(blk_q8_1, 20, 36, 1, w, wrow, r0, r1, a, arow, T, out, ostride, Q4_1, ws)
    else:
        _loop(blk_q8_1, 24, 36, 1, w, wrow, r0, r1, a, arow, T, out, ostride, Q5_1, ws)


# --- blocks with Q8_K activations (292 bytes: f32 d | qs[256] | bsums[16]) -------------------------------------
@njit(inline="always")
def blk_mins(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # Q2_K: (d·dy)·f(isum) − (dmin·dy)·f(summs)
    D.dec_q2_k(w, o, codes, aux)          # (Q4_K/Q5_K take runs.py at every T)
    d, dm = f16_at(w, o + 80), f16_at(w, o + 82)
    for t in range(T):
        ao = t * arow + 292 * b
        dyv = dy[t * nba + b]
        isum = np.float32(dot_i16_i8_256(codes, 0, a, ao + 4))
        summs = np.float32(dot_i32_i16_16(aux, 0, a, ao + 260))
        acc[t] += (d * dyv) * isum - (dm * dyv) * summs


@njit(inline="always")
def blk_single(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # (d·dy)·f(isum) [· ggml's tail]: Q3_K, and
    # the grid i-quants at T > 1 (Q6_K takes runs.py at every T)
    tail = _F0
    if qt == Q3_K:
        D.dec_q3_k(w, o, codes, aux)
        d = f16_at(w, o + 108)
    elif qt == IQ3_S:
        D.dec_iq3_s(w, o, codes, aux)
        d = f16_at(w, o)
    elif qt == IQ2_XXS:
        D.dec_iq2_xxs(w, o, codes, aux)
        d, tail = f16_at(w, o), _F0125
    elif qt == IQ2_XS:
        D.dec_iq2_xs(w, o, codes, aux)
        d, tail = f16_at(w, o), _F0125
    elif qt == IQ2_S:
        D.dec_iq2_s(w, o, codes, aux)
        d, tail = f16_at(w, o), _F0125
    else:
        D.dec_iq3_xxs(w, o, codes, aux)
        d, tail = f16_at(w, o), _F025
    for t in range(T):
        ao = t * arow + 292 * b
        isum = dot_i16_i8_256(codes, 0, a, ao + 4)
        bv = (d * dy[t * nba + b]) * np.float32(isum)
        if tail != _F0:  # IQ2_* and IQ3_XXS: ggml scales by 0.125f / 0.25f (per block here, see iquants.py)
            bv = bv * tail
        acc[t] += bv


@njit(inline="always")
def blk_iq1(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # (d·dy)·(f(s1) + 0.125·f(s2))
    if qt == IQ1_S:
        D.dec_iq1_s(w, o, codes, aux)
        d = f16_at(w, o)
    else:
        D.dec_iq1_m(w, o, codes, aux)
        d = half_to_f32((ld_u16(w, o + 48) >> 12) | ((ld_u16(w, o + 50) >> 8) & 0xF0)
                        | ((ld_u16(w, o + 52) >> 4) & 0xF00) | (ld_u16(w, o + 54) & 0xF000))
    for t in range(T):
        ao = t * arow + 292 * b
        s1 = np.float32(dot_i16_i8_256(codes, 0, a, ao + 4))
        if qt == IQ1_S:   # sumi1 = Σ ±ls·bsums
            s2 = np.float32(dot_i32_i16_16(aux, 0, a, ao + 260))
        else:             # sumi2 = Σ ls·(±1)·a
            s2 = np.float32(dot_i16_i8_256(codes, 512, a, ao + 4))
        acc[t] += (d * dy[t * nba + b]) * (s1 + _F0125 * s2)


@njit(inline="always")
def blk_iq4_xs(w, o, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt):  # per unit: ((d·dy)·f(ls))·f(sumi)
    D.dec_iq4_xs(w, o, codes, aux)
    d = f16_at(w, o)
    for t in range(T):
        ao = t * arow + 292 * b + 4
        d4d8 = d * dy[t * nba + b]
        for s in range(8):
            acc[t] += (d4d8 * np.float32(aux[s])) * np.float32(dot_i8_i8_32(codes, 32 * s, a, ao + 32 * s))


# K-quants in runs at every T (1.2-1.3x _loop at T = 2..8), a full job of eight tokens sharing each block's
# unpacking; grid i-quants in runs at T = 1 only (re-deriving a grid block per token: 1.8x slower at T = 8)
@njit(nogil=True, cache=True)
def rows_q4_k(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    if T == 8:
        _loop_runs8(RN.q4_k_x4_t8, RN.q4_k_x3_t8, RN.q4_k_x2_t8, RN.q4_k_x1_t8, 144, w, wrow, r0, r1, a, arow, out,
                    ostride, ws)
    else:
        _loop_runs(RN.q4_k_x4, RN.q4_k_x3, RN.q4_k_x2, RN.q4_k_x1, 144, w, wrow, r0, r1, a, arow, T, out, ostride, ws)


@njit(nogil=True, cache=True)
def rows_q5_k(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    if T == 8:
        _loop_runs8(RN.q5_k_x4_t8, RN.q5_k_x3_t8, RN.q5_k_x2_t8, RN.q5_k_x1_t8, 176, w, wrow, r0, r1, a, arow, out,
                    ostride, ws)
    else:
        _loop_runs(RN.q5_k_x4, RN.q5_k_x3, RN.q5_k_x2, RN.q5_k_x1, 176, w, wrow, r0, r1, a, arow, T, out, ostride, ws)


@njit(nogil=True, cache=True)
def rows_q6_k(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    if T == 8:
        _loop_runs8(RN.q6_k_x4_t8, RN.q6_k_x3_t8, RN.q6_k_x2_t8, RN.q6_k_x1_t8, 210, w, wrow, r0, r1, a, arow, out,
                    ostride, ws)
    else:
        _loop_runs(RN.q6_k_x4, RN.q6_k_x3, RN.q6_k_x2, RN.q6_k_x1, 210, w, wrow, r0, r1, a, arow, T, out, ostride, ws)


@njit(nogil=True, cache=True)
def rows_iq2(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    """IQ2_XXS, IQ2_XS, IQ2_S; the type passed as a constant per branch."""
    if qt == IQ2_XXS:
        if T == 1:
            _loop_runs(RN.iq2_xxs_x4, RN.iq2_xxs_x3, RN.iq2_xxs_x2, RN.iq2_xxs_x1, 66, w, wrow, r0, r1, a, arow, T, out, ostride, ws)
        else:
            _loop(blk_single, 66, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, IQ2_XXS, ws)
    elif qt == IQ2_XS:
        if T == 1:
            _loop_runs(RN.iq2_xs_x4, RN.iq2_xs_x3, RN.iq2_xs_x2, RN.iq2_xs_x1, 74, w, wrow, r0, r1, a, arow, T, out, ostride, ws)
        else:
            _loop_token_groups(RN.iq2_xs_x4, RN.iq2_xs_x3, RN.iq2_xs_x2, RN.iq2_xs_x1, RN.iq2_xs_x2_t8,
                               RN.iq2_xs_x1_t8, RN.iq2_xs_x2_t4, RN.iq2_xs_x1_t4, RN.iq2_xs_x2_t2, RN.iq2_xs_x1_t2, 74,
                               w, wrow, r0, r1, a, arow, T, out, ostride, ws)
    elif T == 1:
        _loop_runs(RN.iq2_s_x4, RN.iq2_s_x3, RN.iq2_s_x2, RN.iq2_s_x1, 82, w, wrow, r0, r1, a, arow, T, out, ostride, ws)
    else:
        _loop(blk_single, 82, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, IQ2_S, ws)


@njit(nogil=True, cache=True)
def rows_iq3(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    """IQ3_XXS and IQ3_S; the type passed as a constant per branch."""
    if qt == IQ3_S:
        if T == 1:
            _loop_runs(RN.iq3_s_x4, RN.iq3_s_x3, RN.iq3_s_x2, RN.iq3_s_x1, 110, w, wrow, r0, r1, a, arow, T, out, ostride, ws)
        else:
            _loop(blk_single, 110, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, IQ3_S, ws)
    elif T == 1:
        _loop_runs(RN.iq3_xxs_x4, RN.iq3_xxs_x3, RN.iq3_xxs_x2, RN.iq3_xxs_x1, 98, w, wrow, r0, r1, a, arow, T, out, ostride, ws)
    else:
        _loop(blk_single, 98, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, IQ3_XXS, ws)


@njit(nogil=True, cache=True)
def rows_k_other(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    """Q2_K, Q3_K, IQ4_XS, IQ1_S, IQ1_M: one block loop each; the type passed as a constant per branch."""
    if qt == Q2_K:
        _loop(blk_mins, 84, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, Q2_K, ws)
    elif qt == Q3_K:
        _loop(blk_single, 110, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, Q3_K, ws)
    elif qt == IQ4_XS:
        _loop(blk_iq4_xs, 136, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, IQ4_XS, ws)
    elif qt == IQ1_S:
        _loop(blk_iq1, 50, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, IQ1_S, ws)
    else:
        _loop(blk_iq1, 56, 292, 1, w, wrow, r0, r1, a, arow, T, out, ostride, IQ1_M, ws)


@njit(inline="always")
def _fval(qt, buf, off):
    """One float weight/activation of type F32, F16 or BF16 at byte `off`, as float32."""
    if qt == F32_T:
        return ld_f32(buf, off)
    if qt == F16_T:
        return f16_at(buf, off)
    return bits_f32(ld_u16(buf, off) << 16)


@njit(nogil=True, cache=True)
def rows_float(qt, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    """F32/F16/BF16 (``ggml_vec_dot_f16`` & co.): y = f32(Σ_k f64(f32(w_k·a_k))), k in order, from +0.0."""
    es = 4 if qt == F32_T else 2
    k = wrow // es
    acc = ws[0:8 * MAXT].view(np.float64)
    r = r0
    while T == 1 and r + 4 <= r1:   # one token: four rows' sums side by side (four dependency chains, same order)
        s0, s1, s2, s3 = 0.0, 0.0, 0.0, 0.0
        for i in range(k):
            av = _fval(qt, a, es * i)
            s0 += np.float64(_fval(qt, w, r * wrow + es * i) * av)
            s1 += np.float64(_fval(qt, w, (r + 1) * wrow + es * i) * av)
            s2 += np.float64(_fval(qt, w, (r + 2) * wrow + es * i) * av)
            s3 += np.float64(_fval(qt, w, (r + 3) * wrow + es * i) * av)
        out[r], out[r + 1], out[r + 2], out[r + 3] = np.float32(s0), np.float32(s1), np.float32(s2), np.float32(s3)
        r += 4
    for r in range(r, r1):
        for t in range(T):
            acc[t] = 0.0
        for i in range(k):
            wv = _fval(qt, w, r * wrow + es * i)
            for t in range(T):
                acc[t] += np.float64(wv * _fval(qt, a, t * arow + es * i))
        for t in range(T):
            out[t * ostride + r] = np.float32(acc[t])
