"""The reference engine: prefill, decode and generate over a loaded model, deterministic to the bit.

Every op works row by row and every sum has a fixed order (docs/NUMERICS.md), so the same tokens give the same
bits whatever the chunking (whole prompt, chunks of 7, token by token), thread count or run.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from strata.models import Model
from strata.reference.linalg import Path
from strata.reference.ops import KVCache, Placement, RefOps
from strata.sampling import Sampler, SamplingParams


class ContextOverflow(ValueError):
    pass


class RefEngine:
    def __init__(self, model: Model, path: Path | str = Path.FLOAT, placement: Placement | None = None,
                 n_ctx: int | None = None, on_routing: Callable[[int, np.ndarray], None] | None = None):
        self.model, self.cfg = model, model.cfg
        self.path = Path(path)
        self.n_ctx = int(n_ctx or min(self.cfg.n_ctx_train, 4096))
        self.kv = KVCache(self.cfg, self.n_ctx)
        self.on_routing = on_routing
        self.ops = RefOps(model, self.path, placement, self.kv, self._routing)
        self.pos = 0
        self.n_chunks = 0
        self.on_layer: Callable[[int, int], None] | None = None   # (layer, tokens) after each block: progress

    def _routing(self, layer: int, ids: np.ndarray):
        if self.on_routing:
            self.on_routing(layer, ids)

    def reset(self):
        self.pos = 0

    def forward(self, tokens) -> np.ndarray:
        """Append `tokens` at the current position; logits of every one [T, V] f32."""
        ids = np.asarray(tokens, np.int64).reshape(-1)
        T = ids.size
        if T == 0:
            raise ValueError("no tokens to process")
        if self.pos + T > self.n_ctx:
            raise ContextOverflow(f"{self.pos + T} tokens do not fit the context of {self.n_ctx} "
                                  f"({self.pos} already cached, {T} new)")
        if ids.min() < 0 or ids.max() >= self.cfg.n_vocab:
            raise ValueError(f"token id out of range [0, {self.cfg.n_vocab})")
        pos = np.arange(self.pos, self.pos + T)
        x = self.ops.embed("token_embd.weight", ids)                        # [T, D]
        for layer in range(self.cfg.n_layer):
            x = self.model.forward_block(self.ops, x, layer, pos)            # [T, D]
            if self.on_layer:
                self.on_layer(layer, T)
        self.pos += T
        self.n_chunks += 1
        from strata.models.common import head

        return head(self.ops, self.cfg, x)                                   # [T, V]

    def prefill(self, tokens, chunk: int | None = None) -> np.ndarray:
        """Process a prompt in chunks of `chunk` tokens (all at once by default): logits [T, V]."""
        tokens = list(tokens)
        step = chunk or len(tokens)
        return np.concatenate([self.forward(tokens[i:i + step]) for i in range(0, len(tokens), step)])

    def decode(self, token: int) -> np.ndarray:
        return self.forward([token])[0]

    def generate(self, prompt: list[int], n: int, sampling: SamplingParams,
                 stop: Callable[[int], bool] | None = None) -> list[int]:
        """Prefill the prompt, then sample up to `n` tokens (stopping after one for which stop(id) holds)."""
        sampler = Sampler(sampling)
        logits = self.prefill(prompt)[-1]
        hist, out = list(prompt), []
        for _ in range(n):
            t = sampler(logits, hist)
            out.append(t)
            hist.append(t)
            if (stop and stop(t)) or len(out) == n:
                break
            logits = self.decode(t)
        return out
