"""Single-token decode as one captured graph (SPEC §8; the accel GPU issue's "CUDA graphs where they pay").

The per-layer path (`GpuEngine.moe`) stops the host at every layer's routing sync and launches some thirty small
kernels per layer from Python: on the H200 a flash-shape layer took ~2 ms of host time against ~0.1 ms of GPU
work (cProfile, stop 12). Here the routing never leaves the device. Each layer's experts are computed straight
from their quantised blobs by `moe_gemv`: from the VRAM cache where resident, else from the pinned arena, which
the GPU reads over PCIe (SPEC §8's misses "read by the GPU over PCIe", the whole fraction; no copy, no ring, no
host). So one token's step, every layer and the head, is captured once and replayed per token. The host's work
per token: the token's embedding row, the position and (when it changed) the residency table written into one
pinned block, and one launch; the step pulls that block first and downloads its logits and routing last.

Everything that varies between tokens lives in device memory the captured kernels read: the position (rope, the
KV row, the keys attended), each layer's routed ids, and the residency table (`slot_of`). A cached and an arena
blob go through the same kernel, so residency never changes the bits.
Legend: L layers, K top-k, P = K (token, k) pairs of the one token, D hidden, F expert FFN, E experts, V vocab.
"""

from __future__ import annotations

import numpy as np

from strata.accel.dense import DeviceOps
from strata.accel.gpu.kernels import ExpertSource
from strata.accel.moe import blob_offsets
from strata.models.common import head


class GraphOps(DeviceOps):
    """DeviceOps for the captured step: the position from device memory, per-layer routing buffers, the experts of
    `DecodeGraph.moe`. Shares the engine's weights, KV cache and rope tables."""

    def __init__(self, base: DeviceOps, graph: "DecodeGraph"):        # no DeviceOps.__init__: nothing new to load
        self.model, self.cfg, self.dev, self.k, self.wt, self.kv = base.model, base.cfg, base.dev, base.k, base.wt, \
            base.kv
        self.cos, self.sin, self.moe = base.cos, base.sin, graph.moe
        self.pos_dev, self.graph, self.layer = graph.pos_dev, graph, 0
        self.fuse_qkv, self.fuse_norm_rope, self._stash = base.fuse_qkv, base.fuse_norm_rope, {}

    def attention(self, layer: int, q, k, v, pos):
        kc, vc = self.kv[layer]
        s = self.dev.compute
        self.k.kv_store_at(kc, vc, k, v, self.pos_dev, s)
        out = self.dev.empty((1, q.shape[1] * q.shape[2]), np.float32)                   # [1, H·hd]
        self.k.attn_decode(out, q, kc, vc, self.pos_dev, self.graph.scores, s)
        return out

    def topk(self, probs, k: int, renorm: bool = False):
        ids, w = self.graph.ids[self.layer], self.graph.w[self.layer]                      # [1, K] each
        self.k.router(ids, w, probs.logits, k, renorm, self.dev.compute)
        return ids, w


class DecodeGraph:
    def __init__(self, model, dev, ops: DeviceOps, bufs, cache, arena, n_ctx: int):
        c = self.cfg = model.cfg
        self.model, self.dev, self.base, self.bufs, self.cache, self.arena = model, dev, ops, bufs, cache, arena
        L, E, K = c.n_layer, c.n_expert, c.n_expert_used
        # what a token's step reads from the host, in one pinned block the step's first kernel pulls (Kernels.pull):
        # [position | residency table | the token's embedding row], each 16-byte aligned. Issuing those uploads from
        # the host before each launch (a copy each, and the embedding's copy and kernel) held the GPU ~0.12 ms a
        # token on the H200 (bench/results/h200/dwall_q8_stop36.log)
        self.row_bytes = ops.embd_row if ops.embd_on_device else c.n_embd * 4
        a16 = lambda n: -(-n // 16) * 16
        t0, r0 = 16, 16 + a16(L * E * 4)
        self.step_host = dev.pinned(r0 + a16(self.row_bytes))
        self.step_dev = dev.zeros((self.step_host.nbytes,), np.uint8)
        self.pos_host = self.step_host[:4].view(np.int32)
        self.table_host = self.step_host[t0:t0 + L * E * 4].view(np.int32).reshape(L, E)
        self.row_host = self.step_host[r0:r0 + self.row_bytes]
        self.pos_dev = self.step_dev[:4].view(np.int32)
        self.table = self.step_dev[t0:t0 + L * E * 4].view(np.int32).reshape(L, E)   # the device's slot_of
        self.row_dev = self.step_dev[r0:r0 + self.row_bytes]
        self.ids_host = dev.pinned(L * K * 4).view(np.int32).reshape(L, 1, K)
        self.logits_host = dev.pinned(c.n_vocab * 4).view(np.float32).reshape(1, c.n_vocab)
        self.ids, self.w = dev.zeros((L, 1, K), np.int32), dev.zeros((L, 1, K), np.float32)
        self.pair = dev.asarray(np.arange(K, dtype=np.int32).reshape(1, K))      # combine: (t=0, k) -> Dm row k
        self.scores = ops.dscores                                                  # attention scratch [H, S+]
        self.srcs = [ExpertSource(cache.buf, self.table[l], arena.layers[l]) for l in range(L)]
        self.offsets = [blob_offsets(c, t) for t in arena.types]                 # [gate | up | down] bytes
        self.ops = GraphOps(ops, self)
        self.version = -1                # the cache version the device table mirrors
        self.resident = None             # [L, E] bool: residency as the last step ran
        self.graph = None
        self.logits = None               # the captured step's output [1, V] (device)
        self.done = dev.event(timing=False)
        self.fuse_glu = True             # the down GEMV computes SwiGLU as it stages its rows; off: a swiglu launch

    def launch(self, token: int, pos: int) -> None:
        """Enqueue one token's step (returns at once; `wait` collects it). The last step has finished (`wait`), so
        nothing reads the pinned step block while the host writes it."""
        dev, s = self.dev, self.dev.compute
        if self.cache.version != self.version:
            self.table_host[...] = self.cache.slot_of
            self.version = self.cache.version
            self.resident = self.table_host >= 0
        self.pos_host[0] = pos
        self.row_host[...] = self.base.embed_row(token).view(np.uint8)          # the stored row, or its f32
        if self.graph is None:
            self.base.bufs = self.bufs
            with dev.on(s):
                self.graph = dev.capture(self._body)
        self.graph.launch()
        self.done.record(s)

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        """The launched step's (logits [1, V], routed ids [L, 1, K]), both host copies."""
        self.done.synchronize()
        return self.logits_host.copy(), self.ids_host.copy()

    def _body(self):
        dev, k, s = self.dev, self.dev.k, self.dev.compute
        k.pull(self.step_dev, self.step_host, s)                  # position, residency, the token's row
        if self.base.embd_on_device:
            x = self.bufs.x[:1]                                                       # [1, D]
            k.embed_rows(x, self.row_dev, self.base.embd_type, s)                   # exact f32, as weight_rows
        else:
            x = self.row_dev.view(np.float32).reshape(1, self.cfg.n_embd)            # the host's f32 row
        for layer in range(self.cfg.n_layer):
            self.ops.layer = layer
            x = self.model.forward_block(self.ops, x, layer, None)                  # [1, D]
        self.logits = head(self.ops, self.cfg, x)                                     # [1, V]
        dev.d2h(self.logits_host, self.logits, s)       # the step's products leave inside it: no host call either
        dev.d2h(self.ids_host, self.ids, s)

    def moe(self, h, layer: int, ids, w):
        """h [1, D] -> Σ_k w_k · expert_{ids_k}(h): gate|up, SwiGLU, down, combine; nothing leaves the device."""
        c, dev, k, s = self.cfg, self.dev, self.dev.k, self.dev.compute
        D, F, K = c.n_embd, c.n_ff_exp, c.n_expert_used
        tg, tu, td = self.arena.types[layer]
        _, up, down = self.offsets[layer]
        src, pid = self.srcs[layer], ids.reshape(-1)                                  # pid [P]
        gu = dev.empty((K, 2 * F), np.float32)                                        # [P, 2F]
        if tg == tu:                          # [gate rows | up rows] is one [2F, D] matrix of one type
            k.moe_gemv(gu, h, K, pid, src, 0, tg, 2 * F, D, s)
        else:
            k.moe_gemv(gu[:, :F], h, K, pid, src, 0, tg, F, D, s)
            k.moe_gemv(gu[:, F:], h, K, pid, src, up, tu, F, D, s)
        dm = dev.empty((K, D), np.float32)                                            # [P, D]
        if self.fuse_glu:                     # silu(G)·U rounded to fp16 as the down GEMV stages its input rows
            k.moe_gemv(dm, gu, 1, pid, src, down, td, D, F, s, glu=True)
        else:
            hh = dev.empty((K, F), np.float16)                                        # [P, F]
            k.swiglu(hh, gu, F, s)
            k.moe_gemv(dm, hh, 1, pid, src, down, td, D, F, s)
        out = dev.empty((1, D), np.float32)
        k.combine(out, dm, self.pair, w, s)                                           # Σ_k w·Dm[k], k order
        return out
