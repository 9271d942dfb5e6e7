"""4-bit lookup formats: IQ4_NL, IQ4_XS (kvalues_iq4nl) and MXFP4 (kvalues_mxfp4 = 2·E2M1, E8M0 scale).

Weight = scale · f(table[code]); codes are nibbles, low nibbles first (ggml-common.h). Dequantisers mirror
``dequantize_row_iq4_nl/iq4_xs/mxfp4``; dots follow ``ggml_vec_dot_iq4_nl_q8_0``, ``ggml_vec_dot_mxfp4_q8_0``
and ``ggml_vec_dot_iq4_xs_q8_K`` (generic C). Encoders: MXFP4 is gguf's (= ggml's reference); IQ4_NL/IQ4_XS
are ours (signed max → the −127 entry, nearest table values, one least-squares refit of the scale).
Legend: B blocks, N weight rows, T activation rows.
"""

from __future__ import annotations

import numpy as np

from strata.quants import _common as C
from strata.quants import act
from strata.quants import iq_grids as G
from strata.quants.base import QuantType

F32 = np.float32
_KV = G.KVALUES_IQ4NL.astype(F32)


def _nearest_kv(t: np.ndarray) -> np.ndarray:
    """Codes 0..15 of the kvalues_iq4nl entries nearest to t (ties to the lower code)."""
    return np.abs(t[..., None] - _KV).argmin(axis=-1).astype(np.uint8)


def _fit_nl(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [M, 32] -> (scale [M] float32, codes [M, 32]): the signed max maps to −127, then the least-squares
    scale for those codes, then codes again for that scale."""
    big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    d = big / F32(-127)
    codes = _nearest_kv(np.divide(x, d[:, None], out=np.zeros_like(x), where=d[:, None] != 0))
    v = _KV[codes]
    vv = (v * v).sum(axis=1)
    d = np.divide((x * v).sum(axis=1), vv, out=np.zeros_like(d), where=vv != 0).astype(F32)
    codes = _nearest_kv(np.divide(x, d[:, None], out=np.zeros_like(x), where=d[:, None] != 0))
    return d, codes


def _pack_nib(codes: np.ndarray) -> np.ndarray:
    """[M, 32] codes -> [M, 16] bytes, code j in the low nibble of byte j, code j + 16 in its high nibble."""
    return (codes[:, :16] | (codes[:, 16:] << 4)).astype(np.uint8)


class IQ4_NL(QuantType, qtype=20):
    """``block_iq4_nl``: fp16 d | qs[16]; weight j = d·f(kvalues_iq4nl[nibble_j]).

    vec_dot (Q8_0 activations): sumi = Σ kv·a_q (exact); block value = (d_a·d)·f(sumi).
    """

    name = "IQ4_NL"
    block_size = 32
    type_size = 2 + 16
    vec_dot_type = 8

    @classmethod
    def dequantize(cls, blocks):
        bl = C.as_blocks(cls, blocks)
        return C.f16(bl, 0)[:, None] * _KV[C.nibbles(bl[:, 2:])]

    @classmethod
    def quantize(cls, x):
        d, codes = _fit_nl(np.asarray(x, F32).reshape(-1, 32))
        out = np.empty((d.shape[0], cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        out[:, 2:] = _pack_nib(codes)
        return out

    _random = classmethod(C.random_d_at_0)   # random codes, one fp16 scale d in bytes 0-1

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        dy, qa = act.unpack_q8_0(a2)
        kv = G.KVALUES_IQ4NL[C.nibbles(w2[:, 2:])].astype(np.int16)
        sumi = C.int_dot(kv.reshape(n, b, 32), qa.reshape(t, b, 32))
        return C.sum_blocks((dy.reshape(t, 1, b) * C.f16(w2, 0).reshape(1, n, b)) * C.i2f(sumi))


class IQ4_XS(QuantType, qtype=23):
    """``block_iq4_xs``: fp16 d | u16 scales_h | scales_l[4] | qs[128]. Sub-block s (32 weights) has
    ls_s = nibble (s % 2) of scales_l[s // 2] | ((scales_h >> 2s) & 3) << 4, in 0..63; its codes are the
    nibbles of qs[16s:16s+16]. Weight = (d·f(ls_s − 32))·f(kv[code]).

    vec_dot: ggml's generic C adds one value per 32-weight sub-block to the row sum, so the accumulation unit
    here is the sub-block too (bit-identical to ggml's generic C): d4d8 = d·d_a, d_s = d4d8·f(ls_s − 32),
    unit value = d_s·f(sumi_s), units summed in order (block-major) from +0.0.
    """

    name = "IQ4_XS"
    block_size = 256
    type_size = 2 + 2 + 4 + 128
    vec_dot_type = 15

    @classmethod
    def _parts(cls, bl):  # -> ls − 32 [B, 8], codes [B, 256]
        sh = C.field(bl, 2, 1, np.uint16)[:, 0]
        low = np.stack([bl[:, 4:8] & 0xF, bl[:, 4:8] >> 4], axis=2).reshape(-1, 8)
        high = (sh[:, None] >> (2 * np.arange(8, dtype=np.uint16))) & 3
        ls = (low.astype(np.int32) | (high.astype(np.int32) << 4)) - 32
        return ls, C.nibbles(bl[:, 8:].reshape(-1, 8, 16)).reshape(-1, 256)

    @classmethod
    def dequantize(cls, blocks):
        bl = C.as_blocks(cls, blocks)
        ls, codes = cls._parts(bl)
        dl = np.repeat(C.f16(bl, 0)[:, None] * C.i2f(ls), 32, axis=1)
        return dl * _KV[codes]

    @classmethod
    def quantize(cls, x):
        x = np.asarray(x, F32).reshape(-1, 8, 32)
        b = x.shape[0]
        ds, _ = _fit_nl(x.reshape(-1, 32))
        ds = ds.reshape(b, 8)
        big = np.take_along_axis(ds, np.abs(ds).argmax(axis=1)[:, None], axis=1)[:, 0]
        d = C.to_f16(big / F32(-32))
        ls = np.clip(
            C.nearest_int(np.divide(ds, d[:, None], out=np.zeros_like(ds), where=d[:, None] != 0)), -32, 31
        )
        dl = np.repeat(d[:, None] * C.i2f(ls), 32, axis=1).reshape(b, 8, 32)
        codes = _nearest_kv(np.divide(x, dl, out=np.zeros_like(x), where=dl != 0))
        u = (ls + 32).astype(np.uint16)
        out = np.empty((b, cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        out[:, 2:4] = (
            ((u >> 4) << (2 * np.arange(8, dtype=np.uint16)))
            .sum(axis=1, dtype=np.uint16)[:, None]
            .view(np.uint8)
        )
        out[:, 4:8] = ((u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)).astype(np.uint8)
        out[:, 8:] = _pack_nib(codes.reshape(-1, 32)).reshape(b, 128)
        return out

    _random = classmethod(C.random_d_at_0)   # random codes, one fp16 scale d in bytes 0-1

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        ls, codes = cls._parts(w2)
        dy, qa, _ = act.unpack_q8_k(a2)
        kv = G.KVALUES_IQ4NL[codes].astype(np.int16)
        sumi = C.int_dot(kv.reshape(n, b * 8, 32), qa.reshape(t, b * 8, 32))  # [T, N, B·8]
        d4d8 = C.f16(w2, 0).reshape(1, n, b, 1) * dy.reshape(t, 1, b, 1)
        ds = d4d8 * C.i2f(ls).reshape(1, n, b, 8)  # [T, N, B, 8]
        return C.sum_blocks(ds.reshape(t, n, b * 8) * C.i2f(sumi))


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """``ggml_e8m0_to_fp32_half``: 2^(e − 128) as float32 bits (e < 2 gives the subnormals 2^-128, 2^-127)."""
    e = e.astype(np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32).view(F32)


class MXFP4(QuantType, qtype=39):
    """``block_mxfp4``: E8M0 e | qs[16]; weight j = f(kvalues_mxfp4[nibble_j])·2^(e−128).
    Encoder: ``gguf.quants.quantize`` (ggml's ``quantize_row_mxfp4_ref``).

    vec_dot (Q8_0 activations, ``ggml_vec_dot_mxfp4_q8_0``): d = d_a·2^(e−128); block value = d·f(sumi).
    """

    name = "MXFP4"
    block_size = 32
    type_size = 1 + 16
    vec_dot_type = 8

    @classmethod
    def dequantize(cls, blocks):
        bl = C.as_blocks(cls, blocks)
        return C.i2f(G.KVALUES_MXFP4[C.nibbles(bl[:, 1:])]) * _e8m0_half(bl[:, 0])[:, None]

    @classmethod
    def quantize(cls, x):
        import gguf

        x = np.asarray(x, F32).reshape(-1, 32)
        return np.ascontiguousarray(gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4))

    @classmethod
    def _random(cls, rng, n_blocks, d):
        e = 128 + int(np.rint(np.log2(d)))
        if not 0 <= e <= 254:
            raise ValueError(f"scale {d:g} does not fit an E8M0 exponent")
        blocks = C.random_bytes(rng, n_blocks, cls.type_size)
        blocks[:, 0] = e
        return blocks

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        dy, qa = act.unpack_q8_0(a2)
        kv = G.KVALUES_MXFP4[C.nibbles(w2[:, 1:])].astype(np.int16)
        sumi = C.int_dot(kv.reshape(n, b, 32), qa.reshape(t, b, 32))
        d = dy.reshape(t, 1, b) * _e8m0_half(w2[:, 0]).reshape(1, n, b)
        return C.sum_blocks(d * C.i2f(sumi))
