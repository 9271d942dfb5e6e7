"""The experts' kernels on CUDA (kernels.py states each contract): the dequantisation into the fp16 scratch, the few-row
experts straight from their blobs (cuda/rows_kernels.cu), and the grouped GEMM on tensor cores, from the scratch
(`gemm_grouped`, cuda/engine_kernels.cu) or from the blobs (`gemm_q`, cuda/gemm_q_kernels.cu), with their launch
shapes read from mma.cuh. A mixin of CudaKernels, which owns the modules and the tables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from strata.accel.gpu import dequant as dq
from strata.accel.moe import GEMM_BM

ER_WARPS, ER_ROWS = 8, 2            # expert_rows: warps a block (rows_kernels.cu), weight rows a warp


@dataclass(frozen=True)
class GemmLaunch:
    """A grouped-GEMM kernel's launch shape, from its template arguments in mma.cuh (`#define GEMM64_ARGS WM, WN,
    MI, NJ, BK, S`: WM x WN warps of (16·MI) x (8·NJ), k step BK, S stages), so the source holds the one copy."""

    rows: int           # the row tile the kernel's tiles are cut at
    cols: int           # output columns a block (the grid's y: ceil(N / cols))
    threads: int
    smem: int           # dynamic shared memory, bytes: S x (rows + cols) x (BK + 8) halves
    stages: int = 0     # S
    bk: int = 0         # BK

    @classmethod
    def of(cls, macro: str) -> GemmLaunch:
        m = re.search(rf"^#define {macro} (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)$", dq.source("mma.cuh"), re.M)
        assert m, f"mma.cuh defines no {macro}"
        wm, wn, mi, nj, bk, s = map(int, m.groups())
        rows, cols = wm * 16 * mi, wn * 8 * nj
        return cls(rows, cols, wm * wn * 32, s * (rows + cols) * (bk + 8) * 2, s, bk)

    def quantised(self, block_size: int, type_size: int) -> GemmLaunch:
        """The same tiling's gemm_q kernel for a type (gemm_q_kernels.cu GemmQ::SMEM): S stages of A rows, two fp16
        W tiles, two raw stages of a row's 256 weights (the 16-byte words they span at any alignment, plus one)."""
        ld, sb = self.bk + 8, 256 // block_size * type_size
        rs = ((sb + 15) // 16 + 1) * 16
        return replace(self, smem=self.stages * self.rows * ld * 2 + 2 * self.cols * ld * 2 + 2 * self.cols * rs)

    def prepare(self, fn) -> None:
        """Lets `fn` (the kernel, a CuPy RawKernel) take its dynamic shared memory, past the 48 KiB default."""
        fn.max_dynamic_shared_size_bytes = self.smem

    def launch(self, fn, n_tiles: int, N: int, args, stream) -> None:
        fn((n_tiles, -(-N // self.cols)), (self.threads,), args, stream=stream, shared_mem=self.smem)


GEMM64, GEMM128 = GemmLaunch.of("GEMM64_ARGS"), GemmLaunch.of("GEMM128_ARGS")
assert GEMM64.rows == GEMM_BM, "moe.GEMM_BM is gemm_grouped_mma's row tile"
BIG_BM = GEMM128.rows               # gemm_grouped_mma128's row tile


def _tab_ptr(t):
    """A kernel argument for a table: a packed table is a plain (device address, length) tuple (a layer has
    hundreds; tuples cost a fraction of objects on the host), else a CuPy array."""
    return np.uint64(t[0]) if isinstance(t, tuple) else t


class CudaExpertKernels:
    # --- experts ------------------------------------------------------------------------------------------------
    def dequant(self, out, blobs, qtype, n, k, stream):
        if isinstance(blobs, tuple):
            plan = self._dq_plans.get((qtype, n, k, blobs[1]))
            if plan is not None and out.flags.c_contiguous:
                fn, grid, g, nr, rb = plan
                fn(grid, (dq._THREADS,), (np.uint64(blobs[0]), g, nr, rb, out), stream=stream.s)
                return
            blobs = self._as_array(blobs, np.uint64)
        if out.flags.c_contiguous:
            key = (qtype, n, k, blobs.shape[0])
            plan = self._dq_plans.get(key)
            if plan is None:      # the wrapper's checks once per shape, then straight launches
                dq.launch(self.dq, qtype, blobs, blobs.shape[0], n, k, out, stream.s)
                cls = dq.quants.get(qtype)
                rb = cls.row_bytes(k) // cls.type_size
                self._dq_plans[key] = (self.dq.get_function(dq.KERNEL_NAME[qtype]),
                                       (dq._grid_x(n * rb, qtype), blobs.shape[0]), np.int32(blobs.shape[0]),
                                       np.int32(n), np.int32(rb))
                return
            fn, grid, g, nr, rb = plan
            fn(grid, (dq._THREADS,), (blobs, g, nr, rb, out), stream=stream.s)
            return

        tmp = self.cp.empty((blobs.shape[0], n, k), np.float16)      # a split gate/up of two types
        dq.launch(self.dq, qtype, blobs, blobs.shape[0], n, k, tmp, stream.s)
        with stream.s:
            out[...] = tmp

    def expert_rows(self, out, a, blobs, tiles, n_tiles, qtype, n, k, stream):
        cls = dq._check_type(qtype)
        assert out.dtype == np.float32 and out.strides[1] == 4 and out.shape[1] >= n
        assert a.dtype == np.float16 and a.strides[1] == 2 and a.shape[1] >= k
        assert k % cls.block_size == 0, f"rows of {k} weights are not whole {cls.name} blocks"
        if not n_tiles:
            return
        fn = self._rfn.get(qtype)
        if fn is None:
            fn = self._rfn[qtype] = self.mods.get("rows").get_function(f"expert_rows_{dq.SUFFIX[qtype]}")
        lda = a.strides[0] // 2
        vec = np.int32(lda % 8 == 0 and a.data.ptr % 16 == 0)      # 16-byte loads of the input rows
        grid = (int(n_tiles), min(65535, -(-n // (ER_WARPS * ER_ROWS))))
        fn(grid, (32 * ER_WARPS,), (out, np.int32(out.strides[0] // 4), a, np.int32(lda),
                                    _tab_ptr(blobs), _tab_ptr(tiles), np.int32(n),
                                    np.int32(k // cls.block_size), vec), stream=stream.s)

    def gemm_grouped(self, out, a, w, tiles, n_tiles, stream, max_rows=None):
        """Tiles cut at 128 rows (max_rows > 64, or None) take gemm_grouped_mma128 (4 warps of 64x64), 1.09-1.36x
        faster than the 64-row kernel on experts of 80-1,024 rows; tiles cut at 64 rows gemm_grouped_mma (8 warps
        of 32x32), 1.10-1.30x faster than the 128-row one on experts of up to 56 (bench/results/h200/
        gemm_kernel_stop44.log). Both make the same sums (mma.cuh gemm_tile)."""
        N, Kd = w.shape[1], w.shape[2]
        assert out.dtype == np.float32 and a.dtype == np.float16 and w.dtype == np.float16 and w.flags.c_contiguous
        assert a.strides[1] == 2 and out.strides[1] == 4 and Kd % 32 == 0, "row-major operands, k a multiple of 32"
        if not n_tiles:
            return
        args = (out, np.int32(out.strides[0] // 4), a, np.int32(a.strides[0] // 2), w,
                _tab_ptr(tiles), np.int32(N), np.int32(Kd))
        if self.gemm_kind == "simt":
            self.fn["gemm_grouped_simt"]((n_tiles, -(-N // 16)), (16, 16), args, stream=stream.s)
            return
        assert a.data.ptr % 16 == 0 and a.strides[0] % 16 == 0, "the mma kernels copy A rows in 16-byte chunks"
        if max_rows is None or max_rows > GEMM_BM:
            GEMM128.launch(self.fn["gemm_grouped_mma128"], n_tiles, N, args, stream.s)
        else:
            GEMM64.launch(self.fn["gemm_grouped_mma"], n_tiles, N, args, stream.s)

    def _gemm_q_fn(self, qtype: int, big: bool):
        key = (qtype, big)
        got = self._qfn.get(key)
        if got is None:
            cls = dq._check_type(qtype)
            assert qtype in self.gemm_q_types, f"gemm_q takes no {cls.name}"
            shape = (GEMM128 if big else GEMM64).quantised(cls.block_size, cls.type_size)
            fn = self.mods.get("gemm_q").get_function(f"gemm_q{'128' if big else ''}_{dq.SUFFIX[qtype]}")
            shape.prepare(fn)
            got = self._qfn[key] = (fn, shape, cls.block_size)
        return got

    def gemm_q(self, out, a, blobs, qtype, n, k, tiles, n_tiles, stream, max_rows=None):
        """gemm_grouped's two tilings (picked as there), each weight dequantised in the kernel from the blob's
        bytes (cuda/gemm_q_kernels.cu)."""
        fn, shape, qk = self._gemm_q_fn(qtype, max_rows is None or max_rows > GEMM_BM)
        assert out.dtype == np.float32 and out.strides[1] == 4 and out.shape[1] >= n
        assert a.dtype == np.float16 and a.strides[1] == 2 and a.shape[1] >= k
        assert k % qk == 0 and k % 32 == 0, f"rows of {k} weights are not whole blocks of 32-weight parts"
        assert a.data.ptr % 16 == 0 and a.strides[0] % 16 == 0, "the kernels copy A rows in 16-byte chunks"
        if n_tiles:
            shape.launch(fn, n_tiles, n, (out, np.int32(out.strides[0] // 4), a, np.int32(a.strides[0] // 2),
                                          _tab_ptr(blobs), _tab_ptr(tiles), np.int32(n), np.int32(k)), stream.s)
