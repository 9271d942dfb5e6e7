"""Activation formats of the q8 path: ggml's reference quantisers for Q8_0, Q8_1 and Q8_K, and their unpackers.

Every function mirrors the named C function of ggml/src/ggml-quants.c to the bit, rounding included:
Q8_0/Q8_1 round with C ``roundf`` (halves away from zero), Q8_K with ``nearest_int`` (halves to even).
Shapes: B = blocks, R = rows, K = row length.
"""

from __future__ import annotations

import numpy as np

from strata.quants import _common as C
from strata.quants.base import QuantType

F32 = np.float32


def q8_0_ref(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q8_0_ref``: [B, 32] float32 -> [B, 34] uint8 = fp16 d | int8 qs[32].

    d = amax / 127 (float32), id = 1/d (0 when d == 0), qs = roundf(x * id); d is stored as fp16 but
    the codes use the unrounded float32 id.
    """
    x = np.asarray(x, F32)
    amax = np.abs(x).max(axis=1)  # [B]
    d = amax / F32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    qs = C.roundf(x * idv[:, None]).astype(np.int8)  # [B, 32]
    out = np.empty((x.shape[0], 34), np.uint8)
    C.put_f16(out, 0, d)
    out[:, 2:] = qs.view(np.uint8)
    return out


def q8_1_ref(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q8_1_ref``: [B, 32] -> [B, 36] uint8 = fp16 d | fp16 s | int8 qs[32].

    As Q8_0, plus s = fp16(float(Σ qs) * d) with the float32 d.
    """
    x = np.asarray(x, F32)
    amax = np.abs(x).max(axis=1)
    d = amax / F32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    qs = C.roundf(x * idv[:, None]).astype(np.int8)
    s = C.i2f(qs.astype(np.int32).sum(axis=1)) * d
    out = np.empty((x.shape[0], 36), np.uint8)
    C.put_f16(out, 0, d)
    C.put_f16(out, 2, s)
    out[:, 4:] = qs.view(np.uint8)
    return out


def q8_k_ref(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q8_K_ref``: [B, 256] -> [B, 292] uint8 = f32 d | int8 qs[256] | int16 bsums[16].

    max = the first value of largest |x|; iscale = -127/max; qs = min(127, nearest_int(iscale * x));
    bsums[j] = Σ qs[16j:16j+16]; d = 1/iscale. An all-zero block gets d = 0 and qs = 0 (ggml leaves its
    bsums unwritten; ours are 0, and every dot multiplies them by d = 0).
    """
    x = np.asarray(x, F32)
    n = x.shape[0]
    imax = np.abs(x).argmax(axis=1)  # first index of the largest |x| (ggml's strict '>')
    mx = x[np.arange(n), imax]
    zero = mx == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, F32(0), F32(-127) / np.where(zero, F32(1), mx)).astype(F32)
        d = np.where(zero, F32(0), F32(1) / np.where(zero, F32(1), iscale)).astype(F32)
    qs = np.minimum(127, C.nearest_int(iscale[:, None] * x)).astype(np.int8)  # [B, 256]
    bsums = qs.reshape(n, 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)  # [B, 16]
    out = np.empty((n, 292), np.uint8)
    out[:, 0:4] = d.reshape(-1, 1).view(np.uint8)
    out[:, 4:260] = qs.view(np.uint8)
    out[:, 260:292] = bsums.view(np.uint8)
    return out


def unpack_q8_0(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[R, 34] Q8_0 blocks -> (d f32 [R], qs int8 [R, 32])."""
    return C.f16(a, 0), C.field(a, 2, 32, np.int8)


def unpack_q8_1(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[R, 36] Q8_1 blocks -> (d f32 [R], s f32 [R], qs int8 [R, 32])."""
    return C.f16(a, 0), C.f16(a, 2), C.field(a, 4, 32, np.int8)


def unpack_q8_k(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[R, 292] Q8_K blocks -> (d f32 [R], qs int8 [R, 256], bsums int16 [R, 16])."""
    return C.field(a, 0, 1, np.float32)[:, 0], C.field(a, 4, 256, np.int8), C.field(a, 260, 16, np.int16)


class Q8_1(QuantType, qtype=9):
    """Activation format of Q4_1/Q5_1 (``block_q8_1``): fp16 d, fp16 s = d·Σqs, int8 qs[32].

    ggml defines no ``to_float`` for it; ``dequantize`` gives d·qs (float32), for tests.
    """

    name = "Q8_1"
    block_size = 32
    type_size = 2 + 2 + 32
    weight = False

    @classmethod
    def dequantize(cls, blocks):
        d, _, qs = unpack_q8_1(C.as_blocks(cls, blocks))
        return d[:, None] * qs.astype(F32)

    @classmethod
    def quantize(cls, x):
        return q8_1_ref(np.asarray(x, F32).reshape(-1, 32))


class Q8_K(QuantType, qtype=15):
    """Activation format of the K- and i-quants (``block_q8_K``): f32 d, int8 qs[256], int16 bsums[16].

    ``dequantize`` is ggml's ``dequantize_row_q8_K``: d * qs in float32.
    """

    name = "Q8_K"
    block_size = 256
    type_size = 4 + 256 + 2 * 16
    weight = False

    @classmethod
    def dequantize(cls, blocks):
        d, qs, _ = unpack_q8_k(C.as_blocks(cls, blocks))
        return d[:, None] * qs.astype(F32)

    @classmethod
    def quantize(cls, x):
        return q8_k_ref(np.asarray(x, F32).reshape(-1, 256))
