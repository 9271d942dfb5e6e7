"""Float weights F32, F16, BF16: blocks of one value (ggml's ``ggml_vec_dot_f32/f16/bf16``).

On the q8 path the activation is rounded to the weight's own float type (``vec_dot_type``), each product is a
float32 ``w·a``, the products are summed in float64 (ggml_float) in k order from +0.0, and the sum is rounded
once to float32 (docs/NUMERICS.md).
"""

from __future__ import annotations

import numpy as np

from strata.quants import _common as C
from strata.quants.base import QuantType, get

_f32 = np.float32


class _Float(QuantType):
    """Shared q8-path dot and random blocks of the float types; subclasses give the byte conversion."""

    _dtype: type = np.float32  # the numpy type the bytes hold
    _bits: tuple[int, int, int] = (23, 8, 127)  # mantissa bits, exponent bits, exponent bias

    @classmethod
    def dequantize(cls, blocks):
        return cls._to_f32(C.as_blocks(cls, blocks)).reshape(-1, 1)

    @classmethod
    def _to_f32(cls, blocks):
        return blocks.view(cls._dtype).astype(_f32)

    @classmethod
    def _random(cls, rng, n_blocks, d):
        # Built from random bits, no float arithmetic: random sign and mantissa, exponent e0 + (0..3) with
        # 2^(e0 - bias) = 2^-2 · 2^round(log2 d), i.e. magnitudes in [2^-2, 2^2)·2^round(log2 d).
        mbits, ebits, bias = cls._bits
        e0 = bias - 2 + int(np.rint(np.log2(d)))
        if not (1 <= e0 and e0 + 3 <= 2**ebits - 2):
            raise ValueError(f"scale {d:g} does not fit {cls.name}")
        utype = np.uint32 if cls.type_size == 4 else np.uint16
        r = C.random_bytes(rng, n_blocks, cls.type_size).view(utype)
        keep = utype((1 << mbits) - 1 | 1 << (cls.type_size * 8 - 1))  # mantissa and sign bits
        r[:] = (r & keep) | ((utype(e0) + ((r >> utype(mbits)) & utype(3))) << utype(mbits))
        return r.view(np.uint8)

    @classmethod
    def vec_dot(cls, w, a):
        """y[t, n] = f32( Σ_k f64( f32(w[n, k] · a[t, k]) ) ), the sum in float64, k = 0.. in order."""
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        wf = cls._to_f32(w2).reshape(n, b)  # [N, K]
        af = get(cls.vec_dot_type)._to_f32(a2).reshape(t, b)  # [T, K]
        acc = np.zeros((t, n), np.float64)
        step = max(1, (1 << 20) // max(1, t * n))  # k-chunk: ~8 MB of float64 products at a time
        for k0 in range(0, b, step):
            p = (af.T[k0 : k0 + step, :, None] * wf.T[k0 : k0 + step, None, :]).astype(
                np.float64
            )  # [k, T, N]
            p[0] += acc
            # ufunc.accumulate is strictly sequential (r_i = r_{i-1} + p_i), unlike np.sum's pairwise sum
            acc = np.add.accumulate(p, axis=0)[-1]
        return acc.astype(_f32)


class F32(_Float, qtype=0):
    """IEEE float32, ``ggml_vec_dot_f32`` (activation stays float32)."""

    name = "F32"
    block_size = 1
    type_size = 4
    vec_dot_type = 0

    @classmethod
    def quantize(cls, x):
        return np.ascontiguousarray(np.asarray(x, _f32).reshape(-1, 1)).view(np.uint8)


class F16(_Float, qtype=1):
    """IEEE half, ``ggml_vec_dot_f16``; float32 -> fp16 rounds to nearest even (``GGML_FP32_TO_FP16``)."""

    name = "F16"
    block_size = 1
    type_size = 2
    vec_dot_type = 1
    _dtype = np.float16
    _bits = (10, 5, 15)

    @classmethod
    def quantize(cls, x):
        with np.errstate(over="ignore"):  # beyond fp16's range -> inf, like GGML_FP32_TO_FP16
            return np.asarray(x, _f32).reshape(-1, 1).astype(np.float16).view(np.uint8)


class BF16(_Float, qtype=30):
    """bfloat16, ``ggml_vec_dot_bf16``; float32 -> bf16 is ``ggml_compute_fp32_to_bf16`` (nearest even,
    NaN made quiet), byte-identical to ``gguf.quants.quantize`` (tested)."""

    name = "BF16"
    block_size = 1
    type_size = 2
    vec_dot_type = 30
    _bits = (7, 8, 127)

    @classmethod
    def _to_f32(cls, blocks):
        return (blocks.view(np.uint16).astype(np.uint32) << 16).view(_f32)

    @classmethod
    def quantize(cls, x):
        u = np.ascontiguousarray(np.asarray(x, _f32).reshape(-1, 1)).view(np.uint32)
        rounded = (u.astype(np.uint64) + (0x7FFF + ((u >> 16) & 1))) >> 16  # nearest, ties to even
        quiet_nan = (u >> 16) | 64
        h = np.where((u & 0x7FFFFFFF) > 0x7F800000, quiet_nan, rounded).astype(np.uint16)
        return h.view(np.uint8)
