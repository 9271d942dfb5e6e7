"""In one process, CUDA only (stop 52): the CPU pool roused a layer ahead of the layers the share arms (CpuBlock.
rouse_ahead) against roused at every prompt's start (the engine before it), and the share off, parked and just
after a rouse (what awake workers cost the engine thread; added after stop 52's runs, whose doze_q8_stop52.log read
it with an ad hoc script). Engines on one arena and pool: off; auto with the old rouse (the pool roused before each
prompt); auto. Each prompt starts after 0.3 s idle, so the pool is parked (its doze is 200 ms) and no arm's wake-up
spills into the next. With --settled, every size class's gate starts settled on "do not share" (five ratios of 2.0:
no exploration, probes 1 in 29), as on a machine where the CPU loses.

python bench/rouse_ab.py MODEL.gguf 250,600,900 ROUNDS [--settled]"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_ab import settle_gates, share_engines, share_line

settled = "--settled" in sys.argv
argv = [a for a in sys.argv if a != "--settled"]
path, lengths, rounds = argv[1], [int(x) for x in argv[2].split(",")], int(argv[3])
dev, m, pool, (e_off, e_old, e_new) = share_engines(path, (0.0, None, None))
if settled:
    settle_gates((e_old, e_new), lengths)
arms = {"off": (e_off, False), "off, roused": (e_off, True), "auto, roused at the prompt (old)": (e_old, True),
        "auto (new)": (e_new, False)}


def timed(e, tokens, rouse: bool) -> float:
    time.sleep(0.3)
    e.reset()
    dev.synchronize()
    t0 = time.perf_counter()
    if rouse:
        pool.rouse()
    e.prefill(tokens)
    t1 = time.perf_counter()
    dev.synchronize()
    return (t1 - t0) * 1e3


rng = np.random.default_rng(0)
names = list(arms)
print(f"{path}: quarter cache {e_new.plan.cache_slots} slots, pool {pool.workers} workers, "
      f"{'gates preset settled' if settled else 'gates as they learn'}; {rounds} rounds, arms rotating; medians; "
      f"ratios per round against auto (new)", flush=True)
for L in lengths:
    ps = [rng.integers(0, m.cfg.n_vocab, L).tolist() for _ in range(rounds + 3)]
    for p in ps[:3]:                                    # warm: captures, and the gates' first readings
        for e, r in arms.values():
            timed(e, p, r)
    t = {k: [] for k in names}
    for i, p in enumerate(ps[3:]):
        for k in names[i % len(names):] + names[:i % len(names)]:
            t[k].append(timed(arms[k][0], p, arms[k][1]))
    new = np.array(t["auto (new)"])
    print(f"  {L:5d}: " + ", ".join(f"{k} {np.median(v):.2f} ms" + (
        "" if k == "auto (new)" else f" (x{np.median(np.array(v) / new):.3f})") for k, v in t.items()), flush=True)
for name, e in (("auto old", e_old), ("auto new", e_new)):
    print(f"{name}: {share_line(e)}", flush=True)
pool.close()
