"""The reference's arithmetic kernels, exactly as docs/NUMERICS.md defines them (no BLAS anywhere).

Legend: T tokens, N output rows, K inner size, S cached positions, H/Hkv heads, hd head size.
"""

from __future__ import annotations

import enum

import numpy as np

from strata import quants
from strata.mathfn import exp64, silu32

ROW_CHUNK = 4096          # weight rows per step: bounds the float64 scratch to K × 4096 × 8 bytes


class Path(enum.Enum):
    FLOAT = "float"   # exact dequantisation, float64 sums, rounded once (SPEC §2)
    Q8 = "q8"         # ggml's CPU semantics: quantised activations, integer block dots (SPEC §2)


def float_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, K] f32 · w [N, K] f32 (dequantised) -> [T, N] f32: f64 products summed in k order."""
    T, K = x.shape
    N = w.shape[0]
    out = np.empty((T, N), np.float32)
    x64 = x.astype(np.float64)
    for n0 in range(0, N, ROW_CHUNK):
        wt = w[n0:n0 + ROW_CHUNK].astype(np.float64).T.copy()           # [K, n] contiguous per k
        acc = np.zeros((T, wt.shape[1]), np.float64)                     # [T, n]
        for k in range(K):
            acc += x64[:, k:k + 1] * wt[k]                               # exact f64 product, one rounding per add
        out[:, n0:n0 + wt.shape[1]] = acc
    return out


def weight_rows(view: np.ndarray, qtype: int, r0: int, r1: int, k: int) -> np.ndarray:
    """Rows [r0, r1) of a 2-D weight, dequantised exactly -> [r1-r0, K] f32."""
    rows = view[r0:r1]
    if rows.dtype == np.float32:
        return np.asarray(rows, np.float32)
    if rows.dtype == np.float16:
        return rows.astype(np.float32)
    q = quants.get(qtype)
    return q.dequantize(np.ascontiguousarray(rows).reshape(-1, q.type_size)).reshape(r1 - r0, k)


def matmul(x: np.ndarray, view: np.ndarray, qtype: int, path: Path) -> np.ndarray:
    """x [T, K] f32 times the weight held in `view` ([N, row_bytes] bytes or typed [N, K]) -> [T, N] f32."""
    T, K = x.shape
    N = view.shape[0]
    out = np.empty((T, N), np.float32)
    for n0 in range(0, N, ROW_CHUNK):
        n1 = min(N, n0 + ROW_CHUNK)
        if path is Path.FLOAT:
            out[:, n0:n1] = float_matmul(x, weight_rows(view, qtype, n0, n1, K))
        else:
            w = np.ascontiguousarray(view[n0:n1])
            out[:, n0:n1] = quants.q8_matmul(x, w.view(np.uint8).reshape(n1 - n0, -1), qtype)
    return out


def swiglu_ffn(x, gate, up, down, path: Path) -> np.ndarray:
    """down(silu(gate·x) * (up·x)); gate/up/down = (view, qtype). x [T, D] -> [T, D] f32 (SPEC §1, NUMERICS)."""
    g = matmul(x, *gate, path)                                           # [T, F]
    u = matmul(x, *up, path)                                             # [T, F]
    h = silu32(g) * u                                                    # [T, F] f32
    return matmul(h, *down, path)                                        # [T, D]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Over the last axis: f32(f32(x / rms) · w), the mean of squares summed in order in float64."""
    x64 = x.astype(np.float64)
    ss = np.zeros(x.shape[:-1], np.float64)
    for k in range(x.shape[-1]):
        ss += x64[..., k] * x64[..., k]
    r = 1.0 / np.sqrt(ss / x.shape[-1] + eps)
    return (x64 * r[..., None]).astype(np.float32) * w


def softmax64(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 with sequential sums (x f32 or f64) -> f64."""
    x64 = x.astype(np.float64)
    e = exp64(x64 - x64.max(axis=-1, keepdims=True))
    s = np.zeros(x.shape[:-1], np.float64)
    for k in range(x.shape[-1]):
        s += e[..., k]
    return e / s[..., None]


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """x [T, H, hd] f32, cos/sin [T, n_rot/2] -> rotated copy; float32 ops as ggml (`rope_f32`)."""
    out = x.copy()
    c, s = cos[:, None, :], sin[:, None, :]                              # [T, 1, n_rot/2]
    if neox:   # pairs (i, i + n_rot/2)
        h = n_rot // 2
        a, b = x[..., :h], x[..., h:n_rot]
    else:      # pairs (2i, 2i + 1)
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    ra = a * c - b * s
    rb = a * s + b * c
    if neox:
        out[..., :h], out[..., h:n_rot] = ra, rb
    else:
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = ra, rb
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """Causal GQA attention. q [T, H, hd], k/v [S, Hkv, hd] (the cache so far), q_pos [T] -> [T, H*hd] f32.

    score = (Σ_d q·k in f64, d in order) / sqrt(hd); positions s > q_pos masked; softmax64; out = Σ_s p·v in s order.
    """
    T, H, hd = q.shape
    S, Hkv, _ = k.shape
    g = H // Hkv
    q64, k64, v64 = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    kh = np.repeat(k64, g, axis=1)                                       # [S, H, hd]
    vh = np.repeat(v64, g, axis=1)                                       # [S, H, hd]
    sc = np.zeros((T, H, S), np.float64)                                 # [T, H, S]
    for d in range(hd):
        sc += q64[:, :, d, None] * kh[:, :, d].T[None, :, :]
    sc /= np.sqrt(np.float64(hd))
    mask = np.arange(S)[None, :] > q_pos[:, None]                        # [T, S]
    sc[np.broadcast_to(mask[:, None, :], sc.shape)] = -np.inf
    p = softmax64(sc)                                                    # [T, H, S]
    out = np.zeros((T, H, hd), np.float64)
    for s in range(S):
        out += p[:, :, s, None] * vh[s][None, :, :]
    return out.astype(np.float32).reshape(T, H * hd)
