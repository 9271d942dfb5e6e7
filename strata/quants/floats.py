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

    @classmethod
    def dequantize(cls, blocks):
        return cls._to_f32(C.as_blocks(cls, blocks)).reshape(-1, 1)

    @classmethod
    def _to_f32(cls, blocks):
        return blocks.view(cls._dtype).astype(_f32)

    @classmethod
    def _random(cls, rng, n_blocks, d):
        # uniform on [-sqrt(3), sqrt(3)]·d has RMS d; float32 draws are the cheap path
        with np.errstate(over="ignore"):
            amp = _f32(np.sqrt(3.0) * d)
            x = (rng.random(n_blocks, dtype=_f32) * _f32(2) - _f32(1)) * amp
            blocks = cls.quantize(x.reshape(-1, 1))
        if not (np.isfinite(amp) and np.isfinite(cls._to_f32(blocks)).all()):
            raise ValueError(f"scale {d:g} does not fit {cls.name}")
        return blocks

    @classmethod
    def vec_dot(cls, w, a):
        """y[t, n] = f32( Σ_k f64( f32(w[n, k] · a[t, k]) ) ), the sum in float64, k = 0.. in order."""
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        wf = cls._to_f32(w2).reshape(n, b)  # [N, K]
        af = get(cls.vec_dot_type)._to_f32(a2).reshape(t, b)  # [T, K]
        acc = np.zeros((t, n), np.float64)
        for k in range(b):
            acc += (af[:, k, None] * wf[None, :, k]).astype(np.float64)  # float32 product, exact widening
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

    @classmethod
    def quantize(cls, x):
        with np.errstate(over="ignore"):  # beyond fp16's range -> inf, like GGML_FP32_TO_FP16
            return np.asarray(x, _f32).reshape(-1, 1).astype(np.float16).view(np.uint8)


class BF16(_Float, qtype=30):
    """bfloat16, ``ggml_vec_dot_bf16``; float32 -> bf16 is ``ggml_compute_fp32_to_bf16`` (nearest even,
    NaN made quiet). Encoder: ``gguf.quants.quantize`` (the same function)."""

    name = "BF16"
    block_size = 1
    type_size = 2
    vec_dot_type = 30

    @classmethod
    def _to_f32(cls, blocks):
        return (blocks.view(np.uint16).astype(np.uint32) << 16).view(_f32)

    @classmethod
    def quantize(cls, x):
        import gguf

        x = np.asarray(x, _f32).reshape(-1, 1)
        return np.ascontiguousarray(gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16)).view(np.uint8)
