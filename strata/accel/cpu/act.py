"""Activation side of the q8 path in Numba: ggml's reference quantisers (Q8_0, Q8_1, Q8_K), the float
`vec_dot_type` conversions (F16, BF16), fp16 <-> float32, and SwiGLU — each bit-identical to strata/quants/act.py,
strata/quants/floats.py and strata.mathfn (docs/NUMERICS.md).

Buffers are flat: x float32 [.., rows at xoff + t·xstride], dst uint8 [rows of `drow` bytes at doff + t·drow].
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.accel.cpu._llvm import f32_bits, st_u8, st_u16
from strata.mathfn import exp64_scalar

F32, F64 = np.float32, np.float64
Q8_0, Q8_1, Q8_K, F16, BF16, F32_T = 8, 9, 15, 1, 30, 0
_MAGIC = np.float32(12582912.0)  # 1.5·2^23: (v + M) − M rounds v to the nearest integer, halves to even
_F32_HALF = np.float32(0.5)

exp64 = njit(cache=True, nogil=True)(exp64_scalar)


# --- scalar conversions ------------------------------------------------------------------------------------------
@njit(inline="always")
def f32_to_f16(x):
    """float32 -> half bits, round to nearest even: numpy's `npy_floatbits_to_halfbits` step for step."""
    f = f32_bits(x)
    h_sgn = (f & 0x80000000) >> 16
    f_exp = f & 0x7F800000
    if f_exp >= 0x47800000:  # overflow, inf or NaN
        if f_exp == 0x7F800000 and (f & 0x007FFFFF) != 0:
            ret = 0x7C00 + ((f & 0x007FFFFF) >> 13)
            if ret == 0x7C00:
                ret += 1
            return h_sgn + ret
        return h_sgn + 0x7C00
    if f_exp <= 0x38000000:  # a half subnormal or zero
        if f_exp < 0x33000000:
            return h_sgn
        e = f_exp >> 23
        f_sig = (0x00800000 + (f & 0x007FFFFF)) >> (113 - e)
        if (f_sig & 0x00003FFF) != 0x00001000 or (f & 0x000007FF) != 0:
            f_sig += 0x00001000
        return h_sgn + (f_sig >> 13)
    h_exp = (f_exp - 0x38000000) >> 13
    f_sig = f & 0x007FFFFF
    if (f_sig & 0x00003FFF) != 0x00001000:
        f_sig += 0x00001000
    return h_sgn + ((f_sig >> 13) + h_exp)


@njit(inline="always")
def f32_to_bf16(x):
    """``ggml_compute_fp32_to_bf16``: NaN made quiet, otherwise round to nearest even."""
    n = f32_bits(x)
    if (n & 0x7FFFFFFF) > 0x7F800000:
        n = (n & 0xFFFF0000) | 0x00400000
    return ((n + (0x7FFF + ((n >> 16) & 1))) >> 16) & 0xFFFF


@njit(inline="always")
def roundf(v):
    """C roundf (halves away from zero), float32 in and out."""
    a = abs(v)
    fl = np.floor(a)
    r = fl + (np.float32(1.0) if a - fl >= _F32_HALF else np.float32(0.0))
    return -r if v < 0 else r


# --- block quantisers ---------------------------------------------------------------------------------------------
@njit(inline="always")
def _q8_0_block(x, p, dst, q, with_sum):
    """``quantize_row_q8_0_ref`` (Q8_1: ``quantize_row_q8_1_ref``, the fp16 s = f32(Σqs)·d after d)."""
    amax = np.float32(0.0)
    for j in range(32):
        ax = abs(x[p + j])
        if ax > amax:
            amax = ax
    d = amax / np.float32(127.0)
    idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
    qo = q + (4 if with_sum else 2)
    s = 0
    for j in range(32):
        qv = np.int64(roundf(x[p + j] * idv))
        st_u8(dst, qo + j, qv)
        s += qv
    st_u16(dst, q, f32_to_f16(d))
    if with_sum:
        st_u16(dst, q + 2, f32_to_f16(np.float32(s) * d))


@njit(inline="always")
def _q8_k_block(x, p, dst, q):
    """``quantize_row_q8_K_ref``: f32 d | int8 qs[256] | int16 bsums[16]; an all-zero block is all zeros."""
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(256):
        ax = abs(x[p + j])
        if ax > amax:
            amax = ax
            mx = x[p + j]
    if amax == 0:
        for j in range(292):
            st_u8(dst, q + j, 0)
        return
    iscale = np.float32(-127.0) / mx
    for g in range(16):
        bs = 0
        for j in range(16):
            v = iscale * x[p + 16 * g + j]
            qv = np.int64((v + _MAGIC) - _MAGIC)
            if qv > 127:
                qv = 127
            st_u8(dst, q + 4 + 16 * g + j, qv)
            bs += qv
        st_u16(dst, q + 260 + 2 * g, bs)
    dbits = f32_bits(np.float32(1.0) / iscale)
    for j in range(4):
        st_u8(dst, q + j, dbits >> (8 * j))


@njit(nogil=True, cache=True)
def quantize_rows(act, x, xoff, xstride, n, k, dst, doff, drow):
    """n rows of k floats (x[xoff + t·xstride + i]) -> `act` rows of drow bytes at dst[doff + t·drow]."""
    for t in range(n):
        p = xoff + t * xstride
        q = doff + t * drow
        if act == Q8_0 or act == Q8_1:
            bs = 34 if act == Q8_0 else 36
            for b in range(k // 32):
                _q8_0_block(x, p + 32 * b, dst, q + bs * b, act == Q8_1)
        elif act == Q8_K:
            for b in range(k // 256):
                _q8_k_block(x, p + 256 * b, dst, q + 292 * b)
        elif act == F16:
            for i in range(k):
                st_u16(dst, q + 2 * i, f32_to_f16(x[p + i]))
        elif act == BF16:
            for i in range(k):
                st_u16(dst, q + 2 * i, f32_to_bf16(x[p + i]))
        else:  # F32: the bytes as they are
            for i in range(k):
                bits = f32_bits(x[p + i])
                for j in range(4):
                    st_u8(dst, q + 4 * i + j, bits >> (8 * j))


@njit(inline="always")
def silu32(g):
    """silu(g) = f32(g / (1 + exp64(−g))) in float64 (strata.mathfn.silu32)."""
    g64 = np.float64(g)
    return np.float32(g64 / (1.0 + exp64(-g64)))


@njit(nogil=True, cache=True)
def swiglu(g, goff, u, uoff, n):
    """g[goff + i] = f32(silu(g) · u) for i < n, in place (docs/NUMERICS.md, per-expert q8 work)."""
    for i in range(n):
        g[goff + i] = silu32(g[goff + i]) * u[uoff + i]


ACT_BYTES = {Q8_0: (32, 34), Q8_1: (32, 36), Q8_K: (256, 292), F16: (1, 2), BF16: (1, 2), F32_T: (1, 4)}


def act_row_bytes(act: int, k: int) -> int:
    q, s = ACT_BYTES[act]
    assert k % q == 0, f"activation rows of {k} are not whole {q}-blocks of type {act}"
    return k // q * s
