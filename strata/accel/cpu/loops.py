"""The row loops every weight type shares: a workspace's views, the activation scales, and the loops over rows
(and tokens) that call a type's per-block formula (rows.py) or its block runs (runs.py, runs32.py).

Legend: T tokens (<= MAXT), Ba activation blocks per row, bs weight block bytes, ab activation block bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.accel.cpu._llvm import f16_at, ld_f32, prefetch

_F0 = np.float32(0.0)
PREFETCH_BYTES = 2048  # rows prefetch this far ahead (bench/cpu_pool.py: +5-15% at one token, out of cache)

WS_FIXED = 1024 + 64 + 64   # workspace bytes besides the scales: codes, aux, acc


def workspace(nbytes: int = 64 << 10) -> np.ndarray:
    """A kernel workspace (the pool gives each thread one per batch; a call whose scales do not fit allocates)."""
    return np.empty(nbytes, np.uint8)


@njit(nogil=True, cache=True)
def _carve(ws, T, nba):
    """Views of a workspace: codes int16[512], aux int32[16], acc f32[MAXT], dy/sy f32[T·Ba]."""
    need = WS_FIXED + 8 * T * nba
    if ws.size < need:
        ws = np.empty(need, np.uint8)
    codes = ws[0:1024].view(np.int16)
    aux = ws[1024:1088].view(np.int32)
    acc = ws[1088:1120].view(np.float32)
    dy = ws[WS_FIXED:WS_FIXED + 4 * T * nba].view(np.float32)
    sy = ws[WS_FIXED + 4 * T * nba:need].view(np.float32)
    return codes, aux, acc, dy, sy


@njit(nogil=True, cache=True)
def act_scales(a, arow, T, nba, ab, dy, sy):
    """Each activation block's scale (and Q8_1's s) as float32 into dy/sy [T, Ba]: ab is the activation block
    size, 34 (Q8_0, fp16 d), 36 (Q8_1, fp16 d and s) or 292 (Q8_K, f32 d)."""
    for t in range(T):
        for b in range(nba):
            ao = t * arow + ab * b
            dy[t * nba + b] = ld_f32(a, ao) if ab == 292 else f16_at(a, ao)
            sy[t * nba + b] = f16_at(a, ao + 2) if ab == 36 else _F0


@njit(inline="always")
def _loop(blk, bs, ab, apb, w, wrow, r0, r1, a, arow, T, out, ostride, qt, ws):
    """The row loop shared by every quantised type; `blk` adds one weight block's values to acc[:T].
    bs weight block bytes, ab activation block bytes, apb activation blocks per weight block; ws a workspace."""
    nba = wrow // bs * apb
    codes, aux, acc, dy, sy = _carve(ws, T, nba)   # codes: int8 codes or int16 scale·code products (decode.py)
    act_scales(a, arow, T, nba, ab, dy, sy)
    for r in range(r0, r1):
        prefetch(w, r * wrow + PREFETCH_BYTES, wrow)
        for t in range(T):
            acc[t] = _F0
        for b in range(nba // apb):
            blk(w, r * wrow + b * bs, a, arow, b, nba, T, dy, sy, acc, codes, aux, qt)
        for t in range(T):
            out[t * ostride + r] = acc[t]


@njit(inline="always")
def _loop_runs8(run4, run3, run2, run1, bs, w, wrow, r0, r1, a, arow, out, ostride, ws):
    """Eight tokens, Q8_K activations: runs.run_tokens, each weight block read and unpacked once for all eight
    (one token's sum per lane of acc, in block order as in _loop_runs)."""
    nb = wrow // bs
    codes, aux, acc, dy, sy = _carve(ws, 8, nb)
    act_scales(a, arow, 8, nb, 292, dy, sy)
    for r in range(r0, r1):
        prefetch(w, r * wrow + PREFETCH_BYTES, wrow)
        for t in range(8):
            acc[t] = _F0
        b = 0
        while b + 4 <= nb:
            run4(w, r * wrow + b * bs, a, 292 * b, arow, dy, b, nb, acc)
            b += 4
        if nb - b == 3:
            run3(w, r * wrow + b * bs, a, 292 * b, arow, dy, b, nb, acc)
        elif nb - b == 2:
            run2(w, r * wrow + b * bs, a, 292 * b, arow, dy, b, nb, acc)
        elif nb - b == 1:
            run1(w, r * wrow + b * bs, a, 292 * b, arow, dy, b, nb, acc)
        for t in range(8):
            out[t * ostride + r] = acc[t]


@njit(inline="always")
def _one_token_row(run4, run3, run2, run1, w, ro, bs, nb, a, ao, dy, bi):
    """One token's sum over a row's blocks (at byte ro): runs of four, then one run of the 1..3 left, from 0."""
    s = _F0
    b = 0
    while b + 4 <= nb:
        s = run4(w, ro + b * bs, a, ao + 292 * b, dy, bi + b, s)
        b += 4
    if nb - b == 3:
        s = run3(w, ro + b * bs, a, ao + 292 * b, dy, bi + b, s)
    elif nb - b == 2:
        s = run2(w, ro + b * bs, a, ao + 292 * b, dy, bi + b, s)
    elif nb - b == 1:
        s = run1(w, ro + b * bs, a, ao + 292 * b, dy, bi + b, s)
    return s


@njit(inline="always")
def _loop_runs(run4, run3, run2, run1, bs, w, wrow, r0, r1, a, arow, T, out, ostride, ws):
    """Q8_K activations, token by token: each row's blocks in runs of four, then one run of the 1..3 left
    (runs.py), the row's sum held in a register; the row's weights stay in L1 across its T tokens."""
    nb = wrow // bs
    codes, aux, acc, dy, sy = _carve(ws, T, nb)
    act_scales(a, arow, T, nb, 292, dy, sy)
    for r in range(r0, r1):
        prefetch(w, r * wrow + PREFETCH_BYTES, wrow)       # ahead of the hardware streamers (they stop at pages)
        for t in range(T):
            out[t * ostride + r] = _one_token_row(run4, run3, run2, run1, w, r * wrow, bs, nb, a, t * arow, dy, t * nb)


@njit(inline="always")
def _loop_runs32(run8, run4, run2, run1, bs, w, wrow, r0, r1, a, out, ws):
    """One token, Q8_0 activations: each row's 32-weight blocks in runs of eight, then runs of 4, 2, 1 for the
    rest (runs32.py), the row's sum in a register."""
    nb = wrow // bs
    codes, aux, acc, dy, sy = _carve(ws, 1, nb)
    act_scales(a, 0, 1, nb, 34, dy, sy)
    for r in range(r0, r1):
        prefetch(w, r * wrow + PREFETCH_BYTES, wrow)
        s = _F0
        b = 0
        while b + 8 <= nb:
            s = run8(w, r * wrow + b * bs, a, 34 * b, dy, b, s)
            b += 8
        if nb - b >= 4:
            s = run4(w, r * wrow + b * bs, a, 34 * b, dy, b, s)
            b += 4
        if nb - b >= 2:
            s = run2(w, r * wrow + b * bs, a, 34 * b, dy, b, s)
            b += 2
        if nb - b == 1:
            s = run1(w, r * wrow + b * bs, a, 34 * b, dy, b, s)
        out[r] = s


@njit(inline="always")
def _token_group(run2, run1, w, ro, bs, nb, a, ao, arow, dy, bi, acc):
    """One row's blocks, two at a time, for a group of tokens (runs.run_tokens: acc[t] of the group's token t)."""
    b = 0
    while b + 2 <= nb:
        run2(w, ro + b * bs, a, ao + 292 * b, arow, dy, bi + b, nb, acc)
        b += 2
    if b < nb:
        run1(w, ro + b * bs, a, ao + 292 * b, arow, dy, bi + b, nb, acc)


@njit(inline="always")
def _loop_token_groups(o4, o3, o2, o1, t8x2, t8x1, t4x2, t4x1, t2x2, t2x1, bs, w, wrow, r0, r1, a, arow, T, out,
                       ostride, ws):
    """Q8_K activations, T = 2..8 tokens in groups of 8, 4, 2 (runs.run_tokens: each weight block's decoding,
    grid lookups and signs made once per group) and a last single token (one-token runs). Every token's sum
    still starts at 0 and adds its blocks' values in block order, as in _loop_runs."""
    nb = wrow // bs
    codes, aux, acc, dy, sy = _carve(ws, T, nb)
    act_scales(a, arow, T, nb, 292, dy, sy)
    for r in range(r0, r1):
        prefetch(w, r * wrow + PREFETCH_BYTES, wrow)
        ro = r * wrow
        for t in range(T):
            acc[t] = _F0
        t0 = 0
        if T - t0 >= 8:
            _token_group(t8x2, t8x1, w, ro, bs, nb, a, t0 * arow, arow, dy, t0 * nb, acc[t0:])
            t0 += 8
        if T - t0 >= 4:
            _token_group(t4x2, t4x1, w, ro, bs, nb, a, t0 * arow, arow, dy, t0 * nb, acc[t0:])
            t0 += 4
        if T - t0 >= 2:
            _token_group(t2x2, t2x1, w, ro, bs, nb, a, t0 * arow, arow, dy, t0 * nb, acc[t0:])
            t0 += 2
        if T - t0 == 1:
            acc[t0] = _one_token_row(o4, o3, o2, o1, w, ro, bs, nb, a, t0 * arow, dy, t0 * nb)
        for t in range(T):
            out[t * ostride + r] = acc[t]
