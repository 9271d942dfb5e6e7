"""The row kernels' C entry points, one per kernel family (rows.py), compiled the first time a type of the family
is used: a machine's first run compiles only the families its model has (a Q4_K_M model: Q4_K, Q6_K and, for the
CPU backend's dense weights, Q8_0). The pool's scheduler calls them through their addresses (`call_rows`), so it
never links, and never re-optimises, the kernels themselves.

    ensure(qt)        compile (or load from Numba's cache) the family of type qt, once per process
    table_address()   the int64[N_TYPES] table of entry addresses by type id (0: not compiled), for the pool's ctl
    family(qt)        the family's njit function, for host-side calls (kernels.rows)
"""

from __future__ import annotations

import threading

import numpy as np
from numba import carray, cfunc, types

from strata.accel.cpu import rows as R
from strata.accel.cpu._llvm import address

N_TYPES = 64           # ggml type ids are below this (MXFP4 39, Q2_0 42)

_CSIG = types.void(types.int64, types.voidptr, *[types.int64] * 4, types.voidptr, *[types.int64] * 3, types.voidptr,
                   types.int64, types.int64, types.voidptr, types.int64)   # see _llvm.call_rows


# one C wrapper a family: buffers arrive as (pointer, length) pairs and become arrays again. Written out, not made
# by a closure: Numba caches a function under its own name and line, so closures of one factory would share one
# cache index, which warm.py's children, compiling families at once, would overwrite in turn
def _c_q8_0(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_q8_0(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
                carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_q4_0(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_q4_0(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
                carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_q8_other(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_q8_other(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
                    carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_q4_k(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_q4_k(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
                carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_q5_k(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_q5_k(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
                carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_q6_k(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_q6_k(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
                carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_iq2(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_iq2(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
               carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_iq3(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_iq3(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
               carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_k_other(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_k_other(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
                   carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


def _c_float(qt, w, wn, wrow, r0, r1, a, an, arow, T, out, on, ostride, ws, wsn):
    R.rows_float(qt, carray(w, (wn,), np.uint8), wrow, r0, r1, carray(a, (an,), np.uint8), arow, T,
                 carray(out, (on,), np.float32), ostride, carray(ws, (wsn,), np.uint8))


# (njit function, C wrapper, type ids) of each family
FAMILIES = (
    (R.rows_q8_0, _c_q8_0, (R.Q8_0,)),
    (R.rows_q4_0, _c_q4_0, (R.Q4_0, R.IQ4_NL)),
    (R.rows_q8_other, _c_q8_other, (R.Q5_0, R.MXFP4, R.Q2_0, R.Q4_1, R.Q5_1)),
    (R.rows_q4_k, _c_q4_k, (R.Q4_K,)),
    (R.rows_q5_k, _c_q5_k, (R.Q5_K,)),
    (R.rows_q6_k, _c_q6_k, (R.Q6_K,)),
    (R.rows_iq2, _c_iq2, (R.IQ2_XXS, R.IQ2_XS, R.IQ2_S)),
    (R.rows_iq3, _c_iq3, (R.IQ3_XXS, R.IQ3_S)),
    (R.rows_k_other, _c_k_other, (R.Q2_K, R.Q3_K, R.IQ4_XS, R.IQ1_S, R.IQ1_M)),
    (R.rows_float, _c_float, (R.F32_T, R.F16_T, R.BF16_T)),
)
_OF = {qt: i for i, (_, _, ts) in enumerate(FAMILIES) for qt in ts}


class _Entries:
    """The process's compiled entry points (a cache, like Numba's own dispatchers: filled once, never emptied)."""

    def __init__(self):
        self.table = np.zeros(N_TYPES, np.int64)       # the scheduler reads it through its address, without the GIL
        self.keep: dict[int, object] = {}              # the cfunc objects keep their code alive
        self.lock = threading.Lock()


_ENTRIES = _Entries()


def family_of(qt: int) -> int:
    """The index in FAMILIES of type qt's family."""
    try:
        return _OF[int(qt)]
    except KeyError:
        raise ValueError(f"ggml type {qt} has no CPU row kernel") from None


def has_kernel(qt: int) -> bool:
    return int(qt) in _OF


def family(qt: int):
    """The compiled row function of a type (host-side dispatch)."""
    return FAMILIES[family_of(qt)][0]


def ensure(qt: int) -> None:
    """The family of type qt compiled (or loaded from Numba's cache) and its types' entries in the table."""
    i = family_of(qt)
    if i in _ENTRIES.keep:
        return
    with _ENTRIES.lock:
        if i not in _ENTRIES.keep:
            fn = cfunc(_CSIG, cache=True)(FAMILIES[i][1])
            _ENTRIES.keep[i] = fn
            for t in FAMILIES[i][2]:
                _ENTRIES.table[t] = fn.address


def table_address() -> int:
    """Address of the int64[N_TYPES] entry table (the pool's ctl word KFN)."""
    return address(_ENTRIES.table)
