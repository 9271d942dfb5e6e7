"""The non-matmul parts of a layer in Numba, bit-identical to strata/reference/linalg.py (docs/NUMERICS.md):
RMSNorm, softmax in float64, and causal GQA attention over the CPU backend's KV cache.

Every reduction keeps the reference's order (Numba without fastmath neither reorders nor fuses float ops);
where the reference sums over one index for many outputs at once, the loops here run that index outermost and
vectorise across the outputs instead, which changes nothing in any single sum.
Legend: T tokens, S cached positions, H/Hkv heads, hd head size, K row length.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.accel.cpu.act import exp64


@njit(nogil=True, cache=True)
def rms_norm_rows(x, w, eps, out):
    """x, out [R, K] f32; w [K]: out = f32(f32(x·r)·w), r = 1/sqrt(Σ_k f64(x_k)² / K + eps), k in order."""
    r_, k = x.shape
    for i in range(r_):
        ss = 0.0
        for j in range(k):
            v = np.float64(x[i, j])
            ss += v * v
        r = 1.0 / np.sqrt(ss / k + eps)
        for j in range(k):
            out[i, j] = np.float32(np.float64(x[i, j]) * r) * w[j]


@njit(inline="always")
def _softmax_into(x, n, e):
    """e[:n] = softmax of x[:n] (float64): max, exp64(x − max), sum in index order from 0, divide."""
    m = -np.inf
    for i in range(n):
        if x[i] > m:
            m = x[i]
    s = 0.0
    for i in range(n):
        e[i] = exp64(x[i] - m)
        s += e[i]
    for i in range(n):
        e[i] = e[i] / s


@njit(nogil=True, cache=True)
def softmax_rows(x, out):
    """x [R, N] (f32 or f64) -> out [R, N] f64, softmax over each row (reference `softmax64`)."""
    row = np.empty(x.shape[1], np.float64)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            row[j] = np.float64(x[i, j])
        _softmax_into(row, x.shape[1], out[i])


@njit(nogil=True, cache=True)
def attention_heads(q, kt, v, pos, n_pos, h0, h1, out):
    """Heads h0..h1 of causal GQA attention (reference `linalg.attention`).

    q [T, H, hd] f32 (after RoPE); kt [Hkv, hd, C] f32 (the K cache, transposed); v [Hkv, C, hd] f32; pos [T]
    positions of the queries; n_pos = S cached positions read; out [T, H·hd] f32.
    score_s = (Σ_d f64(q_d)·f64(k_sd), d in order) / sqrt(hd); positions s > pos[t] are masked to −inf;
    p = softmax (float64); out = Σ_s p_s·f64(v_s), s in order, rounded to f32.
    """
    T, H, hd = q.shape
    g = H // kt.shape[0]
    sc = np.empty(n_pos, np.float64)
    p = np.empty(n_pos, np.float64)
    acc = np.empty(hd, np.float64)
    scale = np.sqrt(np.float64(hd))
    for h in range(h0, h1):
        kv = h // g
        for t in range(T):
            for s in range(n_pos):
                sc[s] = 0.0
            for d in range(hd):
                qd = np.float64(q[t, h, d])
                for s in range(n_pos):
                    sc[s] += qd * np.float64(kt[kv, d, s])
            for s in range(n_pos):
                sc[s] = sc[s] / scale if s <= pos[t] else -np.inf
            _softmax_into(sc, n_pos, p)
            for d in range(hd):
                acc[d] = 0.0
            for s in range(n_pos):
                ps = p[s]
                for d in range(hd):
                    acc[d] += ps * np.float64(v[kv, s, d])
            for d in range(hd):
                out[t, h * hd + d] = np.float32(acc[d])
