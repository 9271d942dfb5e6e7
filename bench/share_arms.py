"""Diagnostic: the prefill CPU share with each gate arm forced on every eligible layer, and whether the gate's
windows hold the whole effect of sharing (seed 002's method: "I forced each arm on every layer and timed the
windows"). CUDA only.

python bench/share_arms.py --model X.gguf [--prompts 512,900,1000] [--workers 14,1] [--rounds 4] [--cache-frac 0.25]

Per pool size, interleaved rounds of:
  off            STRATA_PREFILL_CPU_SHARE=0
  no             auto's policy with the arm forced off: no share, every eligible layer's window timed
  share          the arm forced on: the meter's share on every eligible layer, windows timed
  alt            the arms alternating layer by layer, as the gate's exploration runs them
Printed per length: medians of prompt ms, the sum of a prompt's windows (before the routing sync to just before
the combine, SPEC §6), CPU experts; then share - no in prompt time against the same difference in windows. If
the windows hold the effect, the two differences agree; what they do not share happened outside the windows,
where no gate reading sees it. Last, the readings themselves: ms per non-resident expert of the shared and the
unshared windows, when every layer shares (share / no) and when the arms alternate (alt): the gate compares the
latter; if they differ, isolated shared layers read cheaper (or dearer) than sharing costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from strata.policy.auto import MeteredShare  # noqa: E402
from strata.policy.share import Wanted  # noqa: E402


class ForcedArm(MeteredShare):
    """The meter's share on the eligible layers `arm(i)` picks (i counts them, as the gate's i), none on the others;
    every window is timed."""

    def __init__(self, arm):
        super().__init__()
        self.arm, self.i = arm, 0
        self.windows: list[tuple[bool, int, float]] = []   # (shared, nstream, ms) of each window read, in order
        self._window = None

    def begin_layer(self, layer: int) -> bool:
        self.i += 1
        return self.arm(self.i - 1)

    def end_layer(self, end):
        super().end_layer(end)
        self._window = (end.n_cpu > 0, end.nstream) if end.nstream > 0 else None
        return self.wants()

    def wants(self) -> Wanted:
        return Wanted(gpu=self._sample is not None, wall=self._window is not None)

    def readings(self, gpu_ms, wall_ms):
        super().readings(gpu_ms, wall_ms)
        if self._window is not None:
            self.windows.append((*self._window, wall_ms))
            self._window = None
        return None


def per_expert(windows, shared: bool) -> float:
    """Mean window ms per non-resident expert over the windows of one arm (SPEC §6's reading)."""
    xs = [ms / n for s, n, ms in windows if s == shared]
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", default="512,900,1000")
    ap.add_argument("--workers", default="14,1")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--n-ctx", type=int, default=2064, help="as bench/cpu_share.py's run to 2,048 tokens: chunk 2,048")
    a = ap.parse_args()
    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding
    from strata.policy import Share, ShareMode

    log = lambda s: print(s, file=sys.stderr)
    lengths = [int(x) for x in a.prompts.split(",")]
    m = models.load(a.model)
    c = m.cfg
    dev = CudaDevice()
    budget = budget_holding(m, a.n_ctx, int(a.cache_frac * c.n_layer * c.n_expert))
    arena = Arena(m, dev, log=log)
    cfg = policy.from_process()
    rng = np.random.default_rng(0)
    auto = Share(ShareMode.AUTO, by_default=True)
    names = ("off", "no", "share", "alt")
    print(f"# {' '.join(sys.argv)}")
    for workers in (int(w) for w in a.workers.split(",")):
        pool = ExpertPool(workers=workers)
        eng = GpuEngine(m, dev, n_ctx=a.n_ctx, vram_budget=budget, config=cfg, log=log, arena=arena, pool=pool)
        cb = eng.cpu_block
        pols = {"off": eng.use_share(Share(ShareMode.OFF)), "no": ForcedArm(lambda i: False),
                "share": ForcedArm(lambda i: True), "alt": ForcedArm(lambda i: i % 2 == 1)}

        def one(name, ids):
            """One prompt of a setting: (ms, sum of its windows, CPU experts)."""
            eng.use_share(Share(ShareMode.OFF) if name == "off" else auto, pols[name])
            eng.reset()
            dev.synchronize()
            eng.cache.poll()
            pol = pols[name] if name != "off" else None
            w0, n0 = (len(pol.windows) if pol else 0), cb.stats["cpu_experts"]
            if pol is not None:
                pol.i = 0                        # each prompt's first eligible layer runs arm(0)
            t0 = time.perf_counter()
            eng.prefill(ids)
            ms = (time.perf_counter() - t0) * 1e3
            if pol is not None:
                dev.synchronize()
                cb.after_sync()                  # the chunk's last window, complete now
            got = pol.windows[w0:] if pol else []
            return ms, sum(w[2] for w in got), cb.stats["cpu_experts"] - n0

        for L in lengths:                        # warm-up: kernels, Numba, the pool, the meter
            ids = rng.integers(0, c.n_vocab, L).tolist()
            for name in names:
                one(name, ids)
        res = {L: {n: [] for n in names} for L in lengths}
        warm = {n: len(p.windows) for n, p in pols.items() if n != "off"}   # the rounds' readings follow these
        for r in range(a.rounds):
            for L in lengths:
                ids = rng.integers(0, c.n_vocab, L).tolist()
                for name in (names if r % 2 == 0 else names[::-1]):
                    res[L][name].append(one(name, ids))
        print(f"\n{workers} pool workers, quarter cache {eng.plan.cache_slots} slots, chunk {eng.plan.chunk}; "
              f"meter share at the end {pols['share'].meter.share:.3f}; medians of {a.rounds} rounds")
        print(f"{'tokens':>7} " + " ".join(f"{n + ' ms':>16}" for n in names)
              + f" {'win no':>8} {'win share':>10} {'CPU':>5} {'share-no: prompt':>17} {'windows':>8}")
        for L in lengths:
            med = {n: [statistics.median(x[i] for x in res[L][n]) for i in range(3)] for n in names}
            off = med["off"][0]
            cells = " ".join(f"{med[n][0]:7.1f} ({100 * (med[n][0] / off - 1):+5.1f}%)" for n in names)
            d_prompt = statistics.median(s[0] - n[0] for s, n in zip(res[L]["share"], res[L]["no"]))
            d_win = statistics.median(s[1] - n[1] for s, n in zip(res[L]["share"], res[L]["no"]))
            print(f"{L:>7} {cells} {med['no'][1]:8.1f} {med['share'][1]:10.1f} "
                  f"{med['share'][2]:5.0f} {d_prompt:+16.1f}ms {d_win:+7.1f}ms")
        readings = {n: pols[n].windows[w:] for n, w in warm.items()}
        rs, rn = per_expert(readings["share"], True), per_expert(readings["no"], False)
        as_, an = per_expert(readings["alt"], True), per_expert(readings["alt"], False)
        print(f"readings, ms per non-resident expert (all lengths): every layer shared {rs:.4f} / none {rn:.4f} = "
              f"{rs / rn:.3f}; alternating: shared {as_:.4f} / unshared {an:.4f} = {as_ / an:.3f}")
        pool.close()


if __name__ == "__main__":
    main()
