"""The kernel set on CUDA: CuPy raw kernels (cuda/engine_kernels.cu, cuda/dequant_*.cuh) and cuBLAS through
CuPy's bindings for the dense products (see kernels.py for each contract); the prompt attention is cuda_attn.py's,
the decode graph's kernels cuda_decode.py's.

Every wrapper asserts dtype, shape and contiguity before a launch (STYLE point 6).
"""

from __future__ import annotations

import collections
import re

import numpy as np

from strata.accel.gpu import dequant as dq
from strata.accel.gpu.blas_enums import COMPUTE_32F, GEMM_DEFAULT, OP_N, OP_T, R_16F, R_32F
from strata.accel.gpu.cublas_lib import WORKSPACE_BYTES, Cublas
from strata.accel.gpu.cuda_attn import CudaAttentionKernels
from strata.accel.gpu.cuda_decode import CudaDecodeKernels
from strata.accel.gpu.cuda_experts import BIG_BM, GEMM64, GEMM128, CudaExpertKernels, _tab_ptr
from strata.accel.gpu.cuda_modules import ModuleSet
from strata.accel.gpu.cuda_presync import CudaPresyncKernels
from strata.accel.gpu.kernels import ROUTE_TILE, BlobRef, Kernels
from strata.accel.rows_host import pack_bound, pack_layer

STAGING_BYTES = 16 << 20            # pinned staging ring for `upload`
SIDE_STAGING_BYTES = 4 << 20        # the side stream's own (a layer's tables are ~100 KB at 1,280 tokens)
_NO_RIDER = np.zeros(0, np.int32)   # layer_tables' riders past those given
PULL_THREADS, PULL_BLOCKS = 256, 256   # `upload`'s pull kernel: 16 bytes a thread, at most 1 MiB a grid pass
NR_WARPS = 8                        # norm_rope_warp's heads (warps) a block
NR_MANY = 4096                      # heads from which norm_rope_warp (a prompt's; a decode token's 36 take norm_rope)
GEMV_MAX_T = 8                      # tokens up to which `linear` uses the GEMV kernels


class _Staging:
    """A pinned ring for small host tables. Uploads take consecutive bytes; a region is written again only once
    the copy that last read it has completed (the oldest in-flight uploads are checked first, in ring order)."""

    def __init__(self, dev, nbytes: int):
        self.dev, self.buf, self.pos = dev, dev.pinned(nbytes), 0
        self.dbuf = dev.empty((nbytes,), np.uint8)     # device twin: a table lands at the same offset
        self.base, self.dbase = self.buf.ctypes.data, self.dbuf.data.ptr
        self.inflight: collections.deque = collections.deque()     # (start, end, event), allocation order

    def reserve(self, nbytes: int) -> int:
        """The offset of `nbytes` free bytes (256-byte aligned), once no copy in flight still reads them; `pos`
        moves past them only with `take` (a caller may write fewer than it reserved)."""
        n = -(-max(nbytes, 1) // 256) * 256
        assert n <= self.buf.nbytes, f"a table of {nbytes} bytes exceeds the staging ring"
        if self.pos + n > self.buf.nbytes:
            self.pos = 0
        start, end = self.pos, self.pos + n
        q = self.inflight
        while q and (q[0][2].done or (q[0][0] < end and start < q[0][1])):
            if not q[0][2].done:
                q[0][2].synchronize()                      # the ring came round to a copy still in flight
            q.popleft()
        return start

    def take(self, start: int, nbytes: int) -> None:
        """Bytes [start, start + nbytes) of the last reservation are written: the next one starts after them."""
        self.pos = start + -(-max(nbytes, 1) // 256) * 256

    def put(self, host: np.ndarray) -> int:
        """Copy `host` (contiguous) into the ring; its offset (device twin: the same)."""
        start = self.reserve(host.nbytes)
        self.buf[start:start + host.nbytes] = host.reshape(-1).view(np.uint8)
        self.take(start, host.nbytes)
        return start

    def done(self, start: int, nbytes: int, stream) -> None:
        """The copy of [start, start + nbytes) is enqueued on `stream`."""
        ev = self.dev.cp.cuda.Event(disable_timing=True)
        ev.record(stream.s)
        self.inflight.append((start, start + nbytes, ev))


class CudaKernels(CudaAttentionKernels, CudaDecodeKernels, CudaPresyncKernels, CudaExpertKernels, Kernels):
    # route_rows' shared memory, (ROUTE_TILE / 32 + 1) ints an expert, within the 48 KiB a block has by default
    route_max_experts = 48 * 1024 // ((ROUTE_TILE // 32 + 1) * 4)

    def __init__(self, dev, gemm: str = "mma", log=None):
        self.dev, self.cp = dev, dev.cp
        cp = self.cp
        self.mods = ModuleSet(cp, dev.id, log)                  # every module compiling from now (cuda_modules.py)
        from cupy_backends.cuda.libs import cublas

        self.cublas = cublas                                      # CuPy's bindings (the blocked attention's)
        self.handle = cp.cuda.device.get_cublas_handle()
        self.blas = Cublas()                                      # the dense products: callable while capturing
        self._blas_ws = cp.empty((WORKSPACE_BYTES,), np.uint8)
        self.blas.set_workspace(self.handle, self._blas_ws.data.ptr, WORKSPACE_BYTES)
        self.mod = self.mods.get("engine")
        self.fn = {name: self.mod.get_function(name) for name in (
            "gemm_grouped_mma", "gemm_grouped_mma128", "gemm_grouped_simt", "gather_f16", "to_f16", "swiglu",
            "swiglu_span", "combine",
            "rms_norm", "rope", "kv_store", "norm_rope", "norm_rope_warp", "router_topk", "attn_qperm", "attn_softmax",
            "attn_operm", "gemv_f16", "gemv_f32", "to_f32", "pull_bytes", "sigmoid_gate", "add_f32", "add_bias_f32")}
        self.gemm_kind = gemm                                     # "mma" (tensor cores) or "simt"
        self.gemm_big_rows = BIG_BM if gemm == "mma" else 0       # rows_host.many_tile's larger tile
        GEMM64.prepare(self.fn["gemm_grouped_mma"])
        GEMM128.prepare(self.fn["gemm_grouped_mma128"])
        self.staging = _Staging(dev, STAGING_BYTES)
        # the side stream's tables (moe_block.py's blocks beside the compute stream) take a ring of their own: a
        # ring's device bytes are written again only behind the kernels that read them on the same stream
        self.side_staging = _Staging(dev, SIDE_STAGING_BYTES)
        self._dq_plans: dict = {}
        self._rfn, self._dfn = {}, {}                            # rows_kernels.cu's by type, decode_kernels.cu's
        self._qfn: dict = {}                                      # gemm_q_kernels.cu's by (type, 128-row tiles)
        self.gemm_q_types = dq.GEMM_Q_TYPES if gemm == "mma" else frozenset()
        self._route = None                                        # route_kernels.cu's, on first use
        self._init_attention()
        self._one = np.array(1.0, np.float32)
        self._zero = np.array(0.0, np.float32)

    @property
    def dq(self):
        """The dequantisation kernels' module (dequant.py)."""
        return self.mods.get("dequant")

    # --- tables -------------------------------------------------------------------------------------------------
    def upload(self, host, stream):
        """Into the device table ring at the staging offset. A later upload overwrites those device bytes only
        through a pull on the same stream, after the kernels that read them (all tables go on `stream`).

        A kernel pulls the bytes from the pinned staging ring (pull_bytes), not the copy engine: H2D copies of
        every stream share the copy engine in issue order, so a layer's tables waited behind the ring's prefetched
        experts (stop 21's embedding A/B: 2-4% of a stream-all prompt for layer 0's rows alone)."""
        host = np.ascontiguousarray(host)
        off = self._pull(host, stream)
        return self._st(stream).dbuf[off:off + host.nbytes].view(host.dtype).reshape(host.shape)

    def _st(self, stream) -> _Staging:
        """The staging ring of the stream whose kernels read the tables."""
        return self.side_staging if stream is self.dev.side else self.staging

    def _pull(self, host: np.ndarray, stream) -> int:
        """`upload`'s copy, by offsets alone: host (contiguous) lands at dbuf[off:], off returned. No CuPy view is
        made (each costs ~10 us of a host-bound prompt layer's time; layer_tables wants the address only)."""
        off = self._st(stream).put(host)
        self._send(off, host.nbytes, stream)
        return off

    def _room(self, nbytes: int, stream) -> tuple[int, np.ndarray]:
        """Room for up to `nbytes` in `stream`'s pinned staging ring, to be written in place: (offset, its bytes)."""
        st = self._st(stream)
        off = st.reserve(nbytes)
        return off, st.buf[off:off + nbytes]

    def _send(self, off: int, nbytes: int, stream) -> None:
        """The staging ring's bytes [off, off + nbytes), written, to the device twin: the pull kernel on `stream`."""
        st = self._st(stream)
        st.take(off, nbytes)
        n16 = -(-max(nbytes, 1) // 16)             # regions are 256-byte aligned and padded: whole uint4s
        self._pull_words(np.uint64(st.dbase + off), np.uint64(st.base + off), n16, stream)
        st.done(off, nbytes, stream)

    def _pull_words(self, dst, src, n16: int, stream) -> None:
        """The pull kernel's launch: n16 16-byte words from pinned host memory `src` to device memory `dst` (kernel
        arguments: addresses or arrays)."""
        self.fn["pull_bytes"]((min(-(-n16 // PULL_THREADS), PULL_BLOCKS),), (PULL_THREADS,),
                              (dst, src, np.int64(n16)), stream=stream.s)

    def pull(self, dst, src, stream):
        n = src.nbytes
        assert dst.nbytes == n and n % 16 == 0 and src.ctypes.data % 16 == 0 and dst.data.ptr % 16 == 0, \
            "pull: whole, aligned 16-byte words"
        self._pull_words(dst, np.uint64(src.ctypes.data), n // 16, stream)

    def copy(self, dst, src, stream):
        assert dst.shape == src.shape and dst.dtype == src.dtype and dst.flags.c_contiguous and src.flags.c_contiguous
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, rt.memcpyDeviceToDevice, stream.s.ptr)

    def upload_many(self, hosts, stream):
        hosts = [np.ascontiguousarray(h) for h in hosts]
        offs, total = [], 0
        for h in hosts:
            offs.append(total)
            total += -(-max(h.nbytes, 1) // 256) * 256
        packed = np.zeros(total, np.uint8)
        for h, o in zip(hosts, offs):
            packed[o:o + h.nbytes] = h.reshape(-1).view(np.uint8)
        dev = self.upload(packed, stream)
        return [dev[o:o + h.nbytes].view(h.dtype).reshape(h.shape) for h, o in zip(hosts, offs)]

    def layer_tables(self, groups, offs, cnt, starts, first, size, tiling, stream, riders=()):
        """As Kernels.layer_tables, in one pinned->device copy: [pointer tables, offset-major: offs[w] of every set's
        blobs | tiles (int32) | the riders (int32), each 16-byte aligned], packed by one compiled pass
        (rows_host.pack_layer: whole-array numpy cost 160-350 us a layer on the H200's host, a Python loop per group
        ~1 ms). The row tables ride in the same copy: a separate upload took ~75 us of a prompt layer's host time
        (bench/results/h200/host_breakdown_stop27.log). Riders: up to two (the host layout's slot and src, or the
        device layout's off)."""
        assert len(riders) <= 2 and all(r.dtype == np.int32 for r in riders), "up to two int32 riders"
        n_g = len(groups)
        ptr0 = np.fromiter((buf.data.ptr for buf, _ in groups), np.uint64, n_g)
        stride = np.fromiter((buf.strides[0] for buf, _ in groups), np.uint64, n_g)
        idx_all = np.concatenate([np.asarray(i, np.int64) for _, i in groups])
        ra, rb = (tuple(riders) + (_NO_RIDER, _NO_RIDER))[:2]
        W = len(offs)
        # packed straight into the staging ring's pinned bytes: a packed array of its own (~100 KB at 1,280 tokens,
        # with the row tables) cost an allocation and a second copy, ~35 us a layer (lines_q8_stop33.log)
        off, room = self._room(pack_bound(W, idx_all.size, int(starts[-1] + cnt[-1]) if cnt.size else 0,
                                          ra.size, rb.size), stream)
        used, at, lens, n_many, s_at, r_at = pack_layer(
            cnt, starts, first, size, idx_all, ptr0, stride, np.asarray(offs, np.uint64), *tiling, ra, rb, room)
        self._send(off, used, stream)
        dev = self._st(stream).dbase + off
        # per set: (W pointer tables, tiles table) as (address, length) tuples, then its tile count
        tabs = [tuple(zip(a, (n,) * W + (nt,))) + (nt,) for a, (n, nt) in zip((at + np.uint64(dev)).tolist(),
                                                                              lens.tolist())]
        return tabs, n_many.tolist(), [(dev + s_at, ra.size), (dev + r_at, rb.size)][:len(riders)]

    def _as_array(self, tab: tuple, dtype):
        """A CuPy view of a packed table (the checked first launch of a shape wants an array)."""
        mem = self.cp.cuda.UnownedMemory(int(tab[0]), max(tab[1], 1) * np.dtype(dtype).itemsize, self)
        return self.cp.ndarray((tab[1],), dtype, self.cp.cuda.MemoryPointer(mem, 0))

    def blob_table(self, refs: list[BlobRef], byte_off: int) -> np.ndarray:
        return np.asarray([r.buf.data.ptr + r.index * r.buf.strides[0] + byte_off for r in refs], np.uint64)

    # --- the row layout from the device's routing ---------------------------------------------------------------
    def _route_fn(self, name):
        if self._route is None:
            src = dq.source("route_kernels.cu")
            assert re.search(r"^#define RT_TILE (\d+)", src, re.M).group(1) == str(ROUTE_TILE), "kernels.ROUTE_TILE"
            mod = self.mods.get("route")
            self._route = {n: mod.get_function(n) for n in ("route_hist", "route_rows", "plan_groups")}
        return self._route[name]

    def route_hist(self, hist, ids, P, stream):
        E = hist.shape[1]
        assert hist.dtype == ids.dtype == np.int32 and hist.flags.c_contiguous and ids.flags.c_contiguous
        assert hist.shape[0] * ROUTE_TILE >= P and ids.size >= P
        if P:
            self._route_fn("route_hist")((-(-P // ROUTE_TILE),), (ROUTE_TILE,), (hist, ids, np.int32(P), np.int32(E)),
                                         stream=stream.s, shared_mem=E * 4)

    def route_rows(self, slot, src, ids, off, hist, P, K, stream):
        E = hist.shape[1]
        assert slot.dtype == src.dtype == ids.dtype == hist.dtype == np.int32 and slot.size >= P and src.size >= P
        assert slot.flags.c_contiguous and src.flags.c_contiguous and ids.flags.c_contiguous
        if P:
            self._route_fn("route_rows")((-(-P // ROUTE_TILE),), (ROUTE_TILE,),
                                         (slot, src, ids, _tab_ptr(off), hist, np.int32(P), np.int32(E), np.int32(K)),
                                         stream=stream.s, shared_mem=(ROUTE_TILE // 32 + 1) * E * 4)

    def dequant_matrix(self, out, raw, qtype, stream):
        N, K = out.shape
        dq.launch_matrix(self.dq, qtype, raw, N, K, out, stream.s)

    def gather_f16(self, out, x, src, stream):
        R, D = out.shape
        assert out.dtype == np.float16 and x.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous
        if R:
            self.fn["gather_f16"]((R,), (256,), (out, x, _tab_ptr(src), np.int32(R), np.int32(D)), stream=stream.s)

    def swiglu(self, out, gu, f, stream):
        R = out.shape[0]
        assert out.dtype == np.float16 and gu.dtype == np.float32 and gu.strides[1] == 4
        if R:
            self.fn["swiglu"]((R,), (256,), (out, gu, np.int32(R), np.int32(f), np.int32(gu.strides[0] // 4)),
                              stream=stream.s)

    def combine(self, out, dm, slot, w, stream):
        T, D = out.shape
        K = w.shape[1]
        w = self.cp.ascontiguousarray(w)
        # a block per (token, 256 columns): one token's combine (decode) was one block's serial loads (15.6 us a
        # layer on the H200, decode_profile_f8_stop20.log); each column's sum is the same k-order sum
        self.fn["combine"]((T, -(-D // 256)), (256,),
                           (out, dm, _tab_ptr(slot), w, np.int32(T), np.int32(K), np.int32(D)),
                           stream=stream.s)

    # --- dense --------------------------------------------------------------------------------------------------
    def rms_norm(self, out, x, w, eps, stream):
        n = x.shape[-1]
        rows = x.size // n
        assert x.flags.c_contiguous and out.flags.c_contiguous and w.size == n
        self.fn["rms_norm"]((rows,), (256,), (out, x, w, np.int32(n), np.float32(eps)), stream=stream.s)

    def _gemm_ex(self, stream, transa, transb, m, n, k, A, atype, lda, B, btype, ldb, C, ldc):
        self.blas.gemm_ex(self.handle, stream.s.ptr, transa, transb, m, n, k, self._one.ctypes.data, A, atype, lda,
                          B, btype, ldb, self._zero.ctypes.data, C, R_32F, ldc, COMPUTE_32F, GEMM_DEFAULT)

    def linear(self, out, x, w, stream, bias=None):
        """out [T, N] (row stride may exceed N) = x [T, K] · w [N, K]ᵀ: fp16 weights take fp16 inputs, fp32
        weights (router, shared-expert gate) fp32 inputs."""
        T, K = x.shape
        N = w.shape[0]
        assert w.shape[1] == K and w.flags.c_contiguous and out.strides[1] == 4
        if T == 0:
            return
        if T <= GEMV_MAX_T and K % 2 == 0:          # decode: our GEMV beats cuBLAS's per-call cost
            if x.dtype == np.float16:
                x32 = self.cp.empty((T, K), np.float32)
                self.fn["to_f32"]((min(4096, -(-T * K // 256)),), (256,), (x32, self.cp.ascontiguousarray(x),
                                                                          np.int64(T * K)), stream=stream.s)
                x = x32
            assert x.strides[1] == 4
            name = "gemv_f16" if w.dtype == np.float16 else "gemv_f32"
            vec = K % 8 == 0 and (x.data.ptr | w.data.ptr) % 16 == 0 and (x.strides[0] // 4) % 4 == 0
            self.fn[name]((-(-N * 32 // 256),), (256,), (out, np.int32(out.strides[0] // 4), x,
                                                         np.int32(x.strides[0] // 4), w, np.int32(N), np.int32(K),
                                                         np.int32(T), np.int32(vec)), stream=stream.s)
        elif w.dtype == np.float16:
            xh = x if x.dtype == np.float16 and x.flags.c_contiguous else self._to_f16(x, stream)
            self._gemm_ex(stream, OP_T, OP_N, N, T, K, w.data.ptr, R_16F, K, xh.data.ptr, R_16F, K, out.data.ptr,
                          out.strides[0] // 4)
        else:
            assert x.dtype == np.float32 and x.strides[1] == 4
            self._gemm_ex(stream, OP_T, OP_N, N, T, K, w.data.ptr, R_32F, K, x.data.ptr, R_32F,
                          x.strides[0] // 4, out.data.ptr, out.strides[0] // 4)
        if bias is not None:
            with stream.s:
                out += bias

    def _to_f16(self, x, stream):
        """x f32 [T, K] (row stride may exceed K) rounded to a new fp16 [T, K]: a prompt GEMM's input."""
        T, K = x.shape
        xh = self.cp.empty((T, K), np.float16)
        self.fn["to_f16"]((min(4096, -(-T * K // 256)),), (256,),
                          (xh, x, np.int64(T * K), np.int32(K), np.int32(x.strides[0] // 4)), stream=stream.s)
        return xh

    def linear_many(self, outs, x, ws, stream):
        if x.shape[0] > GEMV_MAX_T and x.dtype == np.float32 and all(w.dtype == np.float16 for w in ws):
            x = self._to_f16(x, stream)                     # linear's own conversion, made once (the same bits)
        for o, w in zip(outs, ws):
            self.linear(o, x, w, stream)

    def rope(self, x, cos, sin, pos, n_rot, neox, stream):
        T, H, hd = x.shape
        assert x.flags.c_contiguous and x.dtype == np.float32
        n = T * H * (n_rot // 2)
        self.fn["rope"]((min(4096, -(-n // 256)),), (256,), (x, cos, sin, pos, np.int32(T), np.int32(H),
                                                            np.int32(hd), np.int32(n_rot), np.int32(bool(neox))),
                        stream=stream.s)

    def norm_rope(self, qo, ko, q, k, wq, wk, eps, cos, sin, pos, n_rot, neox, stream):
        T, H, hd = q.shape
        Hkv = k.shape[1]
        assert all(a.flags.c_contiguous and a.dtype == np.float32 for a in (qo, ko, q, k, wq, wk))
        assert qo.shape == q.shape and ko.shape == k.shape and k.shape[0] == T and wq.size == wk.size == hd
        n = T * (H + Hkv)
        if n < NR_MANY:      # a block a head, 256 threads as rms_norm's: its block_sum, so the same sum of squares
            self.fn["norm_rope"]((n,), (256,), (qo, ko, q, k, wq, wk, np.float32(eps), cos, sin, pos, np.int32(H),
                                                np.int32(Hkv), np.int32(hd), np.int32(n_rot), np.int32(bool(neox))),
                                 stream=stream.s, shared_mem=hd * 4)
            return
        # a warp a head, 8 a block: that block_sum replayed in a warp (the same bits)
        self.fn["norm_rope_warp"]((-(-n // NR_WARPS),), (32 * NR_WARPS,),
                                  (qo, ko, q, k, wq, wk, np.float32(eps), cos, sin, pos, np.int32(T), np.int32(H),
                                   np.int32(Hkv), np.int32(hd), np.int32(n_rot), np.int32(bool(neox))),
                                  stream=stream.s, shared_mem=NR_WARPS * hd * 4)

    def kv_store(self, kc, vc, k, v, pos0, stream):
        n = k.size
        assert k.flags.c_contiguous and v.flags.c_contiguous
        off = pos0 * kc.shape[1] * kc.shape[2]
        self.fn["kv_store"]((min(4096, -(-n // 256)),), (256,), (kc, vc, k, v, np.int64(off), np.int64(n)),
                            stream=stream.s)

    def router(self, ids, w, logits, k, renorm, stream):
        T, E = logits.shape
        assert logits.flags.c_contiguous and ids.flags.c_contiguous and w.flags.c_contiguous
        if T:
            self.fn["router_topk"]((T,), (256,), (ids, w, logits, np.int32(E), np.int32(k), np.int32(renorm)),
                                   stream=stream.s, shared_mem=E * 4)

    def add(self, out, a, b, stream):
        assert out.dtype == a.dtype == b.dtype == np.float32 and out.shape == a.shape == b.shape
        assert out.flags.c_contiguous and a.flags.c_contiguous and b.flags.c_contiguous
        n = out.size
        if n:
            self.fn["add_f32"]((min(4096, -(-n // 256)),), (256,), (out, a, b, np.int64(n)), stream=stream.s)

    def add_bias(self, out, y, b, stream):
        N = b.size
        assert out.dtype == y.dtype == b.dtype == np.float32 and out.shape == y.shape and y.shape[-1] == N
        assert out.flags.c_contiguous and y.flags.c_contiguous and b.flags.c_contiguous
        n = out.size
        if n:
            self.fn["add_bias_f32"]((min(4096, -(-n // 256)),), (256,), (out, y, b, np.int64(n), np.int32(N)),
                                    stream=stream.s)

    def sigmoid_gate(self, out, s, g, stream):
        T, D = out.shape
        assert out.flags.c_contiguous and s.flags.c_contiguous and g.flags.c_contiguous and g.size == T
        n = T * D
        if n:
            self.fn["sigmoid_gate"]((min(4096, -(-n // 256)),), (256,), (out, s, g, np.int64(n), np.int32(D)),
                                    stream=stream.s)
