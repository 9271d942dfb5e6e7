"""The pre-sync launch groups' tables on CUDA (presync.py states the rule; cuda/route_kernels.cu plan_groups makes
them, kernels.py states the contract). Legend: E experts, J groups, G members a group, W blob offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from strata.accel.presync import PlanLayout, PreGroup, PreShape, pre_bytes, up256

PLAN_THREADS = 256                  # plan_groups' block (route_kernels.cu __launch_bounds__)


@dataclass(frozen=True)
class CudaPreTables:
    """presync.pre_bytes' layout at a device address: off i32 [E] | ptrs u64 [J, 2, W, G] | tiles i32 [J, ts, 3] |
    spans i32 [J, 2]."""

    shape: PreShape
    off: int
    ptrs: int
    tiles: int
    spans: int

    @cached_property
    def args(self) -> tuple:
        """plan_groups' first four arguments (off, ptrs, tiles, spans), made once a chunk."""
        return tuple(np.uint64(a) for a in (self.off, self.ptrs, self.tiles, self.spans))

    @classmethod
    def at(cls, base: int, s: PreShape) -> CudaPreTables:
        ptrs = base + up256(4 * s.E)
        tiles = ptrs + up256(8 * s.J * 2 * s.W * s.G)
        return cls(s, base, ptrs, tiles, tiles + up256(12 * s.J * s.ts))


class CudaPresyncKernels:
    """Mixed into CudaKernels (self.cp, self.mods, self._route_fn, the staging ring's _room / _send)."""

    def pre_tables(self, buf, shape: PreShape):
        assert buf.dtype == np.uint8 and buf.nbytes >= pre_bytes(shape) and buf.data.ptr % 256 == 0
        return CudaPreTables.at(buf.data.ptr, shape)

    def pre_route_off(self, pt):
        return (pt.off, pt.shape.E)

    def plan_groups(self, pt, hist, nt, order, nc1, blobs, offs, J1, J, tiling, fill, stream):
        lay = PlanLayout(pt.shape.E, pt.shape.W)
        off, room = self._room(lay.nbytes, stream)            # one upload: the staging ring's next bytes
        self._plan_fill(room[:lay.nbytes], pt.shape, nt, order, nc1, blobs, offs, J1, J, tiling, fill)
        self._send(off, lay.nbytes, stream)
        self._plan_launch(pt, hist, self._st(stream).dbase + off, J, stream)

    def plan_write(self, blk, shape, nt, order, nc1, blobs, offs, J1, J, tiling, fill):
        self._plan_fill(blk, shape, nt, order, nc1, blobs, offs, J1, J, tiling, fill)

    def plan_groups_at(self, pt, hist, blk, dblk, J, stream):
        n = PlanLayout(pt.shape.E, pt.shape.W).nbytes
        assert blk.nbytes >= n and dblk.nbytes >= n and blk.ctypes.data % 16 == 0 and dblk.data.ptr % 16 == 0
        self._pull_words(dblk, np.uint64(blk.ctypes.data), n // 16, stream)        # pulled: read at the work's turn
        self._plan_launch(pt, hist, dblk.data.ptr, J, stream)

    @staticmethod
    def _plan_fill(room, s, nt, order, nc1, blobs, offs, J1, J, tiling, fill) -> None:
        """presync.PlanLayout's bytes into room (host u8): the sizes, the order, each candidate's blob address (a
        row of the cache or of the ring), the offsets."""
        lay = PlanLayout(s.E, s.W)
        nc = sum(len(idx) for _, idx in blobs)
        few_rows, rows_tile, bm = tiling
        assert J1 <= J <= s.J and len(offs) == s.W and nc1 <= nc <= len(order) <= s.E
        n_o = len(order)
        room[:lay.order_at].view(np.int32)[:] = (nt, s.E, n_o, nc1, nc, s.W, J1, J, s.G, few_rows, rows_tile, bm,
                                                 s.sf, s.sg, *fill)
        room[lay.order_at:lay.order_at + 4 * n_o].view(np.int32)[:] = order
        words = room[lay.ptrs_at:lay.ptrs_at + 8 * nc].view(np.uint64)
        at = 0
        for buf, idx in blobs:
            words[at:at + len(idx)] = np.uint64(buf.data.ptr) + np.asarray(idx, np.uint64) * np.uint64(buf.strides[0])
            at += len(idx)
        room[lay.offs_at:lay.offs_at + 8 * s.W].view(np.uint64)[:] = offs

    def _plan_launch(self, pt, hist, dev: int, J: int, stream) -> None:
        """plan_groups' launch over its input at device address `dev` (presync.PlanLayout)."""
        s = pt.shape
        assert hist.dtype == np.int32 and hist.shape[1] == s.E and J <= s.J
        lay = PlanLayout(s.E, s.W)
        shared = 4 * (6 * s.E + 3 * J * s.G + 2 * J + 32)   # route_kernels.cu plan_groups' arrays
        self._route_fn("plan_groups")(
            (1,), (PLAN_THREADS,),
            (*pt.args, hist, np.uint64(dev), np.uint64(dev + lay.order_at), np.uint64(dev + lay.ptrs_at),
             np.uint64(dev + lay.offs_at)),
            stream=stream.s, shared_mem=shared)

    def pre_group(self, pt, j, fill, bm):
        s = pt.shape
        nf, ng = fill
        p = pt.ptrs + 8 * 2 * j * s.W * s.G
        few = tuple((p + 8 * w * s.G, s.G) for w in range(s.W))
        many = tuple((p + 8 * (s.W + w) * s.G, s.G) for w in range(s.W))
        t = pt.tiles + 12 * j * s.ts
        return PreGroup(few, many, (t, nf), (t + 12 * s.sf, ng), nf, ng, bm, (pt.spans + 8 * j, 2))

    def swiglu_span(self, out, gu, span, f, rows, stream):
        assert out.dtype == np.float16 and gu.dtype == np.float32 and gu.strides[1] == 4 and out.flags.c_contiguous
        assert out.shape[1] == f
        if rows:
            self.fn["swiglu_span"]((min(rows, 4096),), (256,),
                                   (out, gu, np.uint64(span[0]), np.int32(f), np.int32(gu.strides[0] // 4)),
                                   stream=stream.s)
