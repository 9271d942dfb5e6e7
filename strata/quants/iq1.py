"""IQ1_S and IQ1_M: groups of 8 weights = one row of iq1s_grid (values −1, 0, 1) plus a shift ±IQ1S_DELTA.

Dequantisers mirror ``dequantize_row_iq1_s/iq1_m`` (ggml-quants.c); dots take Q8_K activations and follow
``ggml_vec_dot_iq1_s/iq1_m_q8_K_generic``: block value = ((d·d_a))·(f(sumi) + 0.125f·f(sumi1)).
Encoders are ours: sub-scales from max |x|, then per delta sign the nearest grid rows, keeping the better sign.
Legend: B blocks, N weight rows, T activation rows, w weight 0..255, k group of 8 (w // 8).
"""

from __future__ import annotations

import numpy as np

from strata.quants import _common as C
from strata.quants import act
from strata.quants import iq_encode as E
from strata.quants import iq_grids as G
from strata.quants.base import QuantType

F32 = np.float32
DELTA = G.IQ1S_DELTA


def _encode(x: np.ndarray, sub: int, dgroup: int):
    """x [B, 256] -> (d [B] fp16 value, l [B, 256 // sub] 3-bit scales, idx [B, 32] 11-bit grid rows,
    dneg [B, 256 // dgroup] delta signs) for weights d·(2l + 1)·(grid + (dneg ? −δ : δ))."""
    b = x.shape[0]
    s = np.abs(x).reshape(b, -1, sub).max(axis=2) / F32(1 + DELTA)
    d, l = E.affine_scale(s, 2.0, 1.0, 7, C.to_f16)
    dl = np.repeat(d[:, None] * C.i2f(2 * l + 1), sub, axis=1)  # [B, 256]
    t = np.divide(x, dl, out=np.zeros_like(x), where=dl != 0).reshape(-1, 8)
    cands = []
    for sign in (F32(1), F32(-1)):
        idx, dist = E.nearest_grid(t - sign * DELTA, G.IQ1S_GRID)
        cands.append((idx.reshape(b, -1, dgroup // 8), dist.reshape(b, -1, dgroup // 8).sum(axis=2)))
    use_neg = cands[1][1] < cands[0][1]  # [B, 256 // dgroup]
    idx = np.where(use_neg[..., None], cands[1][0], cands[0][0]).reshape(b, 32)
    return d, l, idx, use_neg


class IQ1_S(QuantType, qtype=19):
    """``block_iq1_s``: fp16 d | qs[32] | u16 qh[8] (one per 32 weights). Group k = 4s + j: grid row
    qs[k] | ((qh[s] >> 3j) & 7) << 8; qh[s] >> 12 & 7 = l_s; bit 15 = delta sign.
    Weight = (d·f(2l_s + 1))·(f(grid) + delta_s).

    vec_dot: sumi = Σ_w (2l+1)·grid·a_q, sumi1 = Σ_s (2l+1)·(±1)·(bsums[2s] + bsums[2s+1]) (exact);
    block value = (d·d_a)·(f(sumi) + 0.125f·f(sumi1)).
    """

    name = "IQ1_S"
    block_size = 256
    type_size = 2 + 32 + 2 * 8
    vec_dot_type = 15

    @classmethod
    def _parts(cls, bl):  # -> idx [B, 32], ls [B, 8] (2l + 1), dneg bool [B, 8]
        qh = C.field(bl, 34, 8, np.uint16)
        hi = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
        idx = bl[:, 2:34].astype(np.uint16) | (hi.reshape(-1, 32) << 8)
        return idx, 2 * ((qh >> 12) & 7).astype(np.int32) + 1, (qh & 0x8000) != 0

    @classmethod
    def dequantize(cls, blocks):
        bl = C.as_blocks(cls, blocks)
        idx, ls, dneg = cls._parts(bl)
        dl = np.repeat(C.f16(bl, 0)[:, None] * C.i2f(ls), 32, axis=1)
        delta = np.repeat(np.where(dneg, -DELTA, DELTA), 32, axis=1)
        return dl * (C.i2f(G.IQ1S_GRID[idx].reshape(-1, 256)) + delta)

    @classmethod
    def quantize(cls, x):
        x = np.asarray(x, F32).reshape(-1, 256)
        d, l, idx, dneg = _encode(x, 32, 32)
        qh = (((idx >> 8) & 7).reshape(-1, 8, 4) << np.array([0, 3, 6, 9])).sum(axis=2)
        qh = qh | (l << 12) | (dneg.astype(np.int64) << 15)
        out = np.empty((x.shape[0], cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        out[:, 2:34] = (idx & 0xFF).astype(np.uint8)
        out[:, 34:50] = qh.astype(np.uint16).view(np.uint8)
        return out

    _random = classmethod(C.random_d_at_0)   # random codes, one fp16 scale d in bytes 0-1

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        idx, ls, dneg = cls._parts(w2)
        dy, qa, bsums = act.unpack_q8_k(a2)
        weff = np.repeat(ls, 32, axis=1) * G.IQ1S_GRID[idx].reshape(-1, 256)
        sumi = C.int_dot(weff.reshape(n, b, 256), qa.reshape(t, b, 256))
        w16 = np.repeat(np.where(dneg, -ls, ls), 2, axis=1)  # [NB, 16] against bsums pairs
        sumi1 = C.int_dot(w16.reshape(n, b, 16), bsums.reshape(t, b, 16))
        inner = C.i2f(sumi) + DELTA * C.i2f(sumi1)
        return C.sum_blocks((C.f16(w2, 0).reshape(1, n, b) * dy.reshape(t, 1, b)) * inner)


class IQ1_M(QuantType, qtype=29):
    """``block_iq1_m``: qs[32] | qh[16] | u16 sc[4]. No d field: d's fp16 bits are the top nibbles
    sc[0] >> 12 | sc[1] >> 8 & 0xf0 | sc[2] >> 4 & 0xf00 | sc[3] & 0xf000. Group k: nibble k % 2 of
    qh[k // 2] holds the grid row's top 3 bits (bits 0-2) and the delta sign (bit 3); row = qs[k] | top << 8.
    Sub-block s (16 weights) has l_s = (sc[s // 4] >> 3(s % 4)) & 7. Weight = (d·f(2l_s + 1))·(f(grid) + delta_k).

    vec_dot: sumi1 = Σ_w (2l+1)·grid·a_q, sumi2 = Σ_w (2l+1)·(±1)_k·a_q (exact);
    block value = (d·d_a)·(f(sumi1) + 0.125f·f(sumi2)).
    """

    name = "IQ1_M"
    block_size = 256
    type_size = 32 + 16 + 8
    vec_dot_type = 15

    @classmethod
    def _parts(cls, bl):  # -> d [B], idx [B, 32], ls [B, 16] (2l + 1), dneg bool [B, 32]
        sc = C.field(bl, 48, 4, np.uint16)
        dbits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00) | (sc[:, 3] & 0xF000)
        nib = np.stack([bl[:, 32:48] & 0xF, bl[:, 32:48] >> 4], axis=2).reshape(-1, 32)
        idx = bl[:, 0:32].astype(np.uint16) | ((nib & 7).astype(np.uint16) << 8)
        ls = (
            2 * ((sc[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(-1, 16).astype(np.int32)
            + 1
        )
        return dbits.astype(np.uint16).view(np.float16).astype(F32), idx, ls, (nib & 8) != 0

    @classmethod
    def dequantize(cls, blocks):
        bl = C.as_blocks(cls, blocks)
        d, idx, ls, dneg = cls._parts(bl)
        dl = np.repeat(d[:, None] * C.i2f(ls), 16, axis=1)
        delta = np.repeat(np.where(dneg, -DELTA, DELTA), 8, axis=1)
        return dl * (C.i2f(G.IQ1S_GRID[idx].reshape(-1, 256)) + delta)

    @classmethod
    def quantize(cls, x):
        x = np.asarray(x, F32).reshape(-1, 256)
        d, l, idx, dneg = _encode(x, 16, 8)
        return cls._pack(d, l, idx, dneg)

    @classmethod
    def _pack(cls, d, l, idx, dneg):
        b = d.shape[0]
        nib = (((idx >> 8) & 7) | (dneg.astype(np.int64) << 3)).reshape(b, 16, 2)
        dbits = d.astype(np.float16).view(np.uint16).astype(np.int64)  # [B]
        sc = (l.reshape(b, 4, 4) << np.array([0, 3, 6, 9])).sum(axis=2)
        sc = sc | (((dbits[:, None] >> np.array([0, 4, 8, 12])) & 0xF) << 12)
        out = np.empty((b, cls.type_size), np.uint8)
        out[:, 0:32] = (idx & 0xFF).astype(np.uint8)
        out[:, 32:48] = (nib[:, :, 0] | (nib[:, :, 1] << 4)).astype(np.uint8)
        out[:, 48:56] = sc.astype(np.uint16).view(np.uint8)
        return out

    @classmethod
    def _random(cls, rng, n_blocks, d):
        blocks = C.random_bytes(rng, n_blocks, cls.type_size)
        bits = int(np.array(C.f16_scale(d)).view(np.uint16))
        sc = C.field(blocks, 48, 4, np.uint16) & 0x0FFF
        sc |= ((bits >> np.array([0, 4, 8, 12], np.uint16)) & 0xF) << 12
        blocks[:, 48:56] = sc.view(np.uint8)
        return blocks

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        d, idx, ls, dneg = cls._parts(w2)
        dy, qa, _ = act.unpack_q8_k(a2)
        lw = np.repeat(ls, 16, axis=1)  # [NB, 256]
        sumi1 = C.int_dot((lw * G.IQ1S_GRID[idx].reshape(-1, 256)).reshape(n, b, 256), qa.reshape(t, b, 256))
        sgn = np.repeat(np.where(dneg, -1, 1), 8, axis=1)
        sumi2 = C.int_dot((lw * sgn).reshape(n, b, 256), qa.reshape(t, b, 256))
        inner = C.i2f(sumi1) + DELTA * C.i2f(sumi2)
        return C.sum_blocks((d.reshape(1, n, b) * dy.reshape(t, 1, b)) * inner)
