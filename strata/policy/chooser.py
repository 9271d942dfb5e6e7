"""Which streamed experts the CPU pool takes in a layer (SPEC §4; prefill.cpp after the routing sync).

Sequences are indexed by expert id: ``cnt[e]`` tokens routed to e (0 = not routed), ``resident[e]`` (in the
VRAM cache), ``in_ram[e]`` (the CPU can read its blob now: pinned or not transient, and stable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from .registry import Registry

MAXT = 8  # the CPU multi-token kernel's token limit per expert (pool.hpp)


def llround(x: float) -> int:
    """C's llround: nearest integer, halves away from zero (Python's round() goes to even)."""
    f = math.floor(abs(x))
    n = f + (1 if abs(x) - f >= 0.5 else 0)  # abs(x) - floor is exact for doubles
    return int(n) if x >= 0 else -int(n)


@dataclass(frozen=True, slots=True)
class CpuChoice:
    cpu: tuple[int, ...]  # experts the CPU computes, in the order taken (fewest tokens first, then id)
    nstream: int  # routed non-resident experts before the split (the gate divides by this)

    @property
    def n_cpu(self) -> int:
        return len(self.cpu)


class ChooserKind(Enum):
    FEWEST_FIRST = "fewest-first"


CHOOSERS: Registry["Chooser"] = Registry("cpu expert chooser", ChooserKind)


class Chooser:
    def choose(
        self, cnt: Sequence[int], resident: Sequence[bool], in_ram: Sequence[bool], share: float
    ) -> CpuChoice:
        raise NotImplementedError


@CHOOSERS.register(ChooserKind.FEWEST_FIRST)
class FewestFirst(Chooser):
    """Candidates: routed, non-resident, cnt <= MAXT, blob in RAM; sorted by (cnt, id);
    take = min(#candidates, llround(share * nstream))."""

    def __init__(self, maxt: int = MAXT):
        assert maxt >= 1, "the CPU takes experts of at least one token"
        self.maxt = maxt

    def choose(
        self, cnt: Sequence[int], resident: Sequence[bool], in_ram: Sequence[bool], share: float
    ) -> CpuChoice:
        assert len(cnt) == len(resident) == len(in_ram), "cnt, resident and in_ram cover the same experts"
        assert 0.0 <= share <= 1.0, f"share {share} outside [0, 1]"
        nstream = 0
        cands: list[tuple[int, int]] = []
        for e in range(len(cnt)):
            c = int(cnt[e])
            if c <= 0 or resident[e]:
                continue
            nstream += 1
            if c <= self.maxt and in_ram[e]:
                cands.append((c, e))
        take = min(len(cands), llround(share * nstream))
        if take <= 0:
            return CpuChoice((), nstream)
        cands.sort()
        return CpuChoice(tuple(e for _, e in cands[:take]), nstream)
