"""Adaptive-tier admission between decode rounds (SPEC §7; adaptive_tier.cpp ``AdaptiveTier::adapt``).

Usage counts per (layer, expert) grow by one per routed token. Every ``every`` rounds: candidates are
non-resident experts with usage >= 2.0, hottest first; they fill free slots first (gain = usage), then each
layer's remaining candidates pair with that layer's least-used residents and swap when usage >= victim + 1.5
(gain = the difference). All moves are sorted by gain (ties by layer, expert), cut to 96, and usage decays by
0.7 after each adapt. The caller evicts at once and marks new experts resident when their copy lands.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence

from .registry import Registry


@dataclass(frozen=True, slots=True)
class Move:
    layer: int
    expert: int  # becomes resident
    victim: int | None  # evicted from the same layer, or None for a free slot
    gain: float


class TierKind(Enum):
    ADAPTIVE = "adaptive"


TIERS: Registry["AdaptiveTier"] = Registry("cache admission", TierKind)


@TIERS.register(TierKind.ADAPTIVE)
class AdaptiveTier:
    def __init__(
        self,
        n_layer: int,
        n_expert: int,
        every: int = 4,
        decay: float = 0.7,
        min_usage: float = 2.0,
        margin: float = 1.5,
        max_moves: int = 96,
    ):
        assert n_layer > 0 and n_expert > 0 and every >= 1 and 0.0 <= decay <= 1.0 and max_moves >= 0
        self.every, self.decay, self.max_moves = every, decay, max_moves
        self.min_usage, self.margin = min_usage, margin
        self.usage = [[0.0] * n_expert for _ in range(n_layer)]
        self.rounds = 0

    def note(self, layer: int, experts: Iterable[int]) -> None:
        """Count one use per routed (token, k) of ``layer``."""
        u = self.usage[layer]
        for e in experts:
            u[e] += 1.0

    def end_round(self, resident: Sequence[Sequence[bool]], free_slots: int) -> list[Move]:
        """Call after each decode round; returns the moves of an adapt round (every ``every``-th), else []."""
        self.rounds += 1
        if self.rounds % self.every:
            return []
        moves = self.adapt(resident, free_slots)
        for u in self.usage:
            for e in range(len(u)):
                u[e] *= self.decay
        return moves

    def adapt(self, resident: Sequence[Sequence[bool]], free_slots: int) -> list[Move]:
        assert len(resident) == len(self.usage), "resident flags for every layer"
        cands: list[list[int]] = []
        for l, u in enumerate(self.usage):
            c = [e for e in range(len(u)) if not resident[l][e] and u[e] >= self.min_usage]
            cands.append(sorted(c, key=lambda e: (-u[e], e)))
        # free slots go to the hottest candidates of all layers
        pool = sorted((-self.usage[l][e], l, e) for l, c in enumerate(cands) for e in c)
        moves = [Move(l, e, None, -nu) for nu, l, e in pool[: max(0, free_slots)]]
        filled = {(m.layer, m.expert) for m in moves}
        for l, c in enumerate(cands):
            u = self.usage[l]
            left = [e for e in c if (l, e) not in filled]
            victims = sorted((e for e in range(len(u)) if resident[l][e]), key=lambda e: (u[e], e))
            for e, v in zip(left, victims):
                if u[e] >= u[v] + self.margin:
                    moves.append(Move(l, e, v, u[e] - u[v]))
        moves.sort(key=lambda m: (-m.gain, m.layer, m.expert))
        return moves[: self.max_moves]
