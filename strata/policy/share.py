"""Share strategies: the one object the engine asks, per eligible layer, how much the CPU takes (SPEC §4-§6).

Engine loop: pol.begin_chunk(T) at a routed-only chunk's start; for an eligible layer l (pool held):
  arm = pol.begin_layer(l)          # before the routing sync; arm -> copy the layer's input D2H
  ... routing sync: pol.readings(gpu_ms, wall_ms) if pol.wants() (the previous layer's windows) ...
  choice = chooser.choose(cnt, resident, in_ram, pol.share(arm))
  want = pol.end_layer(LayerEnd(l, choice.nstream, choice.n_cpu, cpu_ms, one_time_cost))
  # want.gpu: time CPU thread launch -> end of GPU experts; want.wall: before the sync -> before the combine
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .gate import GateReading
from .registry import Registry


@dataclass(frozen=True, slots=True)
class LayerEnd:
    layer: int
    nstream: int  # routed non-resident experts
    n_cpu: int  # of which the CPU computed
    cpu_ms: float = 0.0  # the CPU thread's wall time
    one_time_cost: bool = False  # a pinned buffer was allocated or grown inside the window


@dataclass(frozen=True, slots=True)
class Wanted:
    gpu: bool = False  # the meter's window (CPU launch -> end of the GPU's experts)
    wall: bool = False  # the gate's window (before the routing sync -> before the combine)

    @staticmethod
    def of(gpu: bool, wall: bool) -> "Wanted":
        """One of the four values, made once (asked two or three times an eligible layer, on the engine's chain)."""
        return _WANTED[gpu][wall]


_WANTED = ((Wanted(False, False), Wanted(False, True)), (Wanted(True, False), Wanted(True, True)))
NOTHING = _WANTED[0][0]


class ShareKind(Enum):
    OFF = "off"
    FIXED = "fixed"
    AUTO = "auto"  # meter + gate (#1379), one pair per prompt-size class (ours)
    AUTO_ONE = "auto-one"  # meter + gate, one pair for every size (#1379 as the original keeps it)
    AUTO_UNGATED = "auto-ungated"  # meter alone, every eligible layer shares (#1282, "auto before")


SHARE_POLICIES: Registry["SharePolicy"] = Registry("share policy", ShareKind)


class SharePolicy:
    kind: ShareKind
    folded: str | None = None  # the last readings() call's meter line (STRATA_DBG_CPU_GATE), if any

    def begin_chunk(self, tokens: int) -> None:  # a routed-only chunk of this many tokens starts
        pass

    def begin_layer(self, layer: int) -> bool:  # arm: True = this layer may share
        return False

    def peek_arm(self, layer: int) -> bool:
        """What begin_layer(layer) would return now, changing nothing (between a layer's end and the next
        begin_layer only end_layer runs, which moves no arm)."""
        return False

    def guesses(self, layer: int) -> bool:
        """Whether the engine may stream `layer`'s likely experts before its routing sync (policy.guess): where the
        layer will not share on a settled verdict, so that it runs as it would with the share off. Not where it
        may share (the CPU picks after the sync), nor on an exploring gate's unshared arms, whose windows are the
        share's yardstick. Here (no gate to settle): every unarmed layer."""
        return not self.peek_arm(layer)

    def share(self, arm: bool) -> float:
        return 0.0

    def end_layer(self, end: LayerEnd) -> Wanted:
        return NOTHING

    def wants(self) -> Wanted:
        """The device windows pending since the last end_layer (read them at the next routing sync)."""
        return NOTHING

    def readings(self, gpu_ms: float | None, wall_ms: float | None) -> GateReading | None:
        return None

    def prime(self, c_ms: float, g_ms: float) -> bool:
        """Start a meter that has no sample yet from measured costs an expert (ms): CPU c, streamed g. True if
        it took them (auto whose first meter is unsampled)."""
        return False


@SHARE_POLICIES.register(ShareKind.OFF)
class NoShare(SharePolicy):
    kind = ShareKind.OFF


@SHARE_POLICIES.register(ShareKind.FIXED)
class FixedShare(SharePolicy):
    """A fixed fraction on every eligible layer; bypasses the meter and the gate."""

    kind = ShareKind.FIXED

    def __init__(self, fraction: float):
        assert 0.0 < fraction <= 1.0, f"a fixed share is in (0, 1], got {fraction}"
        self.fraction = fraction

    def begin_layer(self, layer: int) -> bool:
        return True

    def peek_arm(self, layer: int) -> bool:
        return True

    def share(self, arm: bool) -> float:
        return self.fraction if arm else 0.0
