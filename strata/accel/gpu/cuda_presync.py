"""The pre-sync launch groups' tables on CUDA (presync.py states the rule; cuda/route_kernels.cu plan_groups makes
them, kernels.py states the contract). Legend: E experts, J groups, G members a group, W blob offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from strata.accel.presync import PreGroup, PreShape, pre_bytes

PLAN_THREADS = 256                  # plan_groups' block (route_kernels.cu __launch_bounds__)
PLAN_PRM = 16                       # its sizes, uploaded ahead of the order (route_kernels.cu plan_groups' prm)


def _up(n: int) -> int:
    return -(-n // 256) * 256


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
        ptrs = base + _up(4 * s.E)
        tiles = ptrs + _up(8 * s.J * 2 * s.W * s.G)
        return cls(s, base, ptrs, tiles, tiles + _up(12 * s.J * s.ts))


class CudaPresyncKernels:
    """Mixed into CudaKernels (self.cp, self.mods, self._route_fn, the staging ring's _room / _send)."""

    def pre_tables(self, buf, shape: PreShape):
        assert buf.dtype == np.uint8 and buf.nbytes >= pre_bytes(shape) and buf.data.ptr % 256 == 0
        return CudaPreTables.at(buf.data.ptr, shape)

    def pre_route_off(self, pt):
        return (pt.off, pt.shape.E)

    def plan_groups(self, pt, hist, nt, order, nc1, blobs, offs, J1, J, tiling, fill, stream):
        s = pt.shape
        nc = sum(len(idx) for _, idx in blobs)
        few_rows, rows_tile, bm = tiling
        assert hist.dtype == np.int32 and hist.shape[1] == s.E and J1 <= J <= s.J and len(offs) == s.W
        assert nc1 <= nc <= len(order) <= s.E
        n_o = len(order)
        # one upload: the sizes i32 [16] | order i32 | the candidates' blob addresses u64 | offs u64
        o = 4 * PLAN_PRM
        a = o + _up(4 * n_o)
        nbytes = a + 8 * (nc + s.W)
        off, room = self._room(nbytes, stream)
        room[:o].view(np.int32)[:] = (nt, s.E, n_o, nc1, nc, s.W, J1, J, s.G, few_rows, rows_tile, bm, s.sf, s.sg,
                                      *fill)
        room[o:o + 4 * n_o].view(np.int32)[:] = order
        words = room[a:nbytes].view(np.uint64)
        at = 0
        for buf, idx in blobs:                      # each candidate's blob: a row of the cache or of the ring
            words[at:at + len(idx)] = np.uint64(buf.data.ptr) + np.asarray(idx, np.uint64) * np.uint64(buf.strides[0])
            at += len(idx)
        words[nc:] = np.asarray(offs, np.uint64)
        self._send(off, nbytes, stream)
        dev = self._st(stream).dbase + off
        shared = 4 * (6 * s.E + 3 * J * s.G + 2 * J + 32)   # route_kernels.cu plan_groups' arrays
        self._route_fn("plan_groups")(
            (1,), (PLAN_THREADS,),
            (*pt.args, hist, np.uint64(dev), np.uint64(dev + o), np.uint64(dev + a), np.uint64(dev + a + 8 * nc)),
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
