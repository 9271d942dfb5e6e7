"""Grid i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (256-weight blocks, fp16 d).

Each group of 8 (IQ2, IQ1) or 4 (IQ3) weights is one row of a fixed grid (iq_grids.py). Dequantisers mirror
``dequantize_row_iq*`` (ggml-quants.c); dots take Q8_K activations and follow
``ggml_vec_dot_iq*_q8_K_generic`` (ggml-cpu/quants.c). IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS: ggml multiplies the
finished row sum by 0.125f / 0.25f; here each block value is multiplied instead, which is the same float32
result (a power-of-two scaling commutes with rounding) except when a value is subnormal.
Legend: B blocks, N weight rows, T activation rows, w weight 0..255, k grid group, s scale sub-block.
"""

from __future__ import annotations

import numpy as np

from strata.quants import _common as C
from strata.quants import act
from strata.quants import iq_encode as E
from strata.quants import iq_grids as G
from strata.quants.base import QuantType

F32 = np.float32


def _nib2(b: np.ndarray) -> np.ndarray:
    """[B, m] bytes -> [B, 2m] 4-bit values, low then high nibble of each byte in turn."""
    return np.stack([b & 0xF, b >> 4], axis=2).reshape(b.shape[0], -1)


def _q8k(a2, t, b):
    dy, qa, bsums = act.unpack_q8_k(a2)
    return dy.reshape(t, 1, b), qa.reshape(t, b, 256), bsums.reshape(t, b, 16)


class _SignedGrid(QuantType):
    """Magnitude grid + sign bits: weight = (db_s · f(grid[idx_k][j])) · (neg ? −1 : 1),
    db_s = d·(α·ls_s + β) in the float32 order the subclass docstring gives.

    vec_dot: bsum = Σ_w (2·ls_s + 1)·grid·sign·a_q (exact); block value = ((d·d_a)·f(bsum))·tail.
    """

    block_size = 256
    vec_dot_type = 15
    _grid: np.ndarray
    _sub = 32  # weights per scale sub-block
    _alpha, _beta = 0.25, 0.125  # db = d·(α·ls + β), for the encoder
    _tail: float | None = None  # ggml's trailing factor on the sum (0.125f, 0.25f) or none

    @classmethod
    def _parts(cls, bl):  # -> idx [B, K], neg bool [B, 256], ls [B, 256 // sub]
        raise NotImplementedError

    @classmethod
    def _pack(cls, d, idx, neg, ls):
        raise NotImplementedError

    @classmethod
    def _db(cls, d, ls):  # [B], [B, S] -> [B, S] float32, exactly the dequantiser's ops
        raise NotImplementedError

    @classmethod
    def dequantize(cls, blocks):
        bl = C.as_blocks(cls, blocks)
        idx, neg, ls = cls._parts(bl)
        g = cls._grid[idx].reshape(bl.shape[0], 256)
        db = np.repeat(cls._db(C.f16(bl, 0), ls), cls._sub, axis=1)
        return (db * C.i2f(g)) * np.where(neg, F32(-1), F32(1))

    @classmethod
    def quantize(cls, x):
        x = np.asarray(x, F32).reshape(-1, 256)
        b = x.shape[0]
        if cls._parity:
            neg, mag = E.even_signs(x)
        else:
            neg, mag = x < 0, np.abs(x)
        gmax = float(cls._grid.max())
        d, ls = E.affine_scale(
            mag.reshape(b, -1, cls._sub).max(axis=2) / F32(gmax), cls._alpha, cls._beta, 15, C.to_f16
        )
        db = np.repeat(cls._db(d, ls), cls._sub, axis=1)
        t = np.divide(mag, db, out=np.zeros_like(mag), where=db != 0)
        idx, _ = E.nearest_grid(t.reshape(-1, cls._grid.shape[1]), cls._grid)
        return cls._pack(d, idx.reshape(b, -1), neg, ls)

    @classmethod
    def _random(cls, rng, n_blocks, d):
        # every bit pattern is a valid grid index / sign code / scale: only d needs setting
        blocks = C.random_bytes(rng, n_blocks, cls.type_size)
        C.fill_f16(blocks, 0, d)
        return blocks

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        idx, neg, ls = cls._parts(w2)
        g = cls._grid[idx].reshape(-1, 256).astype(np.int32)
        weff = np.repeat(2 * ls.astype(np.int32) + 1, cls._sub, axis=1) * np.where(neg, -g, g)
        dy, qa, _ = _q8k(a2, t, b)
        bsum = C.int_dot(weff.reshape(n, b, 256), qa)
        bv = (C.f16(w2, 0).reshape(1, n, b) * dy) * C.i2f(bsum)
        return C.sum_blocks(bv if cls._tail is None else bv * F32(cls._tail))


def _ksign_parts(sidx: np.ndarray) -> np.ndarray:
    """7-bit ksigns indices [B, K] -> neg bool [B, 8K] (bit j of ksigns_iq2xs[i] is the sign of weight j)."""
    return C.bits_le(G.KSIGNS[sidx], 8).reshape(sidx.shape[0], -1).astype(bool)


class IQ2_XXS(_SignedGrid, qtype=16):
    """``block_iq2_xxs``: fp16 d | 8 × (u32 a0, u32 a1) per 32 weights. a0's bytes are 4 indices into
    iq2xxs_grid (8 weights each); a1 = 4 × 7-bit ksigns indices | ls << 28.
    db = (d·(0.5f + f(ls)))·0.25f; weight = (db·f(grid))·sign.
    vec_dot: bsum = Σ_w (2·ls + 1)·grid·sign·a_q (exact);
    block value = ((d·d_a)·f(bsum))·0.125f.
    """

    name = "IQ2_XXS"
    type_size = 2 + 2 * 32
    _grid, _parity, _tail = G.IQ2XXS_GRID, True, 0.125

    @classmethod
    def _parts(cls, bl):
        aux = C.field(bl, 2, 16, np.uint32).reshape(-1, 8, 2)
        idx = bl[:, 2:66].reshape(-1, 8, 8)[:, :, 0:4].reshape(-1, 32)
        sidx = (aux[:, :, 1, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127  # [B, 8, 4]
        return idx, _ksign_parts(sidx.reshape(-1, 32)), (aux[:, :, 1] >> 28).astype(np.int32)

    @classmethod
    def _db(cls, d, ls):
        return (d[:, None] * (F32(0.5) + C.i2f(ls))) * F32(0.25)

    @classmethod
    def _pack(cls, d, idx, neg, ls):
        b = d.shape[0]
        sidx = (E.sign_bytes(neg) & 127).astype(np.uint32).reshape(b, 8, 4)
        a1 = (sidx << np.array([0, 7, 14, 21], np.uint32)).sum(axis=2, dtype=np.uint32) | (
            ls.astype(np.uint32) << 28
        )
        out = np.empty((b, cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        body = out[:, 2:].reshape(b, 8, 8)
        body[:, :, 0:4] = idx.reshape(b, 8, 4).astype(np.uint8)
        body[:, :, 4:8] = a1.reshape(b, 8, 1).view(np.uint8)
        return out


class IQ2_XS(_SignedGrid, qtype=17):
    """``block_iq2_xs``: fp16 d | u16 qs[32] | scales[8]. qs_k = index into iq2xs_grid (9 bits) | ksigns
    index << 9; the 4-bit scale of sub-block s (16 weights) is nibble s % 2 of scales[s // 2].
    db = (d·(0.5f + f(ls)))·0.25f; weight = (db·f(grid))·sign.
    vec_dot: bsum = Σ_w (2·ls + 1)·grid·sign·a_q (exact);
    block value = ((d·d_a)·f(bsum))·0.125f.
    """

    name = "IQ2_XS"
    type_size = 2 + 2 * 32 + 8
    _grid, _parity, _tail, _sub = G.IQ2XS_GRID, True, 0.125, 16

    @classmethod
    def _parts(cls, bl):
        qs = C.field(bl, 2, 32, np.uint16)
        return qs & 511, _ksign_parts(qs >> 9), _nib2(bl[:, 66:74]).astype(np.int32)

    _db = IQ2_XXS._db

    @classmethod
    def _pack(cls, d, idx, neg, ls):
        out = np.empty((d.shape[0], cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        qs = idx.astype(np.uint16) | ((E.sign_bytes(neg) & 127).astype(np.uint16) << 9)
        out[:, 2:66] = qs.view(np.uint8)
        out[:, 66:74] = (ls[:, 0::2] | (ls[:, 1::2] << 4)).astype(np.uint8)
        return out


class IQ2_S(_SignedGrid, qtype=22):
    """``block_iq2_s``: fp16 d | qs[32] | signs[32] | qh[8] | scales[8]. Index k into iq2s_grid (10 bits) =
    qs[k] | ((qh[k // 4] >> 2(k % 4)) & 3) << 8; bit j of signs[k] is the sign of weight 8k + j; scales as
    IQ2_XS. db = (d·(0.5f + f(ls)))·0.25f; weight = (db·f(grid))·sign.
    vec_dot: bsum = Σ_w (2·ls + 1)·grid·sign·a_q (exact);
    block value = ((d·d_a)·f(bsum))·0.125f.
    """

    name = "IQ2_S"
    type_size = 2 + 32 + 32 + 8 + 8
    _grid, _parity, _tail, _sub = G.IQ2S_GRID, False, 0.125, 16

    @classmethod
    def _parts(cls, bl):
        hi = (bl[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3  # [B, 8, 4]
        idx = bl[:, 2:34].astype(np.uint16) | (hi.reshape(-1, 32).astype(np.uint16) << 8)
        return (
            idx,
            C.bits_le(bl[:, 34:66], 8).reshape(-1, 256).astype(bool),
            _nib2(bl[:, 74:82]).astype(np.int32),
        )

    _db = IQ2_XXS._db

    @classmethod
    def _pack(cls, d, idx, neg, ls):
        out = np.empty((d.shape[0], cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        out[:, 2:34] = (idx & 0xFF).astype(np.uint8)
        out[:, 34:66] = E.sign_bytes(neg)
        hi = ((idx >> 8) & 3).astype(np.uint8).reshape(-1, 8, 4)
        out[:, 66:74] = hi[:, :, 0] | hi[:, :, 1] << 2 | hi[:, :, 2] << 4 | hi[:, :, 3] << 6
        out[:, 74:82] = (ls[:, 0::2] | (ls[:, 1::2] << 4)).astype(np.uint8)
        return out


class IQ3_XXS(_SignedGrid, qtype=18):
    """``block_iq3_xxs``: fp16 d | qs[64] (indices into iq3xxs_grid, 4 weights each) | u32 aux[8] per 32
    weights = 4 × 7-bit ksigns indices | ls << 28. db = (d·(0.5f + f(ls)))·0.5f.
    vec_dot: bsum = Σ_w (2·ls + 1)·grid·sign·a_q (exact);
    block value = ((d·d_a)·f(bsum))·0.25f.
    """

    name = "IQ3_XXS"
    type_size = 2 + 64 + 32
    _grid, _parity, _tail, _alpha, _beta = G.IQ3XXS_GRID, True, 0.25, 0.5, 0.25

    @classmethod
    def _parts(cls, bl):
        aux = C.field(bl, 66, 8, np.uint32)
        sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127
        return bl[:, 2:66], _ksign_parts(sidx.reshape(-1, 32)), (aux >> 28).astype(np.int32)

    @classmethod
    def _db(cls, d, ls):
        return (d[:, None] * (F32(0.5) + C.i2f(ls))) * F32(0.5)

    @classmethod
    def _pack(cls, d, idx, neg, ls):
        b = d.shape[0]
        sidx = (E.sign_bytes(neg) & 127).astype(np.uint32).reshape(b, 8, 4)
        aux = (sidx << np.array([0, 7, 14, 21], np.uint32)).sum(axis=2, dtype=np.uint32) | (
            ls.astype(np.uint32) << 28
        )
        out = np.empty((b, cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        out[:, 2:66] = idx.astype(np.uint8)
        out[:, 66:98] = aux.view(np.uint8)
        return out


class IQ3_S(_SignedGrid, qtype=21):
    """``block_iq3_s``: fp16 d | qs[64] | qh[8] | signs[32] | scales[4]. Index k into iq3s_grid (9 bits) =
    qs[k] | bit (k % 8) of qh[k // 8] << 8; signs as IQ2_S; the scale of sub-block s (32 weights) is nibble
    s % 2 of scales[s // 2]. db = d·f(1 + 2·ls).
    vec_dot: bsum = Σ_w (2·ls + 1)·grid·sign·a_q (exact); block value = (d·d_a)·f(bsum).
    """

    name = "IQ3_S"
    type_size = 2 + 64 + 8 + 32 + 4
    _grid, _parity, _alpha, _beta = G.IQ3S_GRID, False, 2.0, 1.0

    @classmethod
    def _parts(cls, bl):
        hi = C.bits_le(bl[:, 66:74], 8).reshape(-1, 64)
        idx = bl[:, 2:66].astype(np.uint16) | (hi.astype(np.uint16) << 8)
        return (
            idx,
            C.bits_le(bl[:, 74:106], 8).reshape(-1, 256).astype(bool),
            _nib2(bl[:, 106:110]).astype(np.int32),
        )

    @classmethod
    def _db(cls, d, ls):
        return d[:, None] * C.i2f(1 + 2 * ls)

    @classmethod
    def _pack(cls, d, idx, neg, ls):
        out = np.empty((d.shape[0], cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        out[:, 2:66] = (idx & 0xFF).astype(np.uint8)
        out[:, 66:74] = np.packbits(
            ((idx >> 8) & 1).astype(np.uint8).reshape(-1, 8, 8), axis=2, bitorder="little"
        )[..., 0]
        out[:, 74:106] = E.sign_bytes(neg)
        out[:, 106:110] = (ls[:, 0::2] | (ls[:, 1::2] << 4)).astype(np.uint8)
        return out
