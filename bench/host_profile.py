"""Where the GPU engine's host time goes: cProfile of prompt chunks and decode steps with a quarter-size cache.

python bench/host_profile.py --model X.gguf [--prompt 250] [--decode 16] [--ctx 8200] [--top 35]

Prints, per phase, wall time, the host time blocked in routing syncs, and the functions with the most own time
(Python plus the CuPy calls they make). Speed is for bench/prefill.py; this says what to make faster.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--prompt", type=int, default=250)
    ap.add_argument("--decode", type=int, default=16, help="decode steps to profile (0: none)")
    ap.add_argument("--ctx", type=int, default=8200, help="context: bench/prefill.py's, whose plan (chunk, loan) "
                                                          "decides the prompt's walk")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--sort", default="tottime", help="pstats keys, comma-separated: one listing each")
    a = ap.parse_args()
    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.cpu.pool import ExpertPool, default_workers
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding

    m = models.load(a.model)
    c = m.cfg
    dev = CudaDevice()
    log = lambda s: print(s, file=sys.stderr)
    n_ctx = max(a.ctx, a.prompt + a.decode + 72)
    budget = budget_holding(m, n_ctx, int(a.cache_frac * c.n_layer * c.n_expert))
    arena = Arena(m, dev, log=log)
    pool = ExpertPool(workers=max(1, default_workers() - 1))
    cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
    eng = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, log=log, arena=arena, pool=pool)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, c.n_vocab, a.prompt).tolist()
    for _ in range(2):                                            # warm-up
        eng.reset()
        eng.prefill(prompt)
    for phase in ("prefill", "decode") if a.decode else ("prefill",):
        pr = cProfile.Profile()
        w0 = eng.stats.sync_wait_s
        t0 = time.perf_counter()
        if phase == "prefill":
            for _ in range(3):
                eng.reset()
                pr.enable()
                eng.prefill(prompt)
                pr.disable()
            n = 3
        else:
            eng.reset()
            eng.prefill(prompt[:64])
            t, w0, t0 = int(prompt[0]), eng.stats.sync_wait_s, time.perf_counter()
            pr.enable()
            for _ in range(a.decode):
                t = int(np.argmax(eng.decode([t])[-1]))
            pr.disable()
            n = a.decode
        wall = (time.perf_counter() - t0) / n
        print(f"== {phase}: {wall * 1e3:.2f} ms per {'prompt' if phase == 'prefill' else 'token'}, "
              f"routing-sync wait {(eng.stats.sync_wait_s - w0) / n * 1e3:.2f} ms, {c.n_layer} layers")
        for key in a.sort.split(","):
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats(key).print_stats(a.top)
            print(f"-- by {key}")
            print("\n".join(l for l in s.getvalue().splitlines() if l.strip())[:12000])


if __name__ == "__main__":
    main()
