"""The accel CPU backend's ops and engine: RefOps' method set on the q8 path with the Numba kernels and the pool,
bit-identical to `RefOps(path=Q8)` / `RefEngine(path="q8")` (docs/NUMERICS.md).

Matmuls, attention heads and experts run on the ExpertPool; RMSNorm and softmax run in Numba on the calling
thread; embedding rows, RoPE, top-k and the k-ordered combine stay the reference's numpy code (reused, not
copied). Legend: T tokens, D hidden, E experts, K top-k, F expert FFN, S cached positions, hd head size.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from strata.accel.cpu import dense
from strata.accel.cpu.kernels import as_bytes
from strata.accel.cpu.pool import AttentionJob, ExpertJob, ExpertPool, LinearJob
from strata.accel.cpu.rows import MAXT
from strata.mathfn import sigmoid32
from strata.models import Model
from strata.models.base import MoEConfig
from strata.reference.engine import RefEngine
from strata.reference.ops import RefOps


class CpuKV:
    """Per layer K (transposed, [Hkv, hd, C]) and V ([Hkv, C, hd]) after RoPE, float32: the attention kernel
    vectorises over positions for scores and over hd for the weighted sum."""

    def __init__(self, cfg: MoEConfig, n_ctx: int):
        self.n_ctx = n_ctx
        self.kt = [np.zeros((cfg.n_head_kv, cfg.head_dim, n_ctx), np.float32) for _ in range(cfg.n_layer)]
        self.v = [np.zeros((cfg.n_head_kv, n_ctx, cfg.head_dim), np.float32) for _ in range(cfg.n_layer)]


class CpuOps(RefOps):
    def __init__(self, model: Model, kv: CpuKV, pool: ExpertPool,
                 on_routing: Callable[[int, np.ndarray], None] | None = None):
        from strata.reference.linalg import Path

        super().__init__(model, Path.Q8, None, kv, on_routing)
        self.pool = pool
        self._wcache: dict[str, tuple[np.ndarray, int]] = {}

    def _wb(self, name: str) -> tuple[np.ndarray, int]:
        """A weight's rows as uint8 [N, row_bytes] and its type (views of the mapped file, cached)."""
        if name not in self._wcache:
            view = self.model.view(name)
            self._wcache[name] = (as_bytes(view.reshape(view.shape[0], -1) if view.ndim > 1 else view.reshape(1, -1)),
                                  self.model.qtype(name))
        return self._wcache[name]

    # --- dense -------------------------------------------------------------------------------------------------
    def rms_norm(self, x: np.ndarray, name: str, eps: float) -> np.ndarray:
        w = np.ascontiguousarray(self.model.view(name), np.float32).reshape(-1)
        x2 = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
        out = np.empty_like(x2)
        dense.rms_norm_rows(x2, w, float(eps), out)
        return out.reshape(x.shape)

    def _linear(self, x: np.ndarray, w: np.ndarray, qtype: int) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty((x.shape[0], w.shape[0]), np.float32)
        self.pool.run([LinearJob(w, qtype, x, out)])
        return out

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return self._linear(x, *self._wb(name))

    def attention(self, layer: int, q, k, v, pos: np.ndarray) -> np.ndarray:
        T = q.shape[0]
        kt, vc = self.kv.kt[layer], self.kv.v[layer]
        kt[:, :, pos] = np.transpose(k, (1, 2, 0))                       # [Hkv, hd, T]
        vc[:, pos, :] = np.transpose(v, (1, 0, 2))                       # [Hkv, T, hd]
        out = np.empty((T, q.shape[1] * q.shape[2]), np.float32)         # [T, H*hd]
        self.pool.run([AttentionJob(np.ascontiguousarray(q, np.float32), kt, vc, np.ascontiguousarray(pos, np.int64),
                                    int(pos[-1]) + 1, out)])
        return out

    def ffn(self, h: np.ndarray, gate: str, up: str, down: str) -> np.ndarray:
        (g, gt), (u, ut), (d, dt) = self._wb(gate), self._wb(up), self._wb(down)
        h = np.ascontiguousarray(h, np.float32)
        out = np.empty_like(h)
        D, F = h.shape[1], g.shape[0]
        self.pool.run([ExpertJob.from_parts(g, u, d, (gt, ut, dt), D, F, h[t0:t0 + MAXT], out[t0:t0 + MAXT])
                       for t0 in range(0, h.shape[0], MAXT)])
        return out

    def sigmoid_gate(self, s: np.ndarray, h: np.ndarray, name: str) -> np.ndarray:
        return s * sigmoid32(self.linear(h, name))                         # [T, D] · [T, 1]

    def router_probs(self, h: np.ndarray, name: str) -> np.ndarray:
        logits = self.linear(h, name)                                      # [T, E]
        p = np.empty(logits.shape, np.float64)
        dense.softmax_rows(logits, p)
        return p.astype(np.float32)

    # --- experts -----------------------------------------------------------------------------------------------
    def experts(self, h: np.ndarray, layer: int, ids: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Σ_k w[t,k]·expert_{ids[t,k]}(h[t]) (SPEC §3): one pool batch over every routed expert (in groups of
        MAXT tokens), unweighted rows in expert-major order (Dm), then the combine in k order in float32."""
        if self.on_routing:
            self.on_routing(layer, ids)
        T, K = ids.shape
        D, F = self.cfg.n_embd, self.cfg.n_ff_exp
        h = np.ascontiguousarray(h, np.float32)
        order = np.argsort(ids.reshape(-1), kind="stable")                 # [T*K] (t, k) pairs, expert-major
        xs = h[order // K]                                                 # [T*K, D] gathered inputs
        dm = np.empty((T * K, D), np.float32)                              # Dm: unweighted expert rows
        flat = ids.reshape(-1)[order]
        starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]])
        ends = np.r_[starts[1:], flat.size]
        jobs = []
        for a, b in zip(starts, ends):
            s = self.model.expert(layer, int(flat[a]))
            for c in range(a, b, MAXT):
                e = min(b, c + MAXT)
                jobs.append(ExpertJob.from_parts(s.gate, s.up, s.down, s.types, D, F, xs[c:e], dm[c:e]))
        self.pool.run(jobs)
        y = np.empty((T * K, D), np.float32)
        y[order] = dm
        y = y.reshape(T, K, D)                                             # [T, K, D]
        out = np.zeros((T, D), np.float32)
        for k in range(K):
            out = out + w[:, k, None] * y[:, k]
        return out


class CpuEngine(RefEngine):
    """RefEngine's loop (prefill, decode, generate) over CpuOps; the same bits as RefEngine(path="q8")."""

    def __init__(self, model: Model, pool: ExpertPool | None = None, n_ctx: int | None = None,
                 on_routing: Callable[[int, np.ndarray], None] | None = None):
        from strata.reference.linalg import Path

        self.model, self.cfg = model, model.cfg
        self.path = Path.Q8
        self.n_ctx = int(n_ctx or min(self.cfg.n_ctx_train, 4096))
        self.kv = CpuKV(self.cfg, self.n_ctx)
        self._on_routing = on_routing
        self._own_pool = pool is None
        self.pool = ExpertPool() if pool is None else pool
        self.ops = CpuOps(model, self.kv, self.pool, self._routing)
        self.pos = 0
        self.n_chunks = 0

    def close(self):
        if self._own_pool:
            self.pool.close()
