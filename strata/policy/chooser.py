"""Which streamed experts the CPU pool takes in a layer (SPEC §4; prefill.cpp after the routing sync).

Sequences are indexed by expert id: ``cnt[e]`` tokens routed to e (0 = not routed), ``resident[e]`` (in the
VRAM cache), ``in_ram[e]`` (the CPU can read its blob now: pinned or not transient, and stable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

import numpy as np

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
        # in numpy: a Python loop over flash-shape's 512 experts took ~0.1 ms of host time a layer, shared or not
        cnt, resident, in_ram = np.asarray(cnt), np.asarray(resident, bool), np.asarray(in_ram, bool)
        assert cnt.shape == resident.shape == in_ram.shape, "cnt, resident and in_ram cover the same experts"
        assert 0.0 <= share <= 1.0, f"share {share} outside [0, 1]"
        streamed = (cnt > 0) & ~resident                        # routed, non-resident
        nstream = int(streamed.sum())
        cands = np.flatnonzero(streamed & (cnt <= self.maxt) & in_ram)      # ascending id
        take = min(cands.size, llround(share * nstream))
        if take <= 0:
            return CpuChoice((), nstream)
        order = cands[np.argsort(cnt[cands], kind="stable")]               # by (cnt, id): stable over ids
        return CpuChoice(tuple(int(e) for e in order[:take]), nstream)
