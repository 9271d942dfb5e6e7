"""``auto``: the meter's share, with or without the gate (SPEC §5-§6), one pair per prompt-size class, and the
strategy factory."""

from __future__ import annotations

from .env import Share, ShareMode
from .gate import PROBE, CpuGate, GateReading
from .meter import MARGIN, MeterSample, ShareMeter
from .share import NOTHING, SHARE_POLICIES, LayerEnd, SharePolicy, ShareKind, Wanted


@SHARE_POLICIES.register(ShareKind.AUTO_UNGATED)
class MeteredShare(SharePolicy):
    """The meter's share on every eligible layer (what auto did before the gate). With `layer_meters` (ours) each
    layer keeps a meter of its own samples too and shares by it once sampled: an expert's CPU cost moves with the
    layer, as its least-routed experts hold more or fewer tokens (flash-shape, 1,000 tokens: 1.5-2 tokens a CPU
    expert in layers 0-3, 1 in layers 4-7), and one share for all put layers 0-3's CPU past the GPU while layers
    4-7 took too little (the simulator, share_f_full_stop22b's routing; on the H200, 14 workers, side by side,
    layer meters -12.6 / -7.5 / -7.3% at 250 / 512 / 1,000 tokens where one meter made -2.4 / -4.0 / -1.8%:
    bench/results/h200/share_layers_w14_stop23.log, a draft whose veto read the layer's meter). `meter` takes
    every layer's samples: a new layer's share, the floor veto's aim and the class's summary."""

    kind = ShareKind.AUTO_UNGATED

    def __init__(self, meter: ShareMeter | None = None, layer_meters: bool = True):
        self.meter = meter or ShareMeter()   # its margin is every layer meter's
        self.layer_meters: dict[int, ShareMeter] | None = {} if layer_meters else None   # layer -> its own
        self._layer: int | None = None
        self._sample: MeterSample | None = None

    def meter_of(self, layer: int | None) -> ShareMeter:
        """The meter that sets `layer`'s share: its own once sampled, else the one of every layer."""
        own = self.layer_meters.get(layer) if self.layer_meters is not None else None
        return own if own is not None else self.meter

    def begin_layer(self, layer: int) -> bool:
        self._layer = layer
        return True

    def peek_arm(self, layer: int) -> bool:
        return True

    def prime(self, c_ms: float, g_ms: float) -> bool:
        return self.meter.prime(c_ms, g_ms)

    def share(self, arm: bool) -> float:
        return self.meter_of(self._layer).share if arm else 0.0

    def end_layer(self, end: LayerEnd) -> Wanted:
        assert self._sample is None, "read the previous layer's timings at this layer's routing sync first"
        if ShareMeter.wants_sample(end.nstream, end.n_cpu):
            self._sample = MeterSample(end.cpu_ms, end.n_cpu, end.nstream - end.n_cpu, end.layer)
        return self.wants()

    def wants(self) -> Wanted:
        return Wanted.of(self._sample is not None, False)

    def readings(self, gpu_ms: float | None, wall_ms: float | None) -> GateReading | None:
        self.folded = None
        if self._sample is not None:
            assert gpu_ms is not None, "the meter's window was pending but no time was given"
            s, self._sample = self._sample, None
            share = self.meter.sample(s.cpu_ms, s.n_cpu, gpu_ms, s.n_gpu)
            if self.layer_meters is not None:
                own = self.layer_meters.setdefault(s.layer, ShareMeter(self.meter.alpha, margin=self.meter.margin))
                share = own.sample(s.cpu_ms, s.n_cpu, gpu_ms, s.n_gpu)
            self.folded = s.line(gpu_ms, share)
        return None


@SHARE_POLICIES.register(ShareKind.AUTO_ONE)
class GatedShare(MeteredShare):
    """The meter's share on the layers the gate arms (SPEC §6), but for the floor veto (ours): while the meter's
    aim (its balance with the CPU's margin) lies under its floor, a share arm runs unshared (nothing taken: the
    gate skips it) except one in PROBE, which keeps the meter sampling. There the meter's own model says sharing
    loses, by more as the CPU falls behind (a one-worker pool on the H200: +19-37% a shared layer,
    bench/results/h200/share_arms_*), and the gate's ratios of a few percent's noise let a shared verdict stand for
    many chunks (gate_w1_stop19.log). The veto reads the meter of every layer (can the CPU keep up at all?), so one
    probe's sample lifts it for all layers once the CPU catches up; a layer's own meter sets how much it takes."""

    kind = ShareKind.AUTO_ONE

    def __init__(self, meter: ShareMeter | None = None, gate: CpuGate | None = None, veto: bool = True,
                 layer_meters: bool = True):
        super().__init__(meter, layer_meters)
        self.gate = gate or CpuGate()
        self.veto = veto         # False: the gate alone (the engine before 67e7045, SPEC §6 as written)
        self.vetoed = 0          # share arms the floor veto held back

    def begin_layer(self, layer: int) -> bool:
        super().begin_layer(layer)
        arm = self.gate.begin_layer(layer)
        if arm and self.veto and self.meter.below_floor:
            self.vetoed += 1
            return self.vetoed % PROBE == 0
        return arm

    def peek_arm(self, layer: int) -> bool:
        arm = self.gate.peek()
        if arm and self.veto and self.meter.below_floor:
            return (self.vetoed + 1) % PROBE == 0
        return arm

    def guesses(self, layer: int) -> bool:
        """An unshared layer once the gate's verdict is "do not share", or the floor veto holds the share back: on
        the H200, auto on qwen3's quarter cache 1.02/0.98/1.12x at 250/600/900 tokens against no guess beside the
        share (bench/results/h200/auto_ab_q8_stop50.log); flash-shape's gate shares, and guesses nothing (1.00x).
        Not while the gate explores or shares (its unshared arms are then its probes): guessing on every unshared
        arm moved flash-shape's verdicts, and its 900-token prompt ran 0.88x (auto_peek_ab_stop50.log)."""
        if self.peek_arm(layer) or self.gate.exploring():
            return False
        return not self.gate.gate or (self.veto and self.meter.below_floor)

    def end_layer(self, end: LayerEnd) -> Wanted:
        super().end_layer(end)
        self.gate.end_layer(end.layer, end.nstream, end.n_cpu, end.one_time_cost)
        return self.wants()

    def wants(self) -> Wanted:
        return Wanted.of(self._sample is not None, self.gate.pending is not None)

    def readings(self, gpu_ms: float | None, wall_ms: float | None) -> GateReading | None:
        super().readings(gpu_ms, wall_ms)
        if self.folded is not None and self.meter.below_floor:
            self.folded += f" (aim {self.meter.aim:.3f}, under the floor: 1 share arm in {PROBE} shares)"
        if self.gate.pending is not None:
            assert wall_ms is not None, "the gate's window was pending but no time was given"
            return self.gate.reading(wall_ms)
        return None


def size_class(tokens: int) -> int:
    """A chunk's size class: its half-octave of tokens (250 -> 15: 192..255; 512 and 600 -> 18: 512..767;
    900 and 1000 -> 19: 768..1023)."""
    assert tokens >= 1, tokens
    b = tokens.bit_length() - 1
    return 2 * b + (2 * tokens >= 3 << b)


def size_class_floor(c: int) -> int:
    """The fewest tokens of size class ``c`` (15 -> 192, 18 -> 512, 19 -> 768)."""
    return (1 << c // 2) * (3 if c % 2 else 2) // 2


@SHARE_POLICIES.register(ShareKind.AUTO)
class SizedShare(SharePolicy):
    """``auto`` with one meter and one gate per size class of the chunk (ours). Whether sharing pays, and how
    much, moves with the tokens per expert: on the H200 a 0.3 share cut a 250-token prompt by 26% and cost a
    1,000-token one 7%, and one pair for every size, as the original keeps it, carried the short prompts'
    verdict and share into the long ones: interleaved, auto cost +8% at 1,000 tokens and +3% at 512, where the
    fixed 0.3 gained 15% (bench/results/h200/share_f_real_onegate.log). Per class, each size keeps its own verdict
    (tests/test_policy_gate.py); on the H200 the 1,000-token loss stayed (+12%, share_f_real.log): there the
    loss lies outside the gate's window, where no verdict sees it. A window pending at a chunk's end is read into
    the class that opened it, at the next routing sync, as SPEC §5-§6 read it."""

    kind = ShareKind.AUTO

    def __init__(self, veto: bool = True, layer_meters: bool = True, class_seed: bool = True,
                 margin: float = MARGIN):
        self.by_class: dict[int, GatedShare] = {}
        self.veto, self.layer_meters, self.class_seed, self.margin = veto, layer_meters, class_seed, margin
        # until the first begin_chunk (a caller that never sizes: one class)
        self.current = GatedShare(ShareMeter(margin=margin), veto=veto, layer_meters=layer_meters)
        self._owner: GatedShare | None = None   # the class whose windows are pending

    def _class(self, c: int) -> GatedShare:
        got = self.by_class.get(c)
        if got is None:
            # a new class's meter starts where the last class's stands, not at SPEC §5's 0.5 (ours): what an
            # expert costs either side carries across sizes, and a fresh 0.5 on a slow pool made each class's first
            # prompt 1.9-2.8x off's (2 workers on the H200, auto's first prompts: share_f_full_stop23b.log); seeded,
            # the later classes' first prompts ran -2.1..+9.5% (share_f_w2_stop23.log)
            seed = self.current.meter if self.class_seed and self.current.meter.c_avg is not None else None
            got = self.by_class[c] = GatedShare(seed.copy() if seed is not None else ShareMeter(margin=self.margin),
                                                veto=self.veto, layer_meters=self.layer_meters)
        return got

    @property
    def meter(self) -> ShareMeter:
        return self.current.meter

    @property
    def gate(self) -> CpuGate:
        return self.current.gate

    def begin_chunk(self, tokens: int) -> None:
        self.current = self._class(size_class(tokens))

    def prime(self, c_ms: float, g_ms: float) -> bool:
        """The current meter, if unsampled: before the first chunk, the one the first class seeds from (_class)."""
        return self.current.prime(c_ms, g_ms)

    def begin_layer(self, layer: int) -> bool:
        return self.current.begin_layer(layer)

    def peek_arm(self, layer: int) -> bool:
        return self.current.peek_arm(layer)

    def guesses(self, layer: int) -> bool:
        return self.current.guesses(layer)

    def share(self, arm: bool) -> float:
        return self.current.share(arm)

    def end_layer(self, end: LayerEnd) -> Wanted:
        assert self._owner is None, "read the previous layer's windows at this layer's routing sync first"
        want = self.current.end_layer(end)
        if want.gpu or want.wall:
            self._owner = self.current
        return want

    def wants(self) -> Wanted:
        return self._owner.wants() if self._owner is not None else NOTHING

    def readings(self, gpu_ms: float | None, wall_ms: float | None) -> GateReading | None:
        owner, self._owner, self.folded = self._owner, None, None
        if owner is None:
            return None
        r = owner.readings(gpu_ms, wall_ms)
        self.folded = owner.folded
        return r


def share_policy(share: Share, gated: bool = True, sized: bool = True, veto: bool = True,
                 layer_meters: bool = True, class_seed: bool = True, margin: float = MARGIN) -> SharePolicy:
    """The strategy for a resolved share (``gated=False`` reproduces auto before the gate, ``sized=False``
    auto with one meter and gate for every size, ``veto=False`` auto before the floor veto, ``layer_meters=False``
    auto with one meter for every layer of a class, ``class_seed=False`` each class's meter from 0.5, ``margin=0``
    the meter's share at SPEC §5's balance: for studies and for replaying stored runs)."""
    if share.mode is ShareMode.OFF:
        return SHARE_POLICIES.create(ShareKind.OFF)
    if share.mode is ShareMode.FIXED:
        return SHARE_POLICIES.create(ShareKind.FIXED, share.fraction)
    if not gated:
        return SHARE_POLICIES.create(ShareKind.AUTO_UNGATED, ShareMeter(margin=margin), layer_meters=layer_meters)
    if not sized:
        return SHARE_POLICIES.create(ShareKind.AUTO_ONE, ShareMeter(margin=margin), veto=veto,
                                     layer_meters=layer_meters)
    return SHARE_POLICIES.create(ShareKind.AUTO, veto=veto, layer_meters=layer_meters, class_seed=class_seed,
                                 margin=margin)
