"""The reference backend's ops: what `strata/models/*` calls, in numpy, on the float or q8 path.

Legend: T tokens, D hidden, E experts, K top-k, F expert FFN, V vocabulary.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from strata.mathfn import rope_table, sigmoid32
from strata.models import Model, common
from strata.models.base import MoEConfig
from strata.reference import linalg
from strata.reference.linalg import Path

Placement = Callable[[int, int], Path]   # (layer, expert) -> the path that computes it


class KVCache:
    """Per layer K and V after RoPE, float32: k[l] [n_ctx, Hkv, hd]."""

    def __init__(self, cfg: MoEConfig, n_ctx: int):
        self.n_ctx = n_ctx
        self.k = [np.zeros((n_ctx, cfg.n_head_kv, cfg.head_dim), np.float32) for _ in range(cfg.n_layer)]
        self.v = [np.zeros((n_ctx, cfg.n_head_kv, cfg.head_dim), np.float32) for _ in range(cfg.n_layer)]


class RefOps:
    def __init__(self, model: Model, path: Path, placement: Placement | None, kv: KVCache,
                 on_routing: Callable[[int, np.ndarray], None] | None = None):
        self.model, self.cfg, self.path, self.kv = model, model.cfg, path, kv
        self.placement = placement or (lambda layer, e: path)
        self.on_routing = on_routing
        self.cos, self.sin = rope_table(kv.n_ctx, self.cfg.n_rot, self.cfg.rope_base)

    def _w(self, name: str):
        return self.model.view(name), self.model.qtype(name)

    # --- dense -------------------------------------------------------------------------------------------
    def embed(self, name: str, ids: np.ndarray) -> np.ndarray:
        view, qt = self._w(name)
        return np.stack([linalg.weight_rows(view, qt, int(i), int(i) + 1, self.cfg.n_embd)[0] for i in ids])

    def rms_norm(self, x: np.ndarray, name: str, eps: float) -> np.ndarray:
        return linalg.rms_norm(x, np.asarray(self.model.view(name), np.float32).reshape(-1), eps)

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return linalg.matmul(x, *self._w(name), self.path)

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """x + y, f32: a block's residual add (a backend may launch it as one kernel)."""
        return x + y

    def add_bias(self, y: np.ndarray, name: str) -> np.ndarray:
        return y + np.asarray(self.model.view(name), np.float32).reshape(-1)

    def rope(self, x: np.ndarray, pos: np.ndarray, cfg: MoEConfig) -> np.ndarray:
        return linalg.rope(x, self.cos[pos], self.sin[pos], cfg.n_rot, cfg.rope_neox)

    def qk_norm_rope(self, q, k, qn: str, kn: str, eps: float, pos, cfg: MoEConfig):
        """q [T, H, hd], k [T, Hkv, hd]: each head RMSNormed by qn / kn, then RoPE'd."""
        return common.norm_then_rope(self, q, k, qn, kn, eps, pos, cfg)

    def attention(self, layer: int, q, k, v, pos: np.ndarray) -> np.ndarray:
        end = int(pos[-1]) + 1
        self.kv.k[layer][pos] = k
        self.kv.v[layer][pos] = v
        return linalg.attention(q, self.kv.k[layer][:end], self.kv.v[layer][:end], pos)

    def ffn(self, h: np.ndarray, gate: str, up: str, down: str) -> np.ndarray:
        return linalg.swiglu_ffn(h, self._w(gate), self._w(up), self._w(down), self.path)

    def sigmoid_gate(self, s: np.ndarray, h: np.ndarray, name: str) -> np.ndarray:
        g = linalg.matmul(h, np.asarray(self.model.view(name)).reshape(1, -1), self.model.qtype(name), self.path)
        return s * sigmoid32(g)                                            # [T, D] · [T, 1]

    # --- routing -------------------------------------------------------------------------------------------
    def router_probs(self, h: np.ndarray, name: str) -> np.ndarray:
        return linalg.softmax64(self.linear(h, name)).astype(np.float32)   # [T, E]

    def topk(self, probs: np.ndarray, k: int, renorm: bool = False) -> tuple[np.ndarray, np.ndarray]:
        ids = np.argsort(-probs, axis=1, kind="stable")[:, :k].astype(np.int32)   # ties -> lower id
        w = np.take_along_axis(probs, ids, axis=1)
        return ids, self.renorm(w) if renorm else w

    def renorm(self, w: np.ndarray) -> np.ndarray:
        s = np.zeros(w.shape[0], np.float32)
        for k in range(w.shape[1]):
            s += w[:, k]
        return w / s[:, None]

    # --- experts -------------------------------------------------------------------------------------------
    def expert(self, x: np.ndarray, layer: int, e: int, path: Path) -> np.ndarray:
        """One expert on its tokens: x [n, D] -> [n, D] unweighted."""
        s = self.model.expert(layer, e)
        return linalg.swiglu_ffn(x, (s.gate, s.types[0]), (s.up, s.types[1]), (s.down, s.types[2]), path)

    def experts(self, h: np.ndarray, layer: int, ids: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Σ_k w[t,k]·expert_{ids[t,k]}(h[t]), combined in k order in float32 (SPEC §3)."""
        if self.on_routing:
            self.on_routing(layer, ids)
        T, K = ids.shape
        y = np.empty((T, K, h.shape[1]), np.float32)                       # [T, K, D] unweighted rows (Dm)
        for e in np.unique(ids):
            t_idx, k_idx = np.nonzero(ids == e)
            y[t_idx, k_idx] = self.expert(h[t_idx], layer, int(e), self.placement(layer, int(e)))
        out = np.zeros((T, h.shape[1]), np.float32)
        for k in range(K):
            out = out + w[:, k, None] * y[:, k]
        return out
