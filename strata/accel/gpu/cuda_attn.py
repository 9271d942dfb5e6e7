"""The prompt attention on CUDA (kernels.py `attention`): attn_kernels.cu's two-pass kernels with scores in
registers for head sizes FLASH_HD, 16 or 32 query rows a warp (the same bits), else query blocks through cuBLAS.

Legend: T queries, H/Hkv heads, hd head size, M = T·H/Hkv rows of one kv head, S keys.
"""

from __future__ import annotations

import numpy as np

from strata.accel.gpu.blas_enums import COMPUTE_32F, GEMM_DEFAULT, OP_N, OP_T, R_16F, R_32F
from strata.accel.gpu.kernels import ONE_PASS_HEAD_DIMS

FLASH_HD = ONE_PASS_HEAD_DIMS     # head sizes attn_kernels.cu is built for
W32_WAVES = 4   # launches of at least this many waves of 128-row blocks (2 a multiprocessor) take them
W32_KEYS = 4    # ... and chunks with at least this many keys a query row: late in a long prompt


def attn_block_rows(M: int, Hkv: int, sms: int, T: int = 0, keys: int = 0) -> int:
    """Query rows a prompt attention block takes for M rows a kv head: 128 (flash_attention_w32) where its blocks
    fill W32_WAVES waves of the GPU, else 64. On the H200 (bench/results/h200/attn_w32_stop33.log) the 32-row warps
    were 1.044x on qwen3's resident 8K prompt (2,048 blocks of 128 rows) but 0.94-0.97x alone on its 1,280-token
    chunks (320 blocks, uneven causal work in ~1.2 waves) and 0.99x on its 2K prompt (512 blocks). A chunk of T
    queries over `keys` keys, at least W32_KEYS·T, takes 128 as well: there every block walks about the same keys,
    and each key step loaded serves twice the rows (a 1,171-token chunk: 1.06x over 4,684 keys, 1.09x over 8,197,
    but 0.89x over 2,342; bench/results/h200/attn_split_stop39.log)."""
    if -(-M // 128) * Hkv >= W32_WAVES * 2 * sms or (T and keys >= W32_KEYS * T):
        return 128
    return 64


def _w32_smem(hd: int) -> int:
    """flash_attention_w32's dynamic shared memory: Q (FB_ROWS rows), K and V (FA_KEYS rows each), rows of hd + 8
    halves."""
    return (128 + 64 + 64) * (hd + 8) * 2


class CudaAttentionKernels:
    """CudaKernels' prompt attention (a mixin: it uses the kernel set's cp, fn, cublas, handle, _one and _zero)."""

    def _init_attention(self):
        self._afn = None                 # attn_kernels.cu, compiled on first use
        # query rows a prompt attention block takes: 128 (4 warps of 32, flash_attention_w32) or 64 (4 of 16), the
        # same bits (test_attention_w32_gives_the_16_row_bits); None: attn_block_rows chooses by the launch's size
        self.attn_rows = None
        self.sms = self.cp.cuda.Device().attributes["MultiProcessorCount"]

    def attention(self, out, q, kc, vc, pos0, scratch, stream):
        """Scores in registers (attn_kernels.cu: two passes, blocks of attn_rows query rows) for head sizes
        FLASH_HD; else query blocks through cuBLAS with their scores in `scratch`."""
        T, H, hd = q.shape
        if hd not in FLASH_HD:
            return self._attention_blocked(out, q, kc, vc, pos0, scratch, stream)
        assert q.flags.c_contiguous and out.flags.c_contiguous and kc.flags.c_contiguous and vc.flags.c_contiguous
        Hkv = kc.shape[1]
        if self._afn is None:
            mod = self.mods.get("attn")
            self._afn = {(d, rows): mod.get_function(f"flash_attention_{'w32_' if rows == 128 else ''}{d}")
                         for d in FLASH_HD for rows in (64, 128)}
            for d in FLASH_HD:
                self._afn[d, 128].max_dynamic_shared_size_bytes = _w32_smem(d)
        M = T * (H // Hkv)
        rows = self.attn_rows or attn_block_rows(M, Hkv, self.sms, T, pos0 + T)
        self._afn[hd, rows]((-(-M // rows), Hkv), (128,), (out, q, kc, vc, np.int32(T), np.int32(H), np.int32(Hkv),
                                                          np.int32(pos0), np.float32(1.0 / np.sqrt(hd))),
                            stream=stream.s, shared_mem=_w32_smem(hd) if rows == 128 else 0)

    def _attention_blocked(self, out, q, kc, vc, pos0, scratch, stream):
        """Query blocks through cuBLAS: scores = Q·Kᵀ per kv head (its g query heads as rows), masked softmax,
        P·V, each block sized so its score buffers fit `scratch`."""
        cb = self.cublas
        T, H, hd = q.shape
        Hkv = kc.shape[1]
        g = H // Hkv
        S_all = pos0 + T
        per_q = H * (hd * 2 + S_all * 4 + S_all * 2 + hd * 4) + 1024
        Tq = max(1, min(T, scratch.nbytes // per_q))
        s = stream.s
        scale = np.float32(1.0 / np.sqrt(hd))
        assert per_q <= scratch.nbytes, f"attention needs {per_q} scratch bytes per query, has {scratch.nbytes}"
        ldk = Hkv * hd

        def carve(off, n, dtype):       # a typed view of the scratch bytes [off, off + n·itemsize)
            nb = n * np.dtype(dtype).itemsize
            return scratch[off:off + nb].view(dtype), off + (nb + 255) // 256 * 256

        for q0 in range(0, T, Tq):
            tq = min(Tq, T - q0)
            S = pos0 + q0 + tq                                        # keys any query of the block may see
            M = tq * g
            n = Hkv * M * hd
            qp, off = carve(0, n, np.float16)                          # [Hkv][M][hd]
            sc, off = carve(off, Hkv * M * S, np.float32)              # [Hkv][M][S]
            pp, off = carve(off, Hkv * M * S, np.float16)
            oo, off = carve(off, n, np.float32)                        # [Hkv][M][hd]
            grid = (min(4096, -(-n // 256)),)
            self.fn["attn_qperm"](grid, (256,), (qp, q, np.int32(q0), np.int32(tq), np.int32(H), np.int32(Hkv),
                                                 np.int32(hd)), stream=s)
            cb.setStream(self.handle, s.ptr)
            cb.gemmStridedBatchedEx(self.handle, OP_T, OP_N, S, M, hd, self._one.ctypes.data,
                                    kc.data.ptr, R_16F, ldk, hd, qp.data.ptr, R_16F, hd, M * hd,
                                    self._zero.ctypes.data, sc.data.ptr, R_32F, S, M * S, Hkv, COMPUTE_32F,
                                    GEMM_DEFAULT)
            self.fn["attn_softmax"]((Hkv * M,), (128,), (pp, sc, np.int32(M), np.int32(S), np.int32(g),
                                                         np.int32(pos0 + q0), scale), stream=s)
            cb.gemmStridedBatchedEx(self.handle, OP_N, OP_N, hd, M, S, self._one.ctypes.data,
                                    vc.data.ptr, R_16F, ldk, hd, pp.data.ptr, R_16F, S, M * S,
                                    self._zero.ctypes.data, oo.data.ptr, R_32F, hd, M * hd, Hkv, COMPUTE_32F,
                                    GEMM_DEFAULT)
            self.fn["attn_operm"](grid, (256,), (out, oo, np.int32(q0), np.int32(tq), np.int32(H),
                                                 np.int32(Hkv), np.int32(hd)), stream=s)
