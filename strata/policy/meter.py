"""The share meter, ``auto``'s first half (SPEC §5; prefill.cpp ``cpu_share_now``).

c = CPU thread wall ms / CPU experts; g = device ms from the CPU thread's launch to the end of the GPU's
expert work / GPU-streamed experts. Both are read one layer late (at the next routing sync, events done).
Running means with alpha 0.25, the first sample initialising; share = clamp(g / (c + g), 0.05, 0.9) (SPEC), or
with a margin m (ours) clamp(g / ((1 + m)·c + g), 0.05, 0.9).
"""

from __future__ import annotations

from dataclasses import dataclass

ALPHA = 0.25
SHARE_MIN, SHARE_MAX = 0.05, 0.9
SHARE_START = 0.5
# ours: the share aims the CPU's end before the GPU's, as if each CPU expert cost MARGIN more than its running mean.
# A late CPU stalls the layer by all it is late; an early one forgoes a little of the gain. On the H200's two-worker
# pool (bench/results/h200/share_layers_w2_stop24_lines.log) a layer's CPU ms an expert moved by 7-15% (sd over mean)
# between prompts, and at SPEC's balance 22 of 54 and 30 of 53 shared layers ended after the GPU's experts (900 and
# 1,000 tokens): auto +2.2 / +3.0% against off, side by side. 0.25 is 2.5 such spreads
MARGIN = 0.25
# ours: the load probe that primes the meter (accel/cpu_block.py probe_prior, and the simulator's): a batch of this
# many experts of this many tokens (the chooser takes the least-routed: 1-2 tokens each at 250-1,000 tokens on
# flash-shape)
PRIME_EXPERTS, PRIME_TOKENS = 32, 2


@dataclass(frozen=True, slots=True)
class MeterSample:
    """What the engine holds for the meter when a shared layer reaches its combine (host side)."""

    cpu_ms: float  # the CPU thread's wall time (steady clock)
    n_cpu: int  # experts the CPU computed
    n_gpu: int  # streamed experts the GPU computed (nstream - n_cpu)
    layer: int = -1

    def __post_init__(self):
        assert self.n_cpu > 0 and self.n_gpu > 0, "a sample needs experts on both sides"
        assert self.cpu_ms >= 0.0, "a wall time is not negative"

    def line(self, gpu_ms: float, share: float) -> str:
        """The STRATA_DBG_CPU_GATE line of a meter sample (ours, after the fork diagnostic that appended the
        share and the CPU and GPU ms per expert): the two sides' per-expert costs and the share they set."""
        return (f"cpu meter: layer {self.layer}, {self.n_cpu} on the CPU {self.cpu_ms:.2f} ms "
                f"({self.cpu_ms / self.n_cpu:.4f} a expert), {self.n_gpu} streamed {gpu_ms:.2f} ms "
                f"({gpu_ms / self.n_gpu:.4f} a expert) -> share {share:.3f}")


class ShareMeter:
    def __init__(self, alpha: float = ALPHA, start: float = SHARE_START, margin: float = MARGIN):
        self.alpha = alpha
        self.margin = margin  # 0 is SPEC §5's meter
        self.share = start
        self.c_avg: float | None = None  # ms per CPU expert
        self.g_avg: float | None = None  # ms per GPU-streamed expert

    def copy(self) -> "ShareMeter":
        """A meter that starts from this one's averages, margin and share."""
        got = ShareMeter(self.alpha, self.share, self.margin)
        got.c_avg, got.g_avg = self.c_avg, self.g_avg
        return got

    def prime(self, c_ms: float, g_ms: float) -> bool:
        """Averages from measured costs before any sample (ours: SPEC §5 starts at 0.5, which on a slow pool cost
        a first prompt up to +90%, share_f_full_stop24.log); a sample since keeps the meter as it is."""
        if self.c_avg is not None:
            return False
        assert c_ms > 0.0 and g_ms > 0.0, f"a prior needs both costs, got c {c_ms} g {g_ms}"
        self.c_avg, self.g_avg = c_ms, g_ms
        self.share = min(SHARE_MAX, max(SHARE_MIN, self.aim))
        return True

    @property
    def balance(self) -> float | None:
        """g / (c + g) before the clamp, where both sides would end together (None before the first sample)."""
        if self.c_avg is None:
            return None
        total = self.c_avg + self.g_avg
        return self.g_avg / total if total > 0 else SHARE_START

    @property
    def aim(self) -> float | None:
        """g / ((1 + m)·c + g) before the clamp: the share whose CPU, each expert m dearer than its mean, ends with
        the GPU (the balance at m = 0; None before the first sample)."""
        if self.c_avg is None:
            return None
        total = (1 + self.margin) * self.c_avg + self.g_avg
        return self.g_avg / total if total > 0 else SHARE_START

    @property
    def below_floor(self) -> bool:
        """The aim lies under SHARE_MIN (ours): at the floor's share the CPU, m dearer, ends after the GPU would have
        ended alone ((1 + m)·c > 19 g), so the meter's own model says the shared layer is slower."""
        return self.c_avg is not None and self.aim < SHARE_MIN

    @staticmethod
    def wants_sample(nstream: int, n_cpu: int) -> bool:
        """A layer leaves a sample iff the CPU took experts and the GPU kept some (n_stream > n_cpu)."""
        return n_cpu > 0 and nstream > n_cpu

    def sample(self, cpu_ms: float, n_cpu: int, gpu_ms: float, n_gpu: int) -> float:
        """Fold one layer's timings in; returns the new share."""
        assert n_cpu > 0 and n_gpu > 0, "a sample needs experts on both sides"
        c, g = cpu_ms / n_cpu, gpu_ms / n_gpu
        if self.c_avg is None:
            self.c_avg, self.g_avg = c, g
        else:
            self.c_avg += self.alpha * (c - self.c_avg)
            self.g_avg += self.alpha * (g - self.g_avg)
        self.share = min(SHARE_MAX, max(SHARE_MIN, self.aim))
        return self.share
