"""Q2_0 (ggml type 42): 64 weights in 18 bytes, fp16 d | qs[16] of 2-bit codes, least significant first.

Weight j = f(code_j − 1)·d, code_j = (qs[j // 4] >> 2(j % 4)) & 3, so {−d, 0, d, 2d}; ggml's quantiser
(``quantize_row_q2_0_ref``) emits only codes 0..2. Not in gguf 0.19.0. Beware: forks use id 42 for a
128-weight/34-byte layout, so a loader must check the tensor's byte count (strata.quants.dequantize does).
"""

from __future__ import annotations

import numpy as np

from strata.quants import _common as C
from strata.quants import act
from strata.quants.base import QuantType

F32 = np.float32


class Q2_0(QuantType, qtype=42):
    """``block_q2_0``: fp16 d | qs[16] (``dequantize_row_q2_0``).

    vec_dot (two Q8_0 activation blocks per weight block, ``ggml_vec_dot_q2_0_q8_0``): for the halves
    h = 0, 1: s_h = Σ (code − 1)·a_q (exact, 32 weights each); block value =
    d·((+0.0f + d_a0·f(s_0)) + d_a1·f(s_1)).
    """

    name = "Q2_0"
    block_size = 64
    type_size = 2 + 16
    vec_dot_type = 8

    @classmethod
    def _codes(cls, bl):
        return ((bl[:, 2:18, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3).reshape(-1, 64)

    @classmethod
    def dequantize(cls, blocks):
        bl = C.as_blocks(cls, blocks)
        return C.i2f(cls._codes(bl).astype(np.int16) - 1) * C.f16(bl, 0)[:, None]

    @classmethod
    def quantize(cls, x):
        """``quantize_row_q2_0_ref``: d = amax, code = clamp(roundf(x·(1/d)) + 1, 0, 3)."""
        x = np.asarray(x, F32).reshape(-1, 64)
        d = np.abs(x).max(axis=1)
        with np.errstate(divide="ignore"):
            idv = np.where(d > 0, F32(1) / d, F32(0)).astype(F32)
        q = np.clip(C.roundf(x * idv[:, None]).astype(np.int32) + 1, 0, 3).astype(np.uint8).reshape(-1, 16, 4)
        out = np.empty((x.shape[0], cls.type_size), np.uint8)
        C.put_f16(out, 0, d)
        out[:, 2:] = q[:, :, 0] | q[:, :, 1] << 2 | q[:, :, 2] << 4 | q[:, :, 3] << 6
        return out

    @classmethod
    def _random(cls, rng, n_blocks, d):
        # codes in 0..2 only, like ggml's quantiser: random codes with each 3 turned into a 2 (clear its low bit)
        blocks = C.random_bytes(rng, n_blocks, cls.type_size)
        blocks ^= blocks & (blocks >> 1) & 0x55
        C.fill_f16(blocks, 0, d)
        return blocks

    @classmethod
    def vec_dot(cls, w, a):
        w2, a2, n, b, t = C.dot_operands(cls, w, a)
        dy, qa = act.unpack_q8_0(a2)  # 2B blocks per row
        v = cls._codes(w2).astype(np.int16) - 1
        s = C.int_dot(v.reshape(n, 2 * b, 32), qa.reshape(t, 2 * b, 32)).reshape(t, n, b, 2)
        dy = dy.reshape(t, 1, b, 2)
        inner = (F32(0) + dy[..., 0] * C.i2f(s[..., 0])) + dy[..., 1] * C.i2f(s[..., 1])
        return C.sum_blocks(C.f16(w2, 0).reshape(1, n, b) * inner)
