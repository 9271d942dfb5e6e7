"""The contention gate, ``auto``'s second half: share only while sharing is faster (SPEC §6; PR #1379).

Per eligible layer, in engine order:
  arm = gate.begin_layer(l)             top of the layer, before the input's D2H copy and the routing sync
  ... routing sync: gate.reading(ms) for the previous layer's pending window, if any ...
  gate.end_layer(l, nstream, n_cpu, one_time_cost)   just before the combine; True = record the end event
A window runs from before the routing sync to just before the combine; a reading is its ms / nstream.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

RATIOS = 5  # CPU_RATIOS: the ratio ring
MIN_RATIOS = 3  # CPU_MIN_RATIOS: exploration until this many ratios
PROBE = 29  # CPU_PROBE: every 29th eligible layer runs the other arm (prime: probes drift)


@dataclass(frozen=True, slots=True)
class GateReading:
    layer: int
    shared: bool
    nstream: int
    wall_ms: float
    ratio: float | None  # with-share / without-share, when this reading formed one
    gate: bool  # the verdict after this reading (True = share)

    @property
    def per_expert_ms(self) -> float:
        return self.wall_ms / self.nstream

    def line(self) -> str:
        """The STRATA_DBG_CPU_GATE line (SPEC §6)."""
        arm = "shared" if self.shared else "not shared"
        verdict = "share" if self.gate else "do not share"
        return (
            f"cpu gate: layer {self.layer} {arm}, {self.nstream} non-resident, {self.wall_ms:.2f} ms "
            f"({self.per_expert_ms:.4f} a expert) -> {verdict}"
        )


@dataclass(frozen=True, slots=True)
class _Window:
    shared: bool
    layer: int
    n: int


class CpuGate:
    """State persists across chunks and requests (as prefill.cpp's Impl keeps it until reset())."""

    def __init__(self):
        self.ratios: deque[float] = deque(maxlen=RATIOS)
        self.gate = False  # cpu_gate: share in the decision phase
        self.layers = 0  # cpu_layers: eligible layers seen
        self.first_layer: int | None = None  # cpu_first_l: the model's first eligible layer, never read
        self.pending: _Window | None = None  # a window whose end event was recorded, read at the next sync
        self._open: tuple[int, bool] | None = None  # (layer, arm) between begin_layer and end_layer
        self._last: tuple[bool, int, float] | None = None  # (shared, layer, ms/expert) last read

    def exploring(self) -> bool:
        return len(self.ratios) < MIN_RATIOS

    def peek(self) -> bool:
        """The arm the next begin_layer gives, nothing changed (only readings and begin_layer move it)."""
        i = self.layers
        return (i % 2 == 1) if self.exploring() else ((i % PROBE == 0) != self.gate)

    def begin_layer(self, layer: int) -> bool:
        arm = self.peek()
        self.layers += 1
        if self.first_layer is None:
            self.first_layer = layer
        self._open = (layer, arm)
        return arm

    def end_layer(self, layer: int, nstream: int, n_cpu: int, one_time_cost: bool = False) -> bool:
        """True iff this layer's window gives a reading (record the end event). Skipped: the first eligible
        layer, a window holding a one-time cost (pinned buffer allocated or grown), nstream == 0, and a
        share-arm layer where nothing was taken."""
        assert self._open is not None and self._open[0] == layer, f"end_layer({layer}) without begin_layer"
        assert self.pending is None, "read the previous window (reading()) at this layer's routing sync first"
        _, arm = self._open
        self._open = None
        cold = layer == self.first_layer or one_time_cost
        if nstream > 0 and (not arm or n_cpu > 0) and not cold:
            self.pending = _Window(arm, layer, nstream)
            return True
        return False

    def reading(self, wall_ms: float) -> GateReading:
        """Fold in the pending window's device time (ms). A ratio forms only against the previous reading of
        the other arm in the same chunk (its layer index is lower); the verdict is the upper median < 1."""
        p = self.pending
        assert p is not None, "no window is pending"
        self.pending = None
        w = wall_ms / p.n
        ratio = None
        if self._last is not None and self._last[0] != p.shared and p.layer > self._last[1]:
            with_, without = (w, self._last[2]) if p.shared else (self._last[2], w)
            ratio = with_ / without if without > 0 else math.inf  # C's float division gives inf too
            self.ratios.append(ratio)
            self.gate = sorted(self.ratios)[len(self.ratios) // 2] < 1.0
        self._last = (p.shared, p.layer, w)
        return GateReading(p.layer, p.shared, p.n, wall_ms, ratio, self.gate)
