"""Dense weights on the device and the ops the model files call on the GPU path.

`DeviceOps` implements the backend-ops contract of `strata/models/common.py` (as `RefOps` does), except
`experts`, which the engine hands to its MoE block. Weights: matrices fp16 [N, K] dequantised exactly then
rounded (the GPU path's own arithmetic, held to the reference by tolerance), norms/biases/router fp32.
The token embedding stays in host RAM: only the chunk's rows are dequantised and uploaded.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from strata import quants
from strata.accel.arena import PROGRESS_BYTES
from strata.accel.deferred import Lazy
from strata.accel.gpu.dequant import F32_EXACT, SUFFIX
from strata.mathfn import rope_table
from strata.models import Model, common
from strata.reference.linalg import weight_rows

# the block-quantised types the device dequantises (a float matrix goes up as its fp16: no transient larger than it)
DEVICE_TYPES = frozenset(q for q in SUFFIX if quants.get(q).block_size > 1)


def _is_f32(name: str) -> bool:
    return name.endswith(".bias") or "norm" in name or name.endswith("ffn_gate_inp.weight") \
        or name.endswith("ffn_gate_inp_shexp.weight")


def dense_names(model: Model) -> list[str]:
    """Every tensor the device holds: all but the routed experts and the (host-side) token embedding."""
    out = []
    for name in sorted(model.tensors.names):
        if name.endswith(("_exps.weight",)) or name == "token_embd.weight":
            continue
        out.append(name)
    if model.cfg.tied_output:
        out.append("token_embd.weight")     # the head reuses it: the device needs a copy
    return out


def dense_bytes(model: Model) -> int:
    n = 0
    for name in dense_names(model):
        t = model.tensors.info(name)
        n += t.n_elements * (4 if _is_f32(name) else 2)
    return n


QKV = ("attn_q.weight", "attn_k.weight", "attn_v.weight")


class DenseWeights:
    """The dense tensors on the device by name. A layer's q, k and v matrices are rows of one [Nq+Nk+Nv, D] matrix
    (`qkv[q's name]`: the matrix and each part's name and row range), so one GEMV makes a token's q|k|v: the
    decode graph ran three, two of them for the few rows of k and v (DeviceOps.linear)."""

    def __init__(self, model: Model, dev, log=None, on_device: bool = True):
        """on_device: a quantised matrix goes up as its GGUF bytes and the device dequantises it (Kernels.
        dequant_matrix, the same fp16 bits as strata.quants' float32 rounded on the host): numpy's dequantisation
        took the 48-layer qwen3-30b-a3b's 2,370 MiB 15.7 s of a 27.9 s load (generate_q48_stop45.log). Off, and
        for the fp32 tensors (norms, biases, routers), the host dequantises."""
        self.w: dict[str, object] = {}
        self.qkv: dict[str, tuple[object, list[tuple[str, int, int]]]] = {}
        t0 = time.monotonic()
        names = dense_names(model)
        show = log is not None and dense_bytes(model) > PROGRESS_BYTES
        held: dict[str, dict[str, object]] = {}                          # layer prefix -> q/k/v device matrices
        s = dev.compute
        with dev.on(s):               # every allocation on the compute stream, as the kernels: freed raw bytes
            for i, name in enumerate(names):                             # are reused in stream order
                t = model.tensors.info(name)
                shape = t.shape
                rows = shape[0] if len(shape) > 1 else 1
                k = shape[-1]
                view = model.view(name).reshape(rows, -1)
                if on_device and not _is_f32(name) and len(shape) == 2 and t.qtype in DEVICE_TYPES:
                    raw = dev.asarray(np.ascontiguousarray(view).view(np.uint8).reshape(-1))
                    arr = dev.empty((rows, k), np.float16)              # [N, K]
                    dev.k.dequant_matrix(arr, raw, t.qtype, s)
                    del raw
                else:
                    full = weight_rows(view, t.qtype, 0, rows, k).reshape(shape)
                    arr = dev.asarray(full.astype(np.float32 if _is_f32(name) else np.float16))
                leaf = name.split(".", 2)[2] if name.startswith("blk.") else ""
                if leaf in QKV and len(shape) == 2:
                    got = held.setdefault(name[:-len(leaf)], {})
                    got[leaf] = arr
                    if len(got) == 3:
                        self._put_qkv(dev, name[:-len(leaf)], [got.pop(x) for x in QKV])
                else:
                    self.w[name] = arr
                if show and (i % 16 == 0 or i == len(names) - 1):
                    print(f"\rweights: {i + 1} of {len(names)} dense tensors on {dev.name}", end="", file=sys.stderr,
                          flush=True)
            for p, got in held.items():              # a layer without all three: each on its own
                for leaf, arr in got.items():
                    self.w[p + leaf] = arr
            s.synchronize()
        if show:
            print(file=sys.stderr)
        if log:
            log(f"weights: {dense_bytes(model) / 2**20:,.0f} MiB dense on {dev.name} in {time.monotonic() - t0:.1f} s")

    def _put_qkv(self, dev, p: str, mats: list) -> None:
        if len({(m.shape[1], m.dtype) for m in mats}) > 1:
            for leaf, m in zip(QKV, mats):
                self.w[p + leaf] = m
            return
        cat = dev.empty((sum(m.shape[0] for m in mats), mats[0].shape[1]), mats[0].dtype)    # [Nq+Nk+Nv, D]
        parts, r = [], 0
        for leaf, m in zip(QKV, mats):
            dev.k.copy(cat[r:r + m.shape[0]], m, dev.compute)
            self.w[p + leaf] = cat[r:r + m.shape[0]]                       # a contiguous row range
            parts.append((p + leaf, r, r + m.shape[0]))
            r += m.shape[0]
        self.qkv[p + QKV[0]] = (cat, parts)

    def __getitem__(self, name: str):
        return self.w[name]


class DeviceOps:
    """The backend ops for one step on a device; `begin` binds the step's buffers, position and token count.
    CuPy arithmetic (a non-contiguous `add` or bias) runs on the compute stream (the engine holds
    `dev.on(compute)`).
    """

    # ops done as array arithmetic (CuPy/numpy operators), not kernel calls: the host twin cannot record them in a
    # captured segment, so prompt_graph.py captures no segment that does any
    arith = 0

    def __init__(self, model: Model, dev, weights: DenseWeights, kv, n_ctx: int, cap: int):
        self.model, self.cfg, self.dev, self.k, self.wt, self.kv = model, model.cfg, dev, dev.k, weights, kv
        cos, sin = rope_table(n_ctx, self.cfg.n_rot, self.cfg.rope_base)
        self.cos, self.sin = dev.asarray(cos), dev.asarray(sin)
        self.embd_view = model.view("token_embd.weight")
        self.embd_type = model.qtype("token_embd.weight")
        # the chunk's embedding rows as stored, staged here (pinned, so the upload is asynchronous) and dequantised
        # on the device: on the host, a 4,608-token chunk's rows took ~80 ms of a flash-shape 8K prompt while the
        # GPU waited (bench/results/h200/prefill_timeline_stop18.log). Types the device cannot give exactly stage f32.
        self.embd_on_device = dev.kind != "cuda" or self.embd_type in F32_EXACT
        self.embd_row = self.embd_view.shape[1] * self.embd_view.itemsize                # bytes of a stored row
        self.embd_host = dev.pinned(cap * max(self.embd_row, self.cfg.n_embd * 4) + 16)  # u8, rows or f32 [T, D]
        self.embd_done = dev.event(timing=False)
        self.bufs, self.pos0, self.T = None, 0, 0
        self.fuse_qkv = True         # one token's q|k|v in one GEMV, a prompt's from one fp16 x (DenseWeights.qkv);
                                     # off: three linears, the same bits
        self.fuse_norm_rope = True   # qk_norm_rope in one kernel; off: rms_norm and rope twice each, the same bits
        self._stash: dict = {}       # name -> (its input x, its output): k and v of the fused GEMV, for their calls
        self.moe = None              # the engine's MoE block: moe(h, layer, ids, w) -> [T, D]
        # one query's attention scratch (attn_decode: scores and key parts), for the decode graph and one-token steps
        c = self.cfg
        self.dscores = dev.empty((c.n_head, self.k.attn_decode_cols(n_ctx, c.head_dim)), np.float32)

    def begin(self, bufs, pos0: int, T: int, pos_dev=None):
        """Bind a step: its buffers, first position and rows; `pos_dev` [T] int32 holds the rows' positions where
        given (prompt_graph.py's, at a fixed address), else they are uploaded here."""
        self.bufs, self.pos0, self.T = bufs, pos0, T
        self.pos_dev = pos_dev if pos_dev is not None else \
            self.k.upload(np.arange(pos0, pos0 + T, dtype=np.int32), self.dev.compute)

    # --- the contract ----------------------------------------------------------------------------------------
    def embed(self, name: str, ids, out=None):
        """The rows of `ids` into `out` [T, D] (default: the step buffers' x)."""
        T = len(ids)
        self.embd_done.synchronize()            # the previous step's upload has left the staging buffer
        idx = np.asarray(ids, np.int64)
        x = self.bufs.x[:T] if out is None else out
        if self.embd_on_device:
            v = self.embd_view                                                   # [V, row bytes] (or typed [V, D])
            stage = self.embd_host[:T * self.embd_row]
            np.take(v, idx, axis=0, out=stage.view(v.dtype).reshape(T, v.shape[1]))   # the rows as stored
            n = -(-stage.size // 16) * 16
            raw = self.dev.empty((n,), np.uint8)                                # a step temporary (temp_bytes)
            # pulled by a kernel, not copied: the copy engine takes H2D copies in issue order, so rows behind a
            # prompt's first expert copies would wait for them (the engine issues those first: GpuEngine._step)
            self.k.pull(raw, self.embd_host[:n], self.dev.compute)
            self.k.embed_rows(x, raw[:stage.size], self.embd_type, self.dev.compute)   # exact f32, as weight_rows
        else:
            stage = self.embd_host[:T * self.cfg.n_embd * 4].view(np.float32).reshape(T, self.cfg.n_embd)
            stage[...] = weight_rows(self.embd_view[idx], self.embd_type, 0, T, self.cfg.n_embd)
            assert x.flags.c_contiguous and stage.nbytes % 16 == 0, "rows of whole 16-byte words"
            self.k.pull(x.reshape(-1).view(np.uint8), stage.reshape(-1).view(np.uint8), self.dev.compute)
        self.embd_done.record(self.dev.compute)
        return x

    def embed_row(self, token: int) -> np.ndarray:
        """One token's embedding as the decode graph pulls it: the stored row's bytes where the device dequantises
        it (embd_on_device), else its exact f32 [D] from the host (weight_rows, as `embed`)."""
        if self.embd_on_device:
            return self.embd_view[token].view(np.uint8).reshape(-1)
        return weight_rows(self.embd_view[token:token + 1], self.embd_type, 0, 1, self.cfg.n_embd).reshape(-1)

    def rms_norm(self, x, name: str, eps: float):
        out = self.dev.empty(x.shape, np.float32)
        self.k.rms_norm(out, x, self.wt[name], eps, self.dev.compute)
        return out

    def linear(self, x, name: str):
        hit = self._stash.pop(name, None)
        if hit is not None and hit[0] is x:
            return hit[1]
        fused = self.wt.qkv.get(name) if self.fuse_qkv else None
        if fused is not None and x.shape[0] > 1:     # a prompt's attn_q: q, k and v from one fp16 copy of x, k and
            cat, parts = fused                       # v kept for their calls (two conversions a layer fewer)
            outs = [self.dev.empty((x.shape[0], hi - lo), np.float32) for _, lo, hi in parts]
            self.k.linear_many(outs, x, [self.wt[n] for n, _, _ in parts], self.dev.compute)   # cat's row views
            self._stash = {n: (x, o) for (n, _, _), o in zip(parts[1:], outs[1:])}
            return outs[0]
        if fused is not None:        # attn_q of one token: q, k and v in one GEMV, k and v kept for the next calls
            cat, parts = fused
            out = self.dev.empty((cat.shape[0],), np.float32)             # [Nq+Nk+Nv]: each row's own dot product,
            self.k.linear(out.reshape(1, -1), x, cat, self.dev.compute)   # as in three GEMVs (the same bits)
            views = [out[lo:hi].reshape(1, hi - lo) for _, lo, hi in parts]
            self._stash = {n: (x, v) for (n, _, _), v in zip(parts[1:], views[1:])}
            return views[0]
        w = self.wt[name]
        out = self.dev.empty((x.shape[0], w.shape[0]), np.float32)
        self.k.linear(out, x, w, self.dev.compute)
        return out

    def add(self, x, y):
        if isinstance(x, Lazy) or isinstance(y, Lazy):     # a deferred MoE block's output: the add waits with it
            return (x if isinstance(x, Lazy) else y).block.then(self.add, x, y)
        if not (x.flags.c_contiguous and y.flags.c_contiguous and x.shape == y.shape):
            self.arith += 1
            return x + y
        out = self.dev.empty(x.shape, np.float32)           # new: y may be a buffer its producer writes again
        self.k.add(out, x, y, self.dev.compute)
        return out

    def add_bias(self, y, name: str):
        b = self.wt[name]
        if not y.flags.c_contiguous:
            self.arith += 1
            return y + b
        out = self.dev.empty(y.shape, np.float32)
        self.k.add_bias(out, y, b, self.dev.compute)
        return out

    def rope(self, x, pos, cfg):
        self.k.rope(x, self.cos, self.sin, self.pos_dev, cfg.n_rot, cfg.rope_neox, self.dev.compute)
        return x

    def qk_norm_rope(self, q, k, qn: str, kn: str, eps: float, pos, cfg):
        if not self.fuse_norm_rope:
            return common.norm_then_rope(self, q, k, qn, kn, eps, pos, cfg)
        qo, ko = self.dev.empty(q.shape, np.float32), self.dev.empty(k.shape, np.float32)
        self.k.norm_rope(qo, ko, q, k, self.wt[qn], self.wt[kn], eps, self.cos, self.sin, self.pos_dev, cfg.n_rot,
                         cfg.rope_neox, self.dev.compute)
        return qo, ko

    def attention(self, layer: int, q, k, v, pos):
        kc, vc = self.kv[layer]
        s = self.dev.compute
        self.k.kv_store(kc, vc, k, v, self.pos0, s)
        out = self.dev.empty((q.shape[0], q.shape[1] * q.shape[2]), np.float32)
        if q.shape[0] == 1 and self.k.attn_decode_takes(q.shape[2]):
            # one query (a per-layer decode step): the decode graph's kernel, split over the keys, where the prompt
            # kernel's few blocks walk them in series (bench/results/h200/decode_layer_attn_ab_*_stop28.log)
            self.k.attn_decode(out, q, kc, vc, self.pos_dev, self.dscores, s)
        else:
            self.k.attention(out, q, kc, vc, self.pos0, self.bufs.attn_scratch, s)
        return out

    def ffn(self, h, gate: str, up: str, down: str):
        """The shared expert (qwen2moe): down(silu(gate·h) · (up·h)), fp16 intermediate as the experts'."""
        T, Fs, s = h.shape[0], self.cfg.n_ff_shexp, self.dev.compute
        gu = self.dev.empty((T, 2 * Fs), np.float32)
        self.k.linear(gu[:, :Fs], h, self.wt[gate], s)
        self.k.linear(gu[:, Fs:], h, self.wt[up], s)
        hh = self.dev.empty((T, Fs), np.float16)
        self.k.swiglu(hh, gu, Fs, s)
        out = self.dev.empty((T, self.cfg.n_embd), np.float32)
        self.k.linear(out, hh, self.wt[down], s)
        return out

    def sigmoid_gate(self, sx, h, name: str):
        g = self.dev.empty((h.shape[0], 1), np.float32)
        self.k.linear(g, h, self.wt[name].reshape(1, -1), self.dev.compute)
        out = self.dev.empty(sx.shape, np.float32)
        self.k.sigmoid_gate(out, sx, g, self.dev.compute)
        return out

    # --- routing: the router kernel fuses softmax and top-k, so `router_probs` hands on the logits --------------
    def router_probs(self, h, name: str):
        logits = self.dev.empty((h.shape[0], self.cfg.n_expert), np.float32)
        self.k.linear(logits, h, self.wt[name], self.dev.compute)          # fp32 router weights
        return _RouterLogits(logits)

    def topk(self, probs: "_RouterLogits", k: int, renorm: bool = False):
        T = probs.logits.shape[0]
        ids, w = self.bufs.ids[:T], self.bufs.w[:T]
        self.k.router(ids, w, probs.logits, k, renorm, self.dev.compute)   # softmax over E, top-k, renorm
        return ids, w

    def experts(self, h, layer: int, ids, w):
        return self.moe(h, layer, ids, w)


class _RouterLogits:
    """What `router_probs` returns on the device: the logits; the top-k kernel takes the softmax itself."""

    def __init__(self, logits):
        self.logits = logits
