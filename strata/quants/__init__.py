"""ggml quant types: one registered class per type (see base.py), activation quantisers, q8-path dots.

Public helpers (shapes: R rows, K row length, T activation rows, N weight rows):
  dequantize(data, qtype, shape) -> float32 array of ``shape``
  quantize_rows(x [R, K], qtype) -> uint8 [R, row_bytes]
  quantize_act(x [T, K], act_qtype) -> uint8 [T, row_bytes]   (ggml's reference activation quantisers)
  q8_matmul(x [T, K], w [N, row_bytes], qtype) -> float32 [T, N]   (the q8 path of docs/NUMERICS.md)
"""

from __future__ import annotations

import numpy as np

# importing the family modules registers their classes
from strata.quants import act, floats, iq1, iq4, iquants, kquants, legacy, q2_0  # noqa: F401
from strata.quants.base import QuantType, UnsupportedQuantType, get, registered, type_name

__all__ = [
    "QuantType",
    "UnsupportedQuantType",
    "get",
    "registered",
    "type_name",
    "dequantize",
    "quantize_rows",
    "quantize_act",
    "q8_matmul",
]


def dequantize(data: np.ndarray, qtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw tensor data (uint8 bytes, or the typed array GGUFReader gives for F32/F16) -> float32 ``shape``.

    ``shape`` is numpy order (ggml's ne reversed). The byte count must be exactly ggml's for that shape:
    a mismatch is an error (ggml id 42 is Q2_0 here, 64 weights in 18 bytes; forks reuse 42 for a
    128-weight/34-byte layout).
    """
    cls = get(qtype)
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if n % cls.block_size or raw.size != n // cls.block_size * cls.type_size:
        raise ValueError(
            f"{cls.name} tensor of shape {shape} needs {n // cls.block_size * cls.type_size} bytes "
            f"({cls.block_size} weights per {cls.type_size}-byte block), got {raw.size}"
        )
    return cls.dequantize(raw.reshape(-1, cls.type_size)).reshape(shape)


def quantize_rows(x: np.ndarray, qtype: int) -> np.ndarray:
    """x [R, K] float32 -> [R, row_bytes] uint8 with the type's encoder (ggml's where defined)."""
    cls = get(qtype)
    x = np.asarray(x, np.float32)
    assert x.ndim == 2, f"quantize_rows takes [R, K], got {x.shape}"
    row = cls.row_bytes(x.shape[1])
    return cls.quantize(x.reshape(-1, cls.block_size)).reshape(x.shape[0], row)


def quantize_act(x: np.ndarray, act_qtype: int) -> np.ndarray:
    """Activation rows x [T, K] float32 -> [T, row_bytes] in a ``vec_dot_type`` (F32, F16, BF16, Q8_0, Q8_1,
    Q8_K), with ggml's reference quantiser (``quantize_row_q8_*_ref``, rounding included)."""
    if int(act_qtype) not in _ACT_TYPES:
        raise UnsupportedQuantType(f"{type_name(act_qtype)} is not an activation (vec_dot) type")
    return quantize_rows(x, act_qtype)


def q8_matmul(x: np.ndarray, w: np.ndarray, qtype: int) -> np.ndarray:
    """The q8 path: quantise x [T, K] to the weight type's ``vec_dot_type``, then ``vec_dot`` with the weight
    rows w [N, row_bytes] -> [T, N] float32."""
    cls = get(qtype)
    if not cls.weight:
        raise UnsupportedQuantType(f"{cls.name} is an activation format, not a weight type")
    x = np.asarray(x, np.float32)
    t, k = x.shape
    a = quantize_act(x, cls.vec_dot_type)
    av = get(cls.vec_dot_type)
    w = np.asarray(w).reshape(w.shape[0], -1, cls.type_size)
    if w.shape[1] * cls.block_size != k:
        raise ValueError(f"{cls.name} weight rows hold {w.shape[1] * cls.block_size} values, x rows {k}")
    return cls.vec_dot(w, a.reshape(t, -1, av.type_size))


_ACT_TYPES = (0, 1, 30, 8, 9, 15)  # F32, F16, BF16, Q8_0, Q8_1, Q8_K
