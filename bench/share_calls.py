"""In one process, CUDA only (stop 53): what auto's CPU block costs the engine thread on layers its gate leaves
unshared. Engines off and auto on one arena and pool, auto's gates preset settled on "do not share" (as on a
machine where the CPU loses: probes 1 layer in 29); each engine's CpuBlock calls and its MoE blocks (`_block`) timed
by perf_counter accumulators. Each prompt after 0.3 s idle (the pool parked), arms rotating; medians, and per
prompt the host ms inside each call and the ms blocked in routing syncs.

python bench/share_calls.py MODEL.gguf 250,600,900 ROUNDS"""
import collections
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_breakdown import call_timer
from kernel_ab import settle_gates, share_engines, share_line

CALLS = ("begin_layer", "rouse_ahead", "after_sync", "choose", "launch", "gpu_done", "finish", "settle")
path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev, m, pool, (e_off, e_auto) = share_engines(path, (0.0, None))
settle_gates((e_auto,), lengths)
arms = {"off": e_off, "auto": e_auto}
acc = {k: collections.defaultdict(float) for k in arms}


for k, e in arms.items():
    for obj, names in ((e.cpu_block, CALLS), (e, ("_block",))):
        for n in names:
            setattr(obj, n, call_timer(getattr(obj, n), acc[k], n))


def run(e, tokens):
    time.sleep(0.3)
    e.reset()
    dev.synchronize()
    s0 = e.stats.sync_wait_s
    t0 = time.perf_counter()
    e.prefill(tokens)
    t1 = time.perf_counter()
    dev.synchronize()
    return (t1 - t0) * 1e3, (e.stats.sync_wait_s - s0) * 1e3


rng = np.random.default_rng(0)
names = list(arms)
print(f"{path}: auto's gates preset settled; {rounds} rounds, arms rotating; medians; ratios per round against auto; "
      f"per prompt, host ms in each CpuBlock call (settle also runs inside the others) and in the MoE blocks",
      flush=True)
for L in lengths:
    ps = [rng.integers(0, m.cfg.n_vocab, L).tolist() for _ in range(rounds + 3)]
    for p in ps[:3]:                                    # warm: captures, the route memory
        for e in arms.values():
            run(e, p)
    for a in acc.values():
        a.clear()
    t, sw = {k: [] for k in names}, {k: [] for k in names}
    for i, p in enumerate(ps[3:]):
        for k in names[i % len(names):] + names[:i % len(names)]:
            ms, w = run(arms[k], p)
            t[k].append(ms)
            sw[k].append(w)
    auto = np.array(t["auto"])
    print(f"  {L:5d}: " + ", ".join(f"{k} {np.median(v):.2f} ms (x{np.median(np.array(v) / auto):.3f}, routing syncs "
                                     f"{np.median(sw[k]):.2f} ms)" for k, v in t.items()), flush=True)
    for k in names:
        cb = sum(v for n, v in acc[k].items() if n in CALLS and n != "settle")
        print(f"     {k}: CpuBlock calls {cb / rounds * 1e3:.3f} ms: " + ", ".join(
            f"{n} {v / rounds * 1e3:.3f}" for n, v in acc[k].items()), flush=True)
print(f"auto: {share_line(e_auto)}", flush=True)
