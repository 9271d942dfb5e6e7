"""The small per-layer steps between the pool's batches, in Numba so a decoded token costs a handful of calls per
layer rather than dozens of numpy ones: top-k, renormalisation, RoPE, the routed experts' plan rows and the
k-ordered combine. Each equals the reference's numpy code (strata/reference/ops.py, linalg.py) to the bit.
Legend: T tokens, E experts, K top-k, D hidden, H heads, hd head size, J jobs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.accel.cpu._llvm import data_addr
from strata.accel.cpu._sched import J_N, J_OUT, J_X, JF

_J_GW = 1  # gate, up and down weight addresses are plan columns 1, 2, 3 (_sched.J_GW..J_DW)


@njit(nogil=True, cache=True)
def topk_rows(probs, k):
    """probs [T, E] f32 -> (ids int32 [T, K], w f32 [T, K]): the k largest, ties to the lower id (the reference's
    stable argsort of −probs)."""
    T, E = probs.shape
    ids = np.empty((T, k), np.int32)
    w = np.empty((T, k), np.float32)
    taken = np.zeros(E, np.bool_)
    for t in range(T):
        taken[:] = False
        for j in range(k):
            best = -1
            for e in range(E):
                if not taken[e] and (best < 0 or probs[t, e] > probs[t, best]):
                    best = e
            taken[best] = True
            ids[t, j] = best
            w[t, j] = probs[t, best]
    return ids, w


@njit(nogil=True, cache=True)
def renorm_rows(w):
    """w / Σ_k w (the sum in float32, k in order from +0.0)."""
    T, K = w.shape
    out = np.empty_like(w)
    for t in range(T):
        s = np.float32(0.0)
        for k in range(K):
            s += w[t, k]
        for k in range(K):
            out[t, k] = w[t, k] / s
    return out


@njit(nogil=True, cache=True)
def rope_rows(x, cos, sin, pos, n_rot, neox):
    """x [T, H, hd] f32 rotated at positions pos [T] (linalg.rope: float32 a·c − b·s, a·s + b·c)."""
    T, H, hd = x.shape
    out = x.copy()
    half = n_rot // 2
    for t in range(T):
        p = pos[t]
        for h in range(H):
            for i in range(half):
                ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
                a, b = x[t, h, ia], x[t, h, ib]
                c, s = cos[p, i], sin[p, i]
                out[t, h, ia] = a * c - b * s
                out[t, h, ib] = a * s + b * c
    return out


@njit(nogil=True, cache=True)
def expert_plan(ids, row, base, stride, h, maxt):
    """Plan rows for the routed experts of a batch: (t, k) pairs ordered by expert (stable), split into jobs of at
    most `maxt` rows. Returns (plan [J, JF], owner [J], order [T·K], xs [rows, D] inputs, dm [T·K, D] outputs).
    order[r] = t·K + k of output row r. One token (decode): every job reads h itself and shares one quantisation."""
    T, K = ids.shape
    D = h.shape[1]
    n = T * K
    order = np.argsort(ids.reshape(-1).astype(np.int64), kind="mergesort")
    dm = np.empty((n, D), np.float32)
    shared = T == 1
    for r in range(1, n):   # one token and K distinct experts (top-k's ids are): every job is that one row
        if ids.reshape(-1)[order[r]] == ids.reshape(-1)[order[r - 1]]:
            shared = False
    if shared:
        xs = h
    else:
        xs = np.empty((n, D), np.float32)
        for r in range(n):
            xs[r] = h[order[r] // K]   # one token with a repeated expert lands here too (rows of h repeated)
    nj = 0
    r = 0
    while r < n:   # count jobs
        e = ids.reshape(-1)[order[r]]
        c = 0
        while r < n and ids.reshape(-1)[order[r]] == e and c < maxt:
            r += 1
            c += 1
        nj += 1
    plan = np.empty((nj, JF), np.int64)
    owner = np.zeros(nj, np.int64)
    j = 0
    r = 0
    while r < n:
        e = ids.reshape(-1)[order[r]]
        r0 = r
        while r < n and ids.reshape(-1)[order[r]] == e and r - r0 < maxt:
            r += 1
        plan[j] = row
        for m in range(3):
            plan[j, _J_GW + m] = base[m] + e * stride[m]
        plan[j, J_N] = r - r0
        plan[j, J_OUT] = data_addr(dm) + r0 * D * 4
        if shared:
            plan[j, J_X] = data_addr(h)
        else:
            plan[j, J_X] = data_addr(xs) + r0 * D * 4
            owner[j] = j
        j += 1
    return plan, owner, order, xs, dm


@njit(nogil=True, cache=True)
def combine(dm, order, w):
    """out[t] = Σ_k w[t, k]·Dm[row(t, k)] in float32, k in order from +0.0 (SPEC §3)."""
    T, K = w.shape
    D = dm.shape[1]
    row = np.empty(T * K, np.int64)
    for r in range(T * K):
        row[order[r]] = r
    out = np.zeros((T, D), np.float32)
    for t in range(T):
        for k in range(K):
            wk = w[t, k]
            src = row[t * K + k]
            for d in range(D):
                out[t, d] = out[t, d] + wk * dm[src, d]
    return out


def warm() -> None:
    """Compile (or load) the steps above and dense.py's row steps with the argument types CpuEngine passes (a
    machine's first run does this in a process of its own: warm.py). The norm weight is read-only, as mapped."""
    from strata.accel.cpu.dense import rms_norm_rows, softmax_rows

    T, K, D, H, hd = 2, 2, 8, 2, 4
    x = np.ones((T, D), np.float32)
    nw = np.ones(D, np.float32)
    nw.flags.writeable = False
    rms_norm_rows(x, nw, 1e-6, np.empty_like(x))
    softmax_rows(x, np.empty((T, D), np.float64))
    ids, w = topk_rows(np.ascontiguousarray(x, np.float32), K)
    renorm_rows(np.ascontiguousarray(w, np.float32))
    rope_rows(np.ones((T, H, hd), np.float32), np.ones((4, hd // 2), np.float32), np.zeros((4, hd // 2), np.float32),
              np.arange(T, dtype=np.int64), hd, True)
    plan, owner, order, xs, dm = expert_plan(np.array([[0, 1], [1, 0]], np.int32), np.zeros(JF, np.int64),
                                             np.zeros(3, np.int64), np.ones(3, np.int64), x, 8)
    combine(dm, order, np.ones((T, K), np.float32))
