"""``auto``: the meter's share, with or without the gate (SPEC §5-§6), and the strategy factory."""

from __future__ import annotations

from .env import Share, ShareMode
from .gate import CpuGate, GateReading
from .meter import MeterSample, ShareMeter
from .share import SHARE_POLICIES, LayerEnd, SharePolicy, ShareKind, Wanted


@SHARE_POLICIES.register(ShareKind.AUTO_UNGATED)
class MeteredShare(SharePolicy):
    """The meter's share on every eligible layer (what auto did before the gate)."""

    kind = ShareKind.AUTO_UNGATED

    def __init__(self, meter: ShareMeter | None = None):
        self.meter = meter or ShareMeter()
        self._sample: MeterSample | None = None
        self.folded: str | None = None  # the last readings() call's meter line (STRATA_DBG_CPU_GATE), if any

    def begin_layer(self, layer: int) -> bool:
        return True

    def share(self, arm: bool) -> float:
        return self.meter.share if arm else 0.0

    def end_layer(self, end: LayerEnd) -> Wanted:
        assert self._sample is None, "read the previous layer's timings at this layer's routing sync first"
        if ShareMeter.wants_sample(end.nstream, end.n_cpu):
            self._sample = MeterSample(end.cpu_ms, end.n_cpu, end.nstream - end.n_cpu, end.layer)
        return self.wants()

    def wants(self) -> Wanted:
        return Wanted(gpu=self._sample is not None)

    def readings(self, gpu_ms: float | None, wall_ms: float | None) -> GateReading | None:
        self.folded = None
        if self._sample is not None:
            assert gpu_ms is not None, "the meter's window was pending but no time was given"
            s, self._sample = self._sample, None
            self.folded = s.line(gpu_ms, self.meter.sample(s.cpu_ms, s.n_cpu, gpu_ms, s.n_gpu))
        return None


@SHARE_POLICIES.register(ShareKind.AUTO)
class GatedShare(MeteredShare):
    """The meter's share on the layers the gate arms (SPEC §6)."""

    kind = ShareKind.AUTO

    def __init__(self, meter: ShareMeter | None = None, gate: CpuGate | None = None):
        super().__init__(meter)
        self.gate = gate or CpuGate()

    def begin_layer(self, layer: int) -> bool:
        return self.gate.begin_layer(layer)

    def end_layer(self, end: LayerEnd) -> Wanted:
        super().end_layer(end)
        self.gate.end_layer(end.layer, end.nstream, end.n_cpu, end.one_time_cost)
        return self.wants()

    def wants(self) -> Wanted:
        return Wanted(gpu=self._sample is not None, wall=self.gate.pending is not None)

    def readings(self, gpu_ms: float | None, wall_ms: float | None) -> GateReading | None:
        super().readings(gpu_ms, wall_ms)
        if self.gate.pending is not None:
            assert wall_ms is not None, "the gate's window was pending but no time was given"
            return self.gate.reading(wall_ms)
        return None


def share_policy(share: Share, gated: bool = True) -> SharePolicy:
    """The strategy for a resolved share (``gated=False`` reproduces auto before the gate, for studies)."""
    if share.mode is ShareMode.OFF:
        return SHARE_POLICIES.create(ShareKind.OFF)
    if share.mode is ShareMode.FIXED:
        return SHARE_POLICIES.create(ShareKind.FIXED, share.fraction)
    return SHARE_POLICIES.create(ShareKind.AUTO if gated else ShareKind.AUTO_UNGATED)
