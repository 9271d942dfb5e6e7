"""Transcendentals both engines evaluate with the same IEEE operations (docs/NUMERICS.md).

`exp64` is a Cody–Waite range reduction plus a degree-13 Taylor polynomial in Horner form: only +, ×, floor
and ldexp, each exact or correctly rounded, so numpy (elementwise) and Numba (the scalar twin, no fastmath)
give identical bits on every machine. Relative error < 1e-16 on the reduced range |r| <= ln2/2.
"""

from __future__ import annotations

import math

import numpy as np

_LN2_HI = 0.6931471803691238164901733398437500        # ln2 split so n·LN2_HI is exact for |n| < 2^20
_LN2_LO = 1.9082149292705877000220491853e-10
_INV_LN2 = 1.4426950408889634073599246810019
_X_MAX, _X_MIN = 709.0, -745.0
# 1/k! for k = 13 .. 0 (Horner order)
_C = tuple(1.0 / math.factorial(k) for k in range(13, -1, -1))


def exp64(x: np.ndarray) -> np.ndarray:
    """e**x elementwise in float64 (arrays)."""
    x0 = np.asarray(x, dtype=np.float64)
    x = np.clip(x0, _X_MIN, _X_MAX)
    n = np.floor(x * _INV_LN2 + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = np.full_like(r, _C[0])
    for c in _C[1:]:
        p = p * r + c
    out = np.ldexp(p, n.astype(np.int32))
    out[x0 < _X_MIN] = 0.0            # e^-inf (masked scores) is exactly 0
    return out


def exp64_scalar(x: float) -> float:
    """The scalar twin of `exp64` (Numba compiles this one; keep the two op for op identical)."""
    if x > _X_MAX:
        x = _X_MAX
    elif x < _X_MIN:
        return 0.0
    n = math.floor(x * _INV_LN2 + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = _C[0]
    for i in range(1, 14):
        p = p * r + _C[i]
    return math.ldexp(p, int(n))


def silu32(g: np.ndarray) -> np.ndarray:
    """silu(g) = g / (1 + e^-g) from float32 g, in float64, rounded to float32."""
    g64 = g.astype(np.float64)
    return (g64 / (1.0 + exp64(-g64))).astype(np.float32)


def sigmoid32(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (1.0 / (1.0 + exp64(-x64))).astype(np.float32)


def rope_table(n_pos: int, n_rot: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n_pos, n_rot/2] float32: angle(p, i) = p · base^(-2i/n_rot) in float64, rounded once.

    ggml iterates theta *= theta_scale in float32 (ggml-cpu `rope_yarn`); we take the exact angle instead —
    within 1e-6 of it — and every Strata engine reads this one table, so they agree to the bit.
    """
    i = np.arange(n_rot // 2, dtype=np.float64)
    inv = base ** (-2.0 * i / n_rot)                                      # [n_rot/2]
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * inv[None, :]      # [P, n_rot/2]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
