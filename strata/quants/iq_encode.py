"""Shared pieces of our i-quant encoders (valid encodings, not ggml's search): nearest grid point, sign parity.

Deterministic on every machine: distances are elementwise float32 sums in a fixed order (no BLAS), ties go
to the lowest grid index (``argmin``).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
_CHUNK = 2048  # target rows per distance table (bounds memory to ~chunk × grid × 4 bytes)


def nearest_grid(t: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """t [M, g] float32 targets, grid [n, g] -> (index [M] of the nearest grid row, squared distance [M])."""
    t = np.asarray(t, F32)
    g = grid.astype(F32)
    idx = np.empty(t.shape[0], np.int32)
    dist = np.empty(t.shape[0], F32)
    for s in range(0, t.shape[0], _CHUNK):
        tt = t[s : s + _CHUNK]
        acc = np.zeros((tt.shape[0], g.shape[0]), F32)
        for j in range(g.shape[1]):
            diff = tt[:, j, None] - g[None, :, j]
            acc += diff * diff
        idx[s : s + _CHUNK] = acc.argmin(axis=1)
        dist[s : s + _CHUNK] = np.take_along_axis(acc, idx[s : s + _CHUNK, None].astype(np.intp), axis=1)[
            :, 0
        ]
    return idx, dist


def even_signs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [B, 256] -> (neg bool [B, 256], magnitude target [B, 256]) with an even number of minus signs in every
    group of 8 (ggml's ksigns codes store 7 sign bits). Where a group is odd, its smallest |x| takes the other
    sign and a magnitude target of 0 (the least wrong value), as ggml's quantisers flip the least important one.
    """
    b = x.shape[0]
    neg = (x < 0).reshape(b, 32, 8)
    mag = np.abs(x).astype(F32).reshape(b, 32, 8)
    odd = neg.sum(axis=2) % 2 == 1  # [B, 32]
    j = mag.argmin(axis=2)[..., None]  # [B, 32, 1]
    flip = np.zeros_like(neg)
    np.put_along_axis(flip, j, odd[..., None], axis=2)
    return (neg ^ flip).reshape(b, 256), np.where(flip, F32(0), mag).reshape(b, 256)


def sign_bytes(neg: np.ndarray) -> np.ndarray:
    """neg bool [B, 256] -> [B, 32] bytes, bit j of byte k = sign of weight 8k + j."""
    return np.packbits(neg.reshape(neg.shape[0], 32, 8), axis=2, bitorder="little")[..., 0]


def affine_scale(
    s: np.ndarray, alpha: float, beta: float, lmax: int, to_f16
) -> tuple[np.ndarray, np.ndarray]:
    """Sub-block scales s [B, S] >= 0 -> (d [B] as its fp16 value, l [B, S] in 0..lmax) so that
    d·(alpha·l + beta) ≈ s (the i-quants' 4-bit/3-bit sub-scale forms)."""
    d = to_f16(s.max(axis=1) / F32(alpha * lmax + beta))
    q = np.divide(s, d[:, None], out=np.zeros_like(s, dtype=F32), where=d[:, None] != 0)
    return d, np.clip(np.rint((q - F32(beta)) / F32(alpha)), 0, lmax).astype(np.int32)
