"""Checked host wrappers around the Numba kernels (STYLE point 6): dtype, shape and contiguity are asserted here,
once, and the kernels run on flat buffers. Single-threaded; the pool (pool.py) runs the same kernels in parallel.

  quantize_act(x [T, K] f32, act) -> uint8 [T, row_bytes]        ggml's reference activation quantisers
  rows(w [N, row_bytes] u8, qtype, r0, r1, a [T, arow] u8, out [T, N] f32)   rows r0..r1 of one weight
  q8_matmul(x [T, K] f32, w [N, row_bytes] u8, qtype) -> [T, N] f32          the q8 path, = strata.quants.q8_matmul
  swiglu(g [T, F] f32, u [T, F] f32) -> h [T, F] f32
"""

from __future__ import annotations

import numpy as np

from strata import quants
from strata.accel.cpu import act as A
from strata.accel.cpu.loops import workspace
from strata.accel.cpu.entry import family
from strata.accel.cpu.rows import MAXT

SUPPORTED = tuple(c.qtype for c in quants.registered() if c.weight)


def vec_dot_type(qtype: int) -> int:
    return quants.get(qtype).vec_dot_type


def row_bytes(qtype: int, k: int) -> int:
    return quants.get(qtype).row_bytes(k)


def as_bytes(w: np.ndarray) -> np.ndarray:
    """A weight's rows as C-contiguous uint8 [N, row_bytes] (typed F32/F16 views are reinterpreted, not copied)."""
    w = np.asarray(w)
    if w.ndim == 1:
        w = w.reshape(1, -1)
    if not w.flags.c_contiguous:
        raise ValueError("weight rows must be C-contiguous (a GGUF view or an arena slice)")
    return w.view(np.uint8).reshape(w.shape[0], -1)


def quantize_act(x: np.ndarray, act: int) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError(f"activations must be [T, K], got {x.shape}")
    t, k = x.shape
    rb = A.act_row_bytes(act, k)
    out = np.empty((t, rb), np.uint8)
    A.quantize_rows(act, x.reshape(-1), 0, k, t, k, out.reshape(-1), 0, rb)
    return out


def rows(w: np.ndarray, qtype: int, r0: int, r1: int, a: np.ndarray, out: np.ndarray) -> None:
    """out[:, r0:r1] = rows r0..r1 of the weight `w` against the quantised activations `a` (T <= MAXT)."""
    w = as_bytes(w)
    if qtype not in SUPPORTED:
        raise quants.UnsupportedQuantType(f"{quants.type_name(qtype)} has no CPU kernel")
    if a.dtype != np.uint8 or a.ndim != 2 or not a.flags.c_contiguous:
        raise ValueError(f"activations must be C-contiguous uint8 [T, row_bytes], got {a.dtype} {a.shape}")
    if out.dtype != np.float32 or out.ndim != 2 or not out.flags.c_contiguous or out.shape[0] != a.shape[0]:
        raise ValueError(f"out must be C-contiguous float32 [T, N] with T = {a.shape[0]}")
    if not (0 <= r0 <= r1 <= min(w.shape[0], out.shape[1])) or a.shape[0] > MAXT:
        raise ValueError(f"rows [{r0}, {r1}) or T = {a.shape[0]} outside the weight/out/MAXT={MAXT} bounds")
    family(qtype)(qtype, w.reshape(-1), w.shape[1], r0, r1, a.reshape(-1), a.shape[1], a.shape[0],
                out.reshape(-1), out.shape[1], workspace())


def q8_matmul(x: np.ndarray, w: np.ndarray, qtype: int) -> np.ndarray:
    """The q8 path of docs/NUMERICS.md for any T (in groups of MAXT rows): [T, K] · [N, K]ᵀ -> [T, N]."""
    w = as_bytes(w)
    x = np.ascontiguousarray(x, np.float32)
    t, k = x.shape
    if row_bytes(qtype, k) != w.shape[1]:
        raise ValueError(f"{quants.type_name(qtype)} rows of {w.shape[1]} bytes do not hold {k} values")
    a = quantize_act(x, vec_dot_type(qtype))
    out = np.empty((t, w.shape[0]), np.float32)
    for t0 in range(0, t, MAXT):
        t1 = min(t, t0 + MAXT)
        rows(w, qtype, 0, w.shape[0], a[t0:t1], out[t0:t1])
    return out


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    g = np.array(g, np.float32, order="C", copy=True)
    u = np.ascontiguousarray(u, np.float32)
    assert g.shape == u.shape, f"gate {g.shape} and up {u.shape} differ"
    A.swiglu(g.reshape(-1), 0, u.reshape(-1), 0, g.size)
    return g
