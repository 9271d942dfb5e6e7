"""The accel CPU backend's ops and engine: RefOps' method set on the q8 path with the Numba kernels and the pool,
bit-identical to `RefOps(path=Q8)` / `RefEngine(path="q8")` (docs/NUMERICS.md).

Matmuls, attention heads and experts run on the ExpertPool; RMSNorm and softmax run in Numba on the calling
thread; embedding rows, RoPE, top-k and the k-ordered combine stay the reference's numpy code (reused, not
copied). Legend: T tokens, D hidden, E experts, K top-k, F expert FFN, S cached positions, hd head size.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from strata import quants
from strata.accel.cpu import _sched as S
from strata.accel.cpu import dense, entry, glue
from strata.accel.cpu._llvm import address
from strata.accel.cpu.act import act_row_bytes
from strata.accel.cpu.kernels import as_bytes
from strata.accel.cpu.pool import ExpertJob, ExpertPool
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


def _linear_row(w: np.ndarray, qtype: int) -> np.ndarray:
    """The constant part of a dense job's plan row for weight rows w [N, row_bytes] (see _sched.py)."""
    n, rb = w.shape
    entry.ensure(qtype)
    k = rb // quants.get(qtype).type_size * quants.get(qtype).block_size
    act = quants.get(qtype).vec_dot_type
    row = np.zeros(S.JF, np.int64)
    row[S.J_KIND], row[S.J_D], row[S.J_F] = S.JOB_LINEAR, k, n
    row[S.J_GW], row[S.J_GT], row[S.J_GROW] = address(w), qtype, rb
    row[S.J_GAT] = row[S.J_UAT] = act
    row[S.J_QXGROW] = row[S.J_QXUROW] = act_row_bytes(act, k)
    return row


class _Experts:
    """One layer's stacked expert tensors as plan-row parts: base addresses, bytes per expert, types."""

    def __init__(self, model: Model, layer: int):
        cfg, p = model.cfg, f"blk.{layer}."
        mats = [model.view(p + f"ffn_{r}_exps.weight") for r in ("gate", "up", "down")]
        types = [model.qtype(p + f"ffn_{r}_exps.weight") for r in ("gate", "up", "down")]
        for t in types:
            entry.ensure(t)
        D, F = cfg.n_embd, cfg.n_ff_exp
        self.keep = mats
        self.base = np.array([address(m) for m in mats], np.int64)            # [3]
        self.stride = np.array([m.nbytes // cfg.n_expert for m in mats], np.int64)
        acts = [quants.get(t).vec_dot_type for t in types]
        row = np.zeros(S.JF, np.int64)
        row[S.J_KIND], row[S.J_D], row[S.J_F] = S.JOB_EXPERT, D, F
        row[S.J_GT], row[S.J_UT], row[S.J_DT] = types
        row[S.J_GROW], row[S.J_UROW], row[S.J_DROW] = (quants.get(types[0]).row_bytes(D),
                                                       quants.get(types[1]).row_bytes(D),
                                                       quants.get(types[2]).row_bytes(F))
        row[S.J_GAT], row[S.J_UAT], row[S.J_DAT] = acts
        row[S.J_QXGROW], row[S.J_QXUROW], row[S.J_QHROW] = (act_row_bytes(acts[0], D), act_row_bytes(acts[1], D),
                                                            act_row_bytes(acts[2], F))
        row[S.J_XS] = row[S.J_OS] = D
        for m, size in zip(mats, self.stride):
            if not m.flags.c_contiguous or m.nbytes != size * cfg.n_expert:
                raise ValueError(f"layer {layer}: stacked expert tensors must be contiguous")
        self.row = row


class CpuOps(RefOps):
    def __init__(self, model: Model, kv: CpuKV, pool: ExpertPool,
                 on_routing: Callable[[int, np.ndarray], None] | None = None):
        from strata.reference.linalg import Path

        super().__init__(model, Path.Q8, None, kv, on_routing)
        self.pool = pool
        self._wcache: dict[str, tuple[np.ndarray, int, np.ndarray]] = {}
        self._ecache: dict[int, _Experts] = {}
        self._stash: dict[str, tuple[np.ndarray, np.ndarray]] = {}   # name -> (its input x, its output)
        self._lcache: dict[tuple[str, ...], tuple] = {}

    def _wb(self, name: str) -> tuple[np.ndarray, int, np.ndarray]:
        """A weight as uint8 rows [N, row_bytes], its type and its plan row (views of the mapped file, cached)."""
        if name not in self._wcache:
            view = self.model.view(name)
            w = as_bytes(view.reshape(view.shape[0], -1) if view.ndim > 1 else view.reshape(1, -1))
            qt = self.model.qtype(name)
            self._wcache[name] = (w, qt, _linear_row(w, qt))
        return self._wcache[name]

    # --- dense -------------------------------------------------------------------------------------------------
    head_rows = slice(None)   # rows of the final norm (and so of the output head) CpuEngine.forward wants

    def rms_norm(self, x: np.ndarray, name: str, eps: float) -> np.ndarray:
        if name == "output_norm.weight":
            x = x[self.head_rows]
        w = np.ascontiguousarray(self.model.view(name), np.float32).reshape(-1)
        x2 = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
        out = np.empty_like(x2)
        dense.rms_norm_rows(x2, w, float(eps), out)
        return out.reshape(x.shape)

    def _linears(self, x: np.ndarray, names: tuple[str, ...]) -> list[np.ndarray]:
        """x [T, K] times several weights in one pool batch (one activation quantisation per type)."""
        x = np.ascontiguousarray(x, np.float32)
        T = x.shape[0]
        tpl = self._lcache.get(names)
        if tpl is None:
            ws = [self._wb(n) for n in names]
            rows = np.stack([row for _, _, row in ws])
            acts = rows[:, S.J_GAT]
            owner = np.array([int(np.flatnonzero(acts == a)[0]) for a in acts], np.int64)
            tpl = self._lcache[names] = (rows, owner, [w.shape[0] for w, _, _ in ws])
        rows, owner, ns = tpl
        outs = [np.empty((T, n), np.float32) for n in ns]
        plan = rows.copy()
        plan[:, S.J_N], plan[:, S.J_X], plan[:, S.J_XS] = T, address(x), x.shape[1]
        plan[:, S.J_OUT] = [address(o) for o in outs]
        plan[:, S.J_OS] = ns
        self.pool.run_plan(plan, owner, (x, outs))
        return outs

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        hit = self._stash.pop(name, None)
        if hit is not None and hit[0] is x:
            return hit[1]
        if name.endswith(".attn_q.weight"):   # q, k and v read the same x: one batch, k and v kept for the next calls
            p = name[: -len("attn_q.weight")]
            sib = [p + "attn_k.weight", p + "attn_v.weight"]
            if all(n in self.model.tensors for n in sib):
                q, k, v = self._linears(x, (name, *sib))
                self._stash = {sib[0]: (x, k), sib[1]: (x, v)}
                return q
        return self._linears(x, (name,))[0]

    def attention(self, layer: int, q, k, v, pos: np.ndarray) -> np.ndarray:
        T = q.shape[0]
        kt, vc = self.kv.kt[layer], self.kv.v[layer]
        kt[:, :, pos] = np.transpose(k, (1, 2, 0))                       # [Hkv, hd, T]
        vc[:, pos, :] = np.transpose(v, (1, 0, 2))                       # [Hkv, T, hd]
        H, hd = q.shape[1], q.shape[2]
        q = np.ascontiguousarray(q, np.float32)
        pos = np.ascontiguousarray(pos, np.int64)
        out = np.empty((T, H * hd), np.float32)                           # [T, H*hd]
        plan = np.zeros((1, S.JF), np.int64)                               # an AttentionJob's row (pool.plan)
        p = plan[0]
        p[S.J_KIND], p[S.J_N], p[S.J_D], p[S.J_F] = S.JOB_ATTN, T, int(pos[-1]) + 1, H
        p[S.J_GT], p[S.J_GROW], p[S.J_UT] = kt.shape[0], hd, kt.shape[2]
        p[S.J_X], p[S.J_GW], p[S.J_UW], p[S.J_DW], p[S.J_OUT] = (address(q), address(kt), address(vc),
                                                                  address(pos), address(out))
        self.pool.run_plan(plan, np.zeros(1, np.int64), (q, pos, out))
        return out

    def ffn(self, h: np.ndarray, gate: str, up: str, down: str) -> np.ndarray:
        (g, gt, _), (u, ut, _), (d, dt, _) = self._wb(gate), self._wb(up), self._wb(down)
        h = np.ascontiguousarray(h, np.float32)
        out = np.empty_like(h)
        D, F = h.shape[1], g.shape[0]
        self.pool.run([ExpertJob.from_parts(g, u, d, (gt, ut, dt), D, F, h[t0:t0 + MAXT], out[t0:t0 + MAXT])
                       for t0 in range(0, h.shape[0], MAXT)])
        return out

    def rope(self, x: np.ndarray, pos: np.ndarray, cfg: MoEConfig) -> np.ndarray:
        return glue.rope_rows(np.ascontiguousarray(x, np.float32), self.cos, self.sin,
                              np.ascontiguousarray(pos, np.int64), cfg.n_rot, cfg.rope_neox)

    def topk(self, probs: np.ndarray, k: int, renorm: bool = False) -> tuple[np.ndarray, np.ndarray]:
        ids, w = glue.topk_rows(np.ascontiguousarray(probs, np.float32), k)
        return ids, self.renorm(w) if renorm else w

    def renorm(self, w: np.ndarray) -> np.ndarray:
        return glue.renorm_rows(np.ascontiguousarray(w, np.float32))

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
        ex = self._ecache.get(layer)
        if ex is None:
            ex = self._ecache[layer] = _Experts(self.model, layer)
        plan, owner, order, xs, dm = glue.expert_plan(np.ascontiguousarray(ids, np.int32), ex.row, ex.base, ex.stride,
                                                      np.ascontiguousarray(h, np.float32), MAXT)
        self.pool.run_plan(plan, owner, (xs, dm, ex))
        return glue.combine(dm, order, np.ascontiguousarray(w, np.float32))


class CpuEngine(RefEngine):
    """RefEngine's loop (prefill, decode, generate) over CpuOps; the same bits as RefEngine(path="q8")."""

    def __init__(self, model: Model, pool: ExpertPool | None = None, n_ctx: int | None = None,
                 on_routing: Callable[[int, np.ndarray], None] | None = None):
        from strata.reference.linalg import Path

        self.model, self.cfg = model, model.cfg
        self.path = Path.Q8
        self.n_ctx = int(n_ctx or min(self.cfg.n_ctx_train, 4096))
        self.kv = CpuKV(self.cfg, self.n_ctx)
        self.on_routing = on_routing
        self._own_pool = pool is None
        self.pool = ExpertPool() if pool is None else pool
        self.ops = CpuOps(model, self.kv, self.pool, self._routing)
        self.pos = 0
        self.n_chunks = 0
        self.on_layer = None     # RefEngine's progress hook

    def forward(self, tokens, logits: str = "all") -> np.ndarray | None:
        """RefEngine.forward, with `logits` = "all" [T, V], "last" [1, V] (what sampling needs: the output head
        runs on one row, as llama.cpp's does) or "none" (a non-final prompt chunk)."""
        if logits not in ("all", "last", "none"):
            raise ValueError(f"logits must be 'all', 'last' or 'none', got {logits!r}")
        if logits == "all":
            return super().forward(tokens)
        ids = np.asarray(tokens, np.int64).reshape(-1)
        head = self.ops.head_rows
        self.ops.head_rows = slice(-1, None) if logits == "last" else slice(0, 0)
        try:
            out = super().forward(ids)
        finally:
            self.ops.head_rows = head
        return out if logits == "last" else None

    def prefill(self, tokens, chunk: int | None = None, logits: str = "all") -> np.ndarray:
        """RefEngine.prefill; with logits="last" only the final token's logits [1, V]."""
        if logits == "all":
            return super().prefill(tokens, chunk)
        tokens = list(tokens)
        step = chunk or len(tokens)
        for i in range(0, len(tokens) - step, step):
            self.forward(tokens[i:i + step], logits="none")
        return self.forward(tokens[(len(tokens) - 1) // step * step:], logits=logits)

    def close(self):
        if self._own_pool:
            self.pool.close()
