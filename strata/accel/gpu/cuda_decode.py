"""The decode graph's kernels on CUDA (cuda/decode_kernels.cu; kernels.py states each contract): experts straight
from their quantised blobs in the cache or the pinned arena, and one token's attention at a device-held position.

Legend: P (token, k) pairs, N/Kd a matrix's rows/row length, H/Hkv heads, hd head size.
"""

from __future__ import annotations

import functools

import numpy as np

from strata.accel.gpu import dequant as dq

MG_WARPS, MG_STAGE = 8, 1152                 # decode_kernels.cu
MG_ROWS = 2    # rows per warp: more warps in flight keep more PCIe reads outstanding; each block stages x once
SMEM_MAX = 48 << 10                          # dynamic shared memory without an opt-in
# decode_kernels.cu: attn_decode's key parts, threads a block, head size / 32 and query heads a block at most
AD_PARTS, AD_THREADS, AD_MAXD, AD_MAXG = 128, 128, 8, 8


@functools.cache
def query_group(h: int, hkv: int) -> int:
    """attn_decode's query heads a block: the largest divisor of the h / hkv heads sharing a kv head up to AD_MAXG
    (cached: the per-layer decode path launches it every layer of every token)."""
    return max(b for b in range(1, AD_MAXG + 1) if (h // hkv) % b == 0)


def attn_decode_cols(n_ctx: int, hd: int) -> int:
    """Floats a head of attn_decode's scratch: the scores, then the key parts' (max, sum, o[hd])."""
    return n_ctx + AD_PARTS * (hd + 2)


class CudaDecodeKernels:
    """Mixed into CudaKernels (which supplies self.cp and its modules, self.mods)."""

    # the longest rows moe_gemv takes: x (padded) and the warps' stages in 48 KiB of shared memory
    moe_gemv_max_k = (SMEM_MAX - MG_WARPS * MG_STAGE) // 4 * 32 // 33 // 256 * 256

    def _decode_fn(self, name: str):
        fn = self._dfn.get(name)
        if fn is None:
            fn = self._dfn[name] = self.mods.get("decode").get_function(name)
        return fn

    def moe_gemv(self, out, x, x_div, ids, src, off, qtype, n, k, stream, glu=False):
        cls = dq._check_type(qtype)
        P = ids.size
        assert out.dtype == np.float32 and out.strides[1] == 4 and out.shape[0] >= P and out.shape[1] >= n
        assert x.strides[1] == x.itemsize and x.shape[1] == (2 if glu else 1) * k
        assert x.dtype == np.float32 if glu else x.dtype in (np.float32, np.float16)
        assert ids.dtype == np.int32 and ids.flags.c_contiguous and src.slot_of.dtype == np.int32
        assert k % cls.block_size == 0, f"rows of {k} weights are not whole {cls.name} blocks"
        smem = (k + k // 32) * 4 + MG_WARPS * MG_STAGE                  # x padded (XS) | the warps' stages
        assert smem <= SMEM_MAX, f"moe_gemv: rows of {k} weights need {smem} bytes of shared memory"
        f32 = x.dtype == np.float32
        nul = np.uint64(0)
        grid = (-(-n // (MG_WARPS * MG_ROWS)), P)
        self._decode_fn(f"moe_gemv_{dq.SUFFIX[qtype]}")(
            grid, (32 * MG_WARPS,),
            (out, np.int32(out.strides[0] // 4), x if f32 else nul, nul if f32 else x,
             np.int32(x.strides[0] // x.itemsize), np.int32(x_div), ids, src.slot_of, src.cache,
             np.int64(src.cache.strides[0]), np.uint64(src.arena.ctypes.data), np.int64(src.arena.strides[0]),
             np.int64(off), np.int32(n), np.int32(k // cls.block_size), np.int32(glu)),
            stream=stream.s, shared_mem=smem)

    def kv_store_at(self, kc, vc, k, v, pos, stream):
        n = k.size
        assert k.flags.c_contiguous and v.flags.c_contiguous and kc.shape[1] * kc.shape[2] == n
        self._decode_fn("kv_store_at")((-(-n // 256),), (256,), (kc, vc, k, v, pos, np.int32(n)), stream=stream.s)

    def attn_decode_takes(self, hd):
        return hd <= 32 * AD_MAXD and hd % 8 == 0      # a lane's columns in registers; key rows in 16-byte loads

    def attn_decode_cols(self, n_ctx, hd):
        return attn_decode_cols(n_ctx, hd)

    def attn_decode(self, out, q, kc, vc, pos, scratch, stream):
        T, H, hd = q.shape
        Hkv = kc.shape[1]
        assert T == 1 and q.flags.c_contiguous and out.flags.c_contiguous and scratch.dtype == np.float32
        assert self.attn_decode_takes(hd), f"attn_decode takes head sizes of 8k <= {32 * AD_MAXD}, not {hd}"
        ld = scratch.shape[1]
        assert scratch.shape[0] >= H and ld >= self.attn_decode_cols(kc.shape[0], hd), \
            f"attn_decode: scratch rows of {ld} floats, {self.attn_decode_cols(kc.shape[0], hd)} needed"
        gb = query_group(H, Hkv)
        self._decode_fn("attn_dec_part")((H // gb, AD_PARTS), (AD_THREADS,),
                                         (q, kc, vc, pos, scratch, np.int32(ld), np.int32(H), np.int32(Hkv),
                                          np.int32(hd), np.float32(1.0 / np.sqrt(hd)), np.int32(gb)),
                                         stream=stream.s, shared_mem=(1 + AD_THREADS // 32) * gb * hd * 4)
        self._decode_fn("attn_dec_merge")((H,), (AD_THREADS,), (out, pos, scratch, np.int32(ld), np.int32(hd)),
                                          stream=stream.s)
