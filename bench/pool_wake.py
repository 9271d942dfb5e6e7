"""The first batch after an idle spell, with the pool's workers parked: as the prefill share's first layer of a
prompt meets them (a user's prompts come seconds apart; the workers park after spin_us + doze_ms). CPU only.

python bench/pool_wake.py [--workers 1] [--type Q4_K] [--d 2048] [--f 768] [--experts 8] [--tokens 2] [--hold-ms 3] [--rounds 7]

Per round, interleaved (the order alternating), each after an idle spell longer than the doze window:
  parked   publish the batch, then the engine thread holds the GIL for --hold-ms (issuing GPU work, as
           GpuEngine.moe does after CpuBlock.launch), then waits for the batch
  roused   ExpertPool.rouse() first, then a blocking call of 1 ms that releases the GIL (the routing sync), then
           as parked
  awake    a batch right after another (the workers spinning; its core also warm, which the two cases after an
           idle spell are not, so it is no floor for them)
Prints per case the batch's wall ms (publication to last tile, ExpertPool.wait) as medians, and roused / parked
side by side per round: the comparison that holds the idle spell the same.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--d", type=int, default=2048, help="n_embd (qwen3-30b-a3b's)")
    ap.add_argument("--f", type=int, default=768, help="n_ff_exp (qwen3-30b-a3b's)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2)
    ap.add_argument("--hold-ms", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--doze-ms", type=float, default=50.0, help="the pool's doze window (the engine's: 200 ms; "
                    "shorter here only to keep the idle spells short)")
    a = ap.parse_args()
    from cpu_pool import _blobs, batch_plan

    from strata import quants
    from strata.accel.cpu.pool import ExpertPool, ticks_per_us

    names = {quants.type_name(c.qtype): c.qtype for c in quants.registered()}
    if a.type not in names:
        raise SystemExit(f"--type {a.type}: not one of {', '.join(sorted(names))}")
    q = names[a.type]
    rng = np.random.default_rng(0)
    batches, _ = _blobs(q, a.d, a.f, a.experts, 0, rng)
    xs = (0.5 * rng.standard_normal((a.experts, 8, a.d))).astype(np.float32)
    outs = np.empty_like(xs)
    pool = ExpertPool(workers=a.workers, doze_ms=a.doze_ms)
    plan = batch_plan(pool, batches[0], (q, q, q), a.d, a.f, xs, outs, a.tokens)

    def hold(ms):                       # Python work that keeps the GIL, as the engine thread's launches do
        t_end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < t_end:
            pass

    def batch(rouse: bool) -> float:
        if rouse:
            pool.rouse()
            time.sleep(1e-3)            # a blocking call: the GIL is free (the routing sync)
        pool.submit(*plan)
        hold(a.hold_ms)
        return pool.wait()

    idle = 1.5 * (pool.spin_ticks / max(1e-9, ticks_per_us()) / 1e6 + a.doze_ms / 1e3) + 0.05   # s: parked
    batch(False)                        # warm-up: compiled, pages touched
    res = {"parked": [], "roused": [], "awake": []}
    for r in range(a.rounds):
        for case in (("parked", "roused") if r % 2 == 0 else ("roused", "parked")):
            time.sleep(idle)
            res[case].append(batch(case == "roused"))
        res["awake"].append(batch(False))
    med = {k: statistics.median(v) for k, v in res.items()}
    side = statistics.median(r / p for r, p in zip(res["roused"], res["parked"]))
    print(f"# {' '.join(sys.argv)}")
    print(f"{a.workers} workers, {a.experts} {a.type} experts of {a.tokens} tokens, the engine thread holding the GIL "
          f"{a.hold_ms:g} ms after publishing; idle spells {idle * 1e3:.0f} ms; medians of {a.rounds}, batch ms: "
          + ", ".join(f"{k} {v:.2f}" for k, v in med.items()) + f"; roused / parked side by side {side:.2f}")
    for k, v in res.items():
        print(f"  {k}: " + " ".join(f"{x:.2f}" for x in v))
    pool.close()


if __name__ == "__main__":
    main()
