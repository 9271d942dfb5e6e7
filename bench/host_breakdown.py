"""Where a prompt's host time goes, by function, on the GPU engine (CUDA; --device host: a smoke test).

python bench/host_breakdown.py --model X.gguf [--prompts 250,900] [--rounds 7] [--device host]

The quarter-cache and all-resident engines (share off, as bench/prefill.py) run prompts with the kernel wrappers,
the device calls and the MoE block's host steps wrapped in timers; per prompt, the wall time inside each is summed,
and the medians over rounds are printed with the routing-sync wait and the layout window (the engine's Stats
counters).
Calls nest (engine.moe holds the MoE steps; ExpertRunner.tables holds k.layer_tables, which holds one table copy), so
the rows do not add up to the wall. The timers cost about a microsecond a call. Speed itself is bench/prefill.py's.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time

import numpy as np

KERNELS = ("dequant", "gemm_grouped", "expert_rows", "swiglu", "linear", "rms_norm", "rope", "kv_store", "attention",
           "router", "gather_f16", "combine", "upload", "upload_many", "layer_tables", "embed_rows",
           "linear_many", "add")
DEVICE = ("h2d_rows", "d2h", "event", "empty")


def call_timer(f, acc, name: str):
    """f, with the wall seconds spent inside each call added to acc[name] (bench/share_calls.py uses it too)."""
    def timed(*args, **kw):
        t0 = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            acc[name] += time.perf_counter() - t0
    return timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", default="250,900")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--device", choices=("cuda", "host"), default="cuda", help="host: a smoke test on the CPU twin")
    a = ap.parse_args()
    import strata.accel.engine as E
    import strata.accel.moe_block as B
    import strata.accel.moe as M
    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.device.base import get_device
    from strata.accel.memplan import budget_holding

    lengths = [int(x) for x in a.prompts.split(",")]
    dev = get_device(a.device)
    k = dev.k
    m = models.load(a.model)
    c = m.cfg
    n_ctx = 8200                                   # bench/prefill.py's context: the same prompt plan
    budget = budget_holding(m, n_ctx, int(a.cache_frac * c.n_layer * c.n_expert))
    log = lambda s: print(s, file=sys.stderr)
    arena = Arena(m, dev, log=log)
    cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
    engines = (("quarter", E.GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, arena=arena, log=log)),
               ("resident", E.GpuEngine(m, dev, n_ctx=n_ctx, config=cfg, arena=arena, log=log)))
    acc = collections.defaultdict(float)

    def timed(name, f):
        return call_timer(f, acc, name)

    for name in KERNELS:
        setattr(k, name, timed("k." + name, getattr(k, name)))
    for name in DEVICE:
        setattr(dev, name, timed("dev." + name, getattr(dev, name)))
    for mod, name in ((B, "placement"), (B, "row_layout"), (B, "walk_runs"), (E, "head")):
        setattr(mod, name, timed(name, getattr(mod, name)))
    for cls, names in ((M.ExpertRunner, ("resident_groups", "tables", "group")),
                       (E.Walk, ("prefetch", "ensure_issued", "acquire", "consume")), (E.Ring, ("release",))):
        for n in names:
            setattr(cls, n, timed(f"{cls.__name__}.{n}", getattr(cls, n)))
    for _, e in engines:
        e.ops.moe = timed("engine.moe", e.moe)
    rng = np.random.default_rng(0)
    for L in lengths:                              # warm-up: kernels compiled, memory pools grown
        for _, e in engines:
            for _ in range(2):
                e.reset()
                e.prefill(rng.integers(0, c.n_vocab, L).tolist())
    for L in lengths:
        for name, e in engines:
            per, walls, syncs, lays = collections.defaultdict(list), [], [], []
            for _ in range(a.rounds):
                p = rng.integers(0, c.n_vocab, L).tolist()
                acc.clear()
                w0, l0 = e.stats.sync_wait_s, e.stats.layout_s
                e.reset()
                dev.synchronize()
                t0 = time.perf_counter()
                e.prefill(p)
                walls.append((time.perf_counter() - t0) * 1e3)
                dev.synchronize()
                syncs.append((e.stats.sync_wait_s - w0) * 1e3)
                lays.append((e.stats.layout_s - l0) * 1e3)
                for key, v in acc.items():
                    per[key].append(v * 1e3)
            print(f"== {name} {L} tokens: wall {np.median(walls):.1f} ms, routing-sync wait {np.median(syncs):.1f}, "
                  f"layout window {np.median(lays):.1f} (sums over {c.n_layer} layers)")
            for key, v in sorted(((key, float(np.median(v))) for key, v in per.items()), key=lambda x: -x[1]):
                if v >= 0.05:
                    print(f"   {key:28s} {v:7.2f} ms")


if __name__ == "__main__":
    main()
