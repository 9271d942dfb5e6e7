"""Which experts a routed-only prompt chunk streams before a layer's routing sync (ours; no SPEC section).

The routed-only walk (SPEC §3) copies a layer's experts once its routing sync says which it routed, so the link
idles from the chunk's start to layer 0's sync and at every layer change (the embedding, the dense part, the sync,
the placement: ~1 ms before layer 0 and 0.1-0.3 ms a layer on qwen3's 250-token prompt,
bench/results/h200/timeline_q8_stop34.log). `RouteMemory` guesses a layer's experts from the routing of recent
prompt chunks, kept across prompts (a conversation's next prompt routes much as its last one), so the engine can
issue their copies into the ring before the sync. A wrong guess costs its copy's link time; the engine computes
nothing from it.

Legend: L layers, E experts, T tokens of the chunk being guessed for.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

GUESS_KEEP = 0.5   # weight of what the memory held on each note (the rest is the chunk just routed)
GUESS_P = 0.8      # guess an expert a chunk of T tokens routes with at least this probability


class RouteMemory:
    """q[l, e]: the share of a chunk's tokens that chose expert e in layer l, a decayed mean over the prompt chunks
    noted (each token picks K distinct experts, so a row sums to K). A chunk of T tokens independent of each other
    routes e with probability 1 - (1 - q)^T: all of a broad layer's experts at a few hundred tokens, only the hot
    few of a narrow one, at any T."""

    def __init__(self, n_layer: int, n_expert: int, keep: float = GUESS_KEEP, p_min: float = GUESS_P):
        assert 0.0 <= keep < 1.0 and 0.0 < p_min <= 1.0, (keep, p_min)
        self.keep, self.p_min = keep, p_min
        self.q = np.zeros((n_layer, n_expert))             # [L, E]
        self.noted = np.zeros(n_layer, bool)               # [L] a layer guesses nothing before its first note
        # (layer, tokens) -> routed_p, until the layer's next note: a prompt layer asks it up to four times (its
        # guess, then the pre-sync groups' three questions), ~8 us each on the H200's host
        self._p: dict[tuple[int, int], np.ndarray] = {}

    def note(self, layer: int, cnt: np.ndarray, tokens: int) -> None:
        """A prompt chunk of `tokens` tokens routed cnt [E] tokens to each expert of `layer`."""
        share = np.asarray(cnt, np.float64) / max(tokens, 1)
        if self.noted[layer]:
            self.q[layer] = self.keep * self.q[layer] + (1.0 - self.keep) * share
        else:
            self.q[layer], self.noted[layer] = share, True
        for key in [k for k in self._p if k[0] == layer]:
            del self._p[key]

    def routed_p(self, layer: int, tokens: int) -> np.ndarray:
        """[E] the chance that a chunk of `tokens` tokens routes each expert of `layer` (read-only: kept until the
        layer's next note)."""
        key = (layer, tokens)
        p = self._p.get(key)
        if p is None:
            if len(self._p) >= 8 * self.q.shape[0]:       # chunk sizes that did not come back
                self._p.clear()
            p = self._p[key] = 1.0 - (1.0 - np.minimum(self.q[layer], 1.0)) ** tokens
            p.flags.writeable = False
        return p

    def expected(self, layer: int, tokens: int, among: Sequence[bool]) -> float | None:
        """How many of the experts `among` (bool [E]) a chunk of `tokens` tokens routes, expected; None before the
        layer's first note."""
        if not self.noted[layer]:
            return None
        return float(self.routed_p(layer, tokens)[np.asarray(among, bool)].sum())

    def mean_rows(self, layer: int, tokens: int) -> float | None:
        """The rows a routed expert of `layer` gets from a chunk of `tokens` tokens, expected (its T·K pairs over the
        experts it routes); None before the layer's first note."""
        if not self.noted[layer]:
            return None
        return float(tokens * self.q[layer].sum() / max(self.routed_p(layer, tokens).sum(), 1e-9))

    def guess(self, layer: int, tokens: int, resident: Sequence[bool], n: int) -> list[int]:
        """Up to `n` non-resident experts of `layer` that a chunk of `tokens` tokens likely routes (at least p_min),
        the likeliest first when there are more, returned in id order (neighbours copy in one run)."""
        if n <= 0 or not self.noted[layer]:
            return []
        p = self.routed_p(layer, tokens)
        cand = np.flatnonzero((p >= self.p_min) & ~np.asarray(resident, bool))
        if cand.size > n:
            cand = cand[np.argsort(-p[cand], kind="stable")[:n]]
        return sorted(cand.tolist())
