"""The 32-weight "legacy" formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (ggml-common.h ``block_q*``).

Dequantisers mirror ``dequantize_row_*`` (ggml-quants.c); dots mirror ``ggml_vec_dot_*_generic``
(ggml-cpu/quants.c). Encoders are ggml's reference quantisers as the gguf package implements them.
Legend: N weight rows, T activation rows, B blocks per row, 32 weights per block.
All block values below are float32 operations in the written order; "f(i)" is C's int -> float conversion.
"""

from __future__ import annotations

import numpy as np

from strata.quants import _common as C
from strata.quants import act
from strata.quants.base import QuantType

F32 = np.float32


def _gguf_quantize(cls, x: np.ndarray) -> np.ndarray:
    import gguf

    x = np.asarray(x, F32).reshape(-1, cls.block_size)
    return np.ascontiguousarray(gguf.quants.quantize(x, gguf.GGMLQuantizationType[cls.name]))


def _high_bits(blocks: np.ndarray, off: int) -> np.ndarray:
    """The 5th bits of Q5_0/Q5_1: bit j of the little-endian uint32 at ``off`` belongs to weight j: [B, 32]."""
    return C.bits_le(C.field(blocks, off, 1, np.uint32)[:, 0], 32)


class Q4_0(QuantType, qtype=2):
    """``block_q4_0``: fp16 d | qs[16]; weight j = (nibble_j − 8)·d, nibbles low then high.

    vec_dot (Q8_0 activations, ``ggml_vec_dot_q4_0_q8_0``): sumi = Σ (q−8)·a_q exact;
    block value = (f(sumi) · dx) · dy.
    """

    name = "Q4_0"
    block_size = 32
    type_size = 2 + 16
    vec_dot_type = 8

    @classmethod
    def _ints(cls, blocks):
        return C.nibbles(blocks[:, 2:]).astype(np.int16) - 8  # [B, 32] in -8..7

    @classmethod
    def dequantize(cls, blocks):
        blocks = C.as_blocks(cls, blocks)
        return C.i2f(cls._ints(blocks)) * C.f16(blocks, 0)[:, None]

    @classmethod
    def quantize(cls, x):
        return _gguf_quantize(cls, x)

    _random = classmethod(C.random_d_at_0)   # random codes, one fp16 scale d in bytes 0-1

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        dy, qa = act.unpack_q8_0(a2)
        sumi = C.int_dot(cls._ints(w2).reshape(n, b, 32), qa.reshape(t, b, 32))  # [T, N, B]
        dx = C.f16(w2, 0).reshape(1, n, b)
        return C.sum_blocks(C.i2f(sumi) * dx * dy.reshape(t, 1, b))


class Q4_1(QuantType, qtype=3):
    """``block_q4_1``: fp16 d | fp16 m | qs[16]; weight j = nibble_j·d + m.

    vec_dot (Q8_1 activations with s = d_a·Σa_q, ``ggml_vec_dot_q4_1_q8_1``): sumi = Σ q·a_q exact;
    block value = (dx·dy)·f(sumi) + mx·sy.
    """

    name = "Q4_1"
    block_size = 32
    type_size = 2 + 2 + 16
    vec_dot_type = 9

    @classmethod
    def _ints(cls, blocks):
        return C.nibbles(blocks[:, 4:]).astype(np.int16)  # [B, 32] in 0..15

    @classmethod
    def dequantize(cls, blocks):
        blocks = C.as_blocks(cls, blocks)
        return C.i2f(cls._ints(blocks)) * C.f16(blocks, 0)[:, None] + C.f16(blocks, 2)[:, None]

    @classmethod
    def quantize(cls, x):
        return _gguf_quantize(cls, x)

    @classmethod
    def _random(cls, rng, n_blocks, d):
        # m = -7.5·d centres the codes 0..15 on zero
        blocks = C.random_bytes(rng, n_blocks, cls.type_size)
        C.fill_f16(blocks, 0, d)
        C.fill_f16(blocks, 2, -7.5 * d)
        return blocks

    @classmethod
    def vec_dot(cls, w, a):
        return _dot_q8_1(cls, w, a)


class Q5_0(QuantType, qtype=6):
    """``block_q5_0``: fp16 d | qh u32 | qs[16]; weight j = ((nibble_j | bit_j(qh)<<4) − 16)·d.

    vec_dot (Q8_0, ``ggml_vec_dot_q5_0_q8_0``): sumi = Σ (q−16)·a_q exact; block value = (dx·dy)·f(sumi).
    """

    name = "Q5_0"
    block_size = 32
    type_size = 2 + 4 + 16
    vec_dot_type = 8

    @classmethod
    def _ints(cls, blocks):
        return (C.nibbles(blocks[:, 6:]) | (_high_bits(blocks, 2) << 4)).astype(np.int16) - 16

    @classmethod
    def dequantize(cls, blocks):
        blocks = C.as_blocks(cls, blocks)
        return C.i2f(cls._ints(blocks)) * C.f16(blocks, 0)[:, None]

    @classmethod
    def quantize(cls, x):
        return _gguf_quantize(cls, x)

    _random = classmethod(C.random_d_at_0)   # random codes, one fp16 scale d in bytes 0-1

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        dy, qa = act.unpack_q8_0(a2)
        sumi = C.int_dot(cls._ints(w2).reshape(n, b, 32), qa.reshape(t, b, 32))
        dxdy = C.f16(w2, 0).reshape(1, n, b) * dy.reshape(t, 1, b)
        return C.sum_blocks(dxdy * C.i2f(sumi))


class Q5_1(QuantType, qtype=7):
    """``block_q5_1``: fp16 d | fp16 m | qh u32 | qs[16]; weight j = (nibble_j | bit_j(qh)<<4)·d + m.

    vec_dot (Q8_1, ``ggml_vec_dot_q5_1_q8_1``): as Q4_1: block value = (dx·dy)·f(sumi) + mx·sy.
    """

    name = "Q5_1"
    block_size = 32
    type_size = 2 + 2 + 4 + 16
    vec_dot_type = 9

    @classmethod
    def _ints(cls, blocks):
        return (C.nibbles(blocks[:, 8:]) | (_high_bits(blocks, 4) << 4)).astype(np.int16)

    @classmethod
    def dequantize(cls, blocks):
        blocks = C.as_blocks(cls, blocks)
        return C.i2f(cls._ints(blocks)) * C.f16(blocks, 0)[:, None] + C.f16(blocks, 2)[:, None]

    @classmethod
    def quantize(cls, x):
        return _gguf_quantize(cls, x)

    @classmethod
    def _random(cls, rng, n_blocks, d):
        blocks = C.random_bytes(rng, n_blocks, cls.type_size)
        C.fill_f16(blocks, 0, d)
        C.fill_f16(blocks, 2, -15.5 * d)
        return blocks

    @classmethod
    def vec_dot(cls, w, a):
        return _dot_q8_1(cls, w, a)


class Q8_0(QuantType, qtype=8):
    """``block_q8_0``: fp16 d | int8 qs[32]; weight j = qs_j·d. Also the activation format of Q4_0, Q5_0,
    Q8_0, IQ4_NL, MXFP4 and Q2_0; its quantiser is ``quantize_row_q8_0_ref`` (strata.quants.act.q8_0_ref,
    byte-identical to the gguf package's).

    vec_dot (``ggml_vec_dot_q8_0_q8_0``): sumi = Σ qs·a_q exact; block value = f(sumi) · (dx·dy).
    """

    name = "Q8_0"
    block_size = 32
    type_size = 2 + 32
    vec_dot_type = 8

    @classmethod
    def dequantize(cls, blocks):
        d, qs = act.unpack_q8_0(C.as_blocks(cls, blocks))
        return C.i2f(qs) * d[:, None]

    @classmethod
    def quantize(cls, x):
        return act.q8_0_ref(np.asarray(x, F32).reshape(-1, 32))

    _random = classmethod(C.random_d_at_0)   # random codes, one fp16 scale d in bytes 0-1

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        dx, qw = act.unpack_q8_0(w2)
        dy, qa = act.unpack_q8_0(a2)
        sumi = C.int_dot(qw.reshape(n, b, 32), qa.reshape(t, b, 32))
        dxdy = dx.reshape(1, n, b) * dy.reshape(t, 1, b)
        return C.sum_blocks(C.i2f(sumi) * dxdy)


def _dot_q8_1(cls, w, a):
    """Q4_1/Q5_1 x Q8_1: block value = (dx·dy)·f(sumi) + mx·sy, in that order."""
    w2, a2, n, b, t = C.dot_operands(cls, w, a)
    dy, sy, qa = act.unpack_q8_1(a2)
    sumi = C.int_dot(cls._ints(w2).reshape(n, b, 32), qa.reshape(t, b, 32))
    dx, mx = C.f16(w2, 0).reshape(1, n, b), C.f16(w2, 2).reshape(1, n, b)
    dy, sy = dy.reshape(t, 1, b), sy.reshape(t, 1, b)
    return C.sum_blocks((dx * dy) * C.i2f(sumi) + mx * sy)
