"""Workloads: routing per chunk and layer, as counts of tokens per expert (cnt[e]).

``ZipfRouting``: each layer ranks its experts in a fixed random order; popularity ~ rank^-s (the profile, from
which residency is filled hottest first). Each chunk tilts the popularity by a lognormal factor per expert
(sigma: the prompt's topic), and each of its T tokens routes to expert e with inclusion probability q_e
(sum q_e = K, water-filled so q_e <= 1): cnt_e ~ Binomial(T, q_e).
``TraceRouting``: the reference engine's ``--dump-routing`` ids, an npz with ``ids`` shaped [L, N, K].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .calibration import CALIB


def inclusion(p: np.ndarray, k: int) -> np.ndarray:
    """q = min(1, lam·p) with sum q = k (bisection on lam): top-k routing's per-token inclusion."""
    lo, hi = 0.0, k / p[p > 0].min()
    for _ in range(50):
        lam = 0.5 * (lo + hi)
        if np.minimum(1.0, lam * p).sum() > k:
            hi = lam
        else:
            lo = lam
    return np.minimum(1.0, lo * p)


@dataclass(frozen=True)
class ZipfRouting:
    n_layer: int
    n_expert: int
    k: int
    s: float = CALIB.zipf_s
    sigma: float = CALIB.chunk_sigma
    seed: int = 0
    _base: list = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self):
        rng = np.random.default_rng([self.seed, 1])
        ranks = 1.0 / np.arange(1, self.n_expert + 1) ** self.s
        for _ in range(self.n_layer):
            p = np.empty(self.n_expert)
            p[rng.permutation(self.n_expert)] = ranks
            self._base.append(p / p.sum())

    def profile(self) -> list[np.ndarray]:
        """Expected routing share per layer (what a profile from many prompts counts)."""
        return self._base

    def counts(self, layer: int, start: int, t: int) -> np.ndarray:
        """cnt[e] for the chunk of ``t`` tokens starting at prompt position ``start``."""
        rng = np.random.default_rng([self.seed, 2, start, layer])
        p = (
            self._base[layer] * rng.lognormal(0.0, self.sigma, self.n_expert)
            if self.sigma
            else self._base[layer]
        )
        return rng.binomial(t, inclusion(p / p.sum(), self.k))


@dataclass(frozen=True)
class TraceRouting:
    ids: np.ndarray  # [L, N, K] expert ids per layer, token, slot

    def __post_init__(self):
        assert self.ids.ndim == 3, f"routing ids are [layers, tokens, k], got shape {self.ids.shape}"

    @classmethod
    def load(cls, path: str | Path) -> "TraceRouting":
        with np.load(path) as z:
            return cls(np.asarray(z["ids"], dtype=np.int64))

    @property
    def n_layer(self) -> int:
        return self.ids.shape[0]

    @property
    def n_expert(self) -> int:
        return int(self.ids.max()) + 1

    def profile(self) -> list[np.ndarray]:
        out = []
        for l in range(self.n_layer):
            c = np.bincount(self.ids[l].ravel(), minlength=self.n_expert).astype(float)
            out.append(c / c.sum())
        return out

    def counts(self, layer: int, start: int, t: int) -> np.ndarray:
        assert (
            start + t <= self.ids.shape[1]
        ), f"the trace holds {self.ids.shape[1]} tokens, asked {start + t}"
        return np.bincount(self.ids[layer, start : start + t].ravel(), minlength=self.n_expert)


def residency(profile: list[np.ndarray], slots: int) -> list[list[bool]]:
    """Fill ``slots`` with the hottest (layer, expert) pairs of the profile (ties: lower layer, lower id)."""
    n_layer, n_expert = len(profile), len(profile[0])
    flat = np.concatenate(profile)
    order = np.lexsort((np.arange(flat.size), -flat))[: max(0, min(slots, flat.size))]
    res = np.zeros(flat.size, dtype=bool)
    res[order] = True
    return [res[l * n_expert : (l + 1) * n_expert].tolist() for l in range(n_layer)]
