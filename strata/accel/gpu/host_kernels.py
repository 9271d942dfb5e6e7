"""The kernel set on the host twin: numpy, enqueued on the twin's stream threads (see kernels.py for the
contract). Weights fp16, matrix inputs rounded to fp16, fp32 products: the GPU's arithmetic, on the CPU.
"""

from __future__ import annotations

import numpy as np

from strata import quants
from strata.accel.gpu.dequant import GEMM_Q_TYPES
from strata.accel.gpu.kernels import ROUTE_TILE, BlobRef, Kernels
from strata.accel.presync import PlanLayout, PreGroup, plan_host
from strata.reference.linalg import weight_rows

F16, F32 = np.float16, np.float32
PAD_ROWS = 64       # the twin's GEMM rows: a multiple of prompt_graph.BUCKET (test_prompt_graph checks)


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def _weights(q, raw: np.ndarray, n: int, k: int) -> np.ndarray:
    """The n x k matrix of type q whose bytes start raw (a blob from the matrix's offset), each weight rounded to
    fp16 (nearest even): what `dequant` writes, and what expert_rows, gemm_q and moe_gemv multiply by."""
    return q.dequantize(raw[:n * q.row_bytes(k)].reshape(-1, q.type_size)).reshape(n, k).astype(F16)


def _runs(tiles, n_tiles: int):
    """(g, r0, r1) of each run of an expert's consecutive tiles: one product a run, as numpy's sums depend on the
    rows a product takes and the CUDA kernels' on the rows and W[g] alone, whatever the tiles (max_rows); empty
    tiles (presync.py) compute nothing."""
    i, t = 0, np.asarray(tiles[:n_tiles])
    t = t[t[:, 1] < t[:, 2]]
    while i < len(t):
        g, r0, r1 = (int(x) for x in t[i])
        i += 1
        while i < len(t) and t[i, 0] == g and t[i, 1] == r1:
            r1 = int(t[i, 2])
            i += 1
        yield g, r0, r1


class _PreTables:
    """presync's tables on the twin: off i32 [E], ptrs [J, 2, W, G] (blob entries or None), tiles i32 [J, ts, 3],
    spans i32 [J, 2]."""

    def __init__(self, shape, off, ptrs, tiles, spans):
        self.shape, self.off, self.ptrs, self.tiles, self.spans = shape, off, ptrs, tiles, spans


class HostKernels(Kernels):
    gemm_q_types = GEMM_Q_TYPES

    def __init__(self, dev):
        self.dev = dev
        self._pre = {}            # (buffer's address, shape) -> _PreTables: as on CUDA, the tables live at the buffer
        self._plan_in = {}        # plan_write's block address -> the input written there last (plan_groups_at's)

    def _run(self, stream, fn):
        stream._put(fn)

    def upload(self, host, stream):
        return np.array(host, copy=True)   # snapshot now, as a CUDA upload from a pinned staging copy would

    def pull(self, dst, src, stream):
        assert dst.nbytes == src.nbytes and src.nbytes % 16 == 0, (dst.nbytes, src.nbytes)
        self._run(stream, lambda: dst.__setitem__(slice(None), src))

    def copy(self, dst, src, stream):
        assert dst.shape == src.shape and dst.dtype == src.dtype, (dst.shape, src.shape)
        self._run(stream, lambda: np.copyto(dst, src))

    def blob_table(self, refs: list[BlobRef], byte_off: int) -> np.ndarray:
        t = np.empty(len(refs), object)
        for i, r in enumerate(refs):
            t[i] = (r.buf, r.index, byte_off)
        return t

    # --- the row layout from the device's routing ------------------------------------------------------------
    def route_hist(self, hist, ids, P, stream):
        E = hist.shape[1]

        def run():
            e = ids.reshape(-1)[:P]
            for t in range(-(-P // ROUTE_TILE)):
                hist[t] = np.bincount(e[t * ROUTE_TILE:(t + 1) * ROUTE_TILE], minlength=E)

        self._run(stream, run)

    def route_rows(self, slot, src, ids, off, hist, P, K, stream):
        def run():
            e = ids.reshape(-1)[:P]
            by = np.argsort(e, kind="stable")                 # pairs by expert, each expert's in pair order
            es = e[by]
            rows = off[es] + np.arange(P) - np.searchsorted(es, es)     # off + the pair's index among its expert's
            slot.reshape(-1)[by] = rows
            src.reshape(-1)[rows] = by // K

        self._run(stream, run)

    # --- a layer's cache hits before its routing sync -----------------------------------------------------------
    def pre_tables(self, buf, shape):
        s = shape
        key = (buf.__array_interface__["data"][0], s)
        pt = self._pre.get(key)
        if pt is None:
            if len(self._pre) >= 16:          # buffers that moved (a loan of other slots): theirs are gone
                self._pre.clear()
            pt = self._pre[key] = _PreTables(s, np.zeros(s.E, np.int32), np.full((s.J, 2, s.W, s.G), None, object),
                                             np.zeros((s.J, s.ts, 3), np.int32), np.zeros((s.J, 2), np.int32))
        return pt

    def pre_route_off(self, pt):
        return pt.off

    def plan_groups(self, pt, hist, nt, order, nc1, blobs, offs, J1, J, tiling, fill, stream):
        inp = self._plan_input(nt, order, nc1, blobs, offs, J1, J, tiling, fill)
        self._run(stream, lambda: self._plan_run(pt, hist, *inp))

    def plan_write(self, blk, shape, nt, order, nc1, blobs, offs, J1, J, tiling, fill):
        assert J1 <= J <= shape.J and len(offs) == shape.W and blk.nbytes >= PlanLayout(shape.E, shape.W).nbytes
        # the twin's blob "addresses" are (buffer, row) pairs: kept beside blk, which stands for them
        self._plan_in[blk.__array_interface__["data"][0]] = self._plan_input(nt, order, nc1, blobs, offs, J1, J,
                                                                             tiling, fill)

    def plan_groups_at(self, pt, hist, blk, dblk, J, stream):
        at = blk.__array_interface__["data"][0]
        self._run(stream, lambda: self._plan_run(pt, hist, *self._plan_in[at]))     # what blk holds at the work's turn

    @staticmethod
    def _plan_input(nt, order, nc1, blobs, offs, J1, J, tiling, fill) -> tuple:
        return nt, np.array(order, np.int64), nc1, [(buf, int(i)) for buf, idx in blobs for i in idx], tuple(offs), \
            J1, J, tiling, fill

    @staticmethod
    def _plan_run(pt, hist, nt, order, nc1, where, offs, J1, J, tiling, fill) -> None:
        s = pt.shape
        cnt = hist[:nt].sum(0)
        off, members, tiles, spans = plan_host(cnt, order, nc1, len(where), J1, J, s.G, *tiling)
        pt.off[:] = off
        pt.ptrs[...] = None
        pt.tiles[...] = 0
        for j in range(J):
            for p, i in enumerate(members[j]):
                buf, row = where[i]
                for w, o in enumerate(offs):
                    pt.ptrs[j, 0, w, p] = (buf, row, o)
                    if cnt[order[i]] > tiling[0]:
                        pt.ptrs[j, 1, w, p] = (buf, row, o)
            few, gemm = tiles[j]
            assert len(few) <= fill[0] and len(gemm) <= fill[1]
            pt.tiles[j, :len(few)] = np.asarray(few, np.int32).reshape(-1, 3)
            pt.tiles[j, s.sf:s.sf + len(gemm)] = np.asarray(gemm, np.int32).reshape(-1, 3)
            pt.spans[j] = spans[j]

    def pre_group(self, pt, j, fill, bm):
        s = pt.shape
        return PreGroup(tuple(pt.ptrs[j, 0]), tuple(pt.ptrs[j, 1]), pt.tiles[j, :s.sf], pt.tiles[j, s.sf:], *fill, bm,
                        pt.spans[j])

    def swiglu_span(self, out, gu, span, f, rows, stream):
        def run():
            r0, r1 = int(span[0]), int(span[1])
            out[r0:r1] = (_silu(gu[r0:r1, :f]) * gu[r0:r1, f:2 * f]).astype(F16)

        self._run(stream, run)

    # --- experts ---------------------------------------------------------------------------------------------
    def dequant(self, out, blobs, qtype, n, k, stream):
        q = quants.get(qtype)

        def run():
            for g, entry in enumerate(blobs):
                if entry is None:                      # a pre-sync group's member that takes expert_rows
                    continue
                buf, idx, off = entry
                out[g] = _weights(q, buf[idx, off:], n, k)

        self._run(stream, run)

    def expert_rows(self, out, a, blobs, tiles, n_tiles, qtype, n, k, stream):
        q = quants.get(qtype)

        def run():
            for g, r0, r1 in tiles[:n_tiles]:
                if r0 >= r1:                           # an empty tile (presync.py)
                    continue
                buf, idx, off = blobs[g]
                w = _weights(q, buf[idx, off:], n, k)
                out[r0:r1, :n] = a[r0:r1, :k].astype(F32) @ w.astype(F32).T

        self._run(stream, run)

    def dequant_matrix(self, out, raw, qtype, stream):
        N, K = out.shape
        assert out.dtype in (F16, F32) and raw.dtype == np.uint8, (out.dtype, raw.dtype)

        def run():
            out[...] = weight_rows(raw.reshape(N, -1), qtype, 0, N, K)     # into f16: nearest even

        self._run(stream, run)

    def gather_f16(self, out, x, src, stream):
        src = src.reshape(-1)[:out.shape[0]]
        self._run(stream, lambda: out.__setitem__(slice(None), x[src].astype(F16)))

    def gemm_grouped(self, out, a, w, tiles, n_tiles, stream, max_rows=None):
        def run():
            for g, r0, r1 in _runs(tiles, n_tiles):
                out[r0:r1] = a[r0:r1].astype(F32) @ w[g].astype(F32).T

        self._run(stream, run)

    def gemm_q(self, out, a, blobs, qtype, n, k, tiles, n_tiles, stream, max_rows=None):
        assert qtype in self.gemm_q_types, f"gemm_q takes no type {qtype}"
        q = quants.get(qtype)

        def run():               # `dequant`'s weights, `gemm_grouped`'s products
            for g, r0, r1 in _runs(tiles, n_tiles):
                buf, idx, off = blobs[g]
                w = _weights(q, buf[idx, off:], n, k)
                out[r0:r1, :n] = a[r0:r1, :k].astype(F32) @ w.astype(F32).T

        self._run(stream, run)

    def swiglu(self, out, gu, f, stream):
        self._run(stream, lambda: out.__setitem__(slice(None), (_silu(gu[:, :f]) * gu[:, f:2 * f]).astype(F16)))

    def combine(self, out, dm, slot, w, stream):
        slot = slot.reshape(-1)[:w.size].reshape(w.shape)

        def run():
            acc = np.zeros(out.shape, F32)
            for k in range(slot.shape[1]):
                acc += w[:, k, None] * dm[slot[:, k]]
            out[...] = acc

        self._run(stream, run)

    # --- the decode graph --------------------------------------------------------------------------------------
    def moe_gemv(self, out, x, x_div, ids, src, off, qtype, n, k, stream, glu=False):
        q = quants.get(qtype)

        def run():                       # residency is read when the work runs, as the kernel reads slot_of
            xr = (_silu(x[:, :k]) * x[:, k:2 * k]).astype(F16) if glu else x               # swiglu's rows
            for p, e in enumerate(ids.reshape(-1)):
                s = src.slot_of[e]
                blob = src.cache[s] if s >= 0 else src.arena[e]
                w = _weights(q, blob[off:], n, k)
                out[p, :n] = w.astype(F32) @ xr[p // x_div].astype(F16).astype(F32)

        self._run(stream, run)

    def kv_store_at(self, kc, vc, k, v, pos, stream):
        self._run(stream, lambda: self.kv_store(kc, vc, k, v, int(pos[0]), self.dev.compute))

    def attn_decode(self, out, q, kc, vc, pos, scratch, stream):
        self._run(stream, lambda: self.attention(out, q, kc, vc, int(pos[0]), scratch, self.dev.compute))

    # --- dense ---------------------------------------------------------------------------------------------
    def rms_norm(self, out, x, w, eps, stream):
        def run():
            ms = np.mean(x * x, axis=-1, keepdims=True)
            out[...] = x / np.sqrt(ms + eps) * w

        self._run(stream, run)

    def linear(self, out, x, w, stream, bias=None):
        def run():
            # a prompt's product over its rows padded to a multiple of 64, as a padded prompt segment's
            # (prompt_graph.py): a GEMM's rows may take other bits with the row count (OpenBLAS's sgemm on an AMD
            # EPYC: 41 rows against the same 41 of 64), and a padded segment must keep the unpadded bits on the
            # twin. One row stays a GEMV: each output its own dot product, whatever the matrix's height (a decode
            # step's fused q|k|v keeps the bits of three)
            T = x.shape[0]
            if T == 1:
                y = x.astype(F16).astype(F32) @ w.astype(F32).T
            else:
                xp = np.zeros((-(-T // PAD_ROWS) * PAD_ROWS, x.shape[1]), F32)
                xp[:T] = x.astype(F16)
                y = (xp @ w.astype(F32).T)[:T]
            out[...] = y if bias is None else y + bias

        self._run(stream, run)

    def rope(self, x, cos, sin, pos, n_rot, neox, stream):
        def run():
            c, s = cos[pos][:, None, :], sin[pos][:, None, :]
            if neox:
                h = n_rot // 2
                a, b = x[..., :h].copy(), x[..., h:n_rot].copy()
                x[..., :h], x[..., h:n_rot] = a * c - b * s, a * s + b * c
            else:
                a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
                x[..., 0:n_rot:2], x[..., 1:n_rot:2] = a * c - b * s, a * s + b * c

        self._run(stream, run)

    def kv_store(self, kc, vc, k, v, pos0, stream):
        def run():
            kc[pos0:pos0 + k.shape[0]] = k.astype(F16)
            vc[pos0:pos0 + v.shape[0]] = v.astype(F16)

        self._run(stream, run)

    def attention(self, out, q, kc, vc, pos0, scratch, stream):
        def run():
            T, H, hd = q.shape
            S = pos0 + T
            g = H // kc.shape[1]
            k = np.repeat(kc[:S].astype(F32), g, axis=1)                    # [S, H, hd]
            v = np.repeat(vc[:S].astype(F32), g, axis=1)
            sc = np.einsum("thd,shd->hts", q.astype(F16).astype(F32), k) / np.sqrt(F32(hd))   # [H, T, S]
            mask = np.arange(S)[None, :] > (pos0 + np.arange(T))[:, None]
            sc[:, mask] = -np.inf
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            p = sc / sc.sum(-1, keepdims=True)
            out[...] = np.einsum("hts,shd->thd", p.astype(F16).astype(F32), v).reshape(T, H * hd)

        self._run(stream, run)

    def router(self, ids, w, logits, k, renorm, stream):
        def run():
            x = logits.astype(np.float64)
            p = np.exp(x - x.max(1, keepdims=True))
            p = (p / p.sum(1, keepdims=True)).astype(F32)
            top = np.argsort(-p, axis=1, kind="stable")[:, :k]
            wt = np.take_along_axis(p, top, 1)
            if renorm:                 # the sum in k order from +0.0 (RefOps.renorm), as the CUDA kernel's
                s = np.zeros(wt.shape[0], F32)
                for j in range(k):
                    s += wt[:, j]
                wt = wt / s[:, None]
            ids[...] = top
            w[...] = wt

        self._run(stream, run)

    def add(self, out, a, b, stream):
        self._run(stream, lambda: np.add(a, b, out=out))

    def add_bias(self, out, y, b, stream):
        self._run(stream, lambda: np.add(y, b, out=out))

    def sigmoid_gate(self, out, s, g, stream):
        self._run(stream, lambda: out.__setitem__(slice(None), s / (1.0 + np.exp(-g))))
