"""In one process, one engine: the quarter cache's residents without a routing profile filled uniformly (expert i of
every layer before expert i+1 of any: each layer the same share) against front-weighted (layer l's share falling
linearly with l, each layer's lowest experts as the uniform fill takes them): a prompt's first layers wait on the
link with nothing to overlap their copies, a later layer's copies go out under the layers before it. Refilled
between the arms; the CPU share off; logits compared bit for bit; per arm the prompt's ms, MB streamed and ratio to its own PCIe floor, and
decode tok/s (captured graph, teacher-forced random tokens) with its hit rate. CUDA only.

python bench/fill_ab.py MODEL.gguf 250,600,900,2048 ROUNDS"""
import sys
import time

import numpy as np

import prefill as prefill_mod
from prefill import h2d_gbps, quarter_engines, timed_prompt, warm      # bench/prefill.py
from strata.accel import cache as cache_mod

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev, m, arena, (e,) = quarter_engines(path, 1)
c = m.cfg
L, E = c.n_layer, c.n_expert
uniform = cache_mod.uniform_order(L, E)
S = e.cache.usable
w = np.arange(L, 0, -1, dtype=np.float64)
quota = np.minimum(E, np.floor(S * w / w.sum()).astype(int))
quota[0] += S - quota.sum()                          # what rounding left, to the first layer
front = [(l, x) for l in range(L) for x in range(quota[l])]
front += [p for p in uniform if p[1] >= quota[p[0]]]    # past the cache: the order's tail, unused
orders = {"old": uniform, "new": front}


def refill(md):
    prefill_mod.refill(dev, e, arena, orders[md])


def decode(n=16):
    e.reset()
    e.prefill(rng.integers(0, c.n_vocab, 64).tolist())
    s0 = (e.stats.decode_tokens, e.stats.lookups, e.stats.hits)
    t0 = time.perf_counter()
    for _ in range(n):
        e.decode([int(rng.integers(0, c.n_vocab))])
    dev.synchronize()
    dt = time.perf_counter() - t0
    look, hit = e.stats.lookups - s0[1], e.stats.hits - s0[2]
    return n / dt, hit / max(look, 1)


bw, _ = h2d_gbps(dev, arena.blob(0, 0).nbytes)
rng = np.random.default_rng(0)
for md in ("old", "new"):
    refill(md)
    warm((e,), lengths, rng, c.n_vocab)
    decode()
print(f"{path}: quarter cache {S} usable slots (chunk {e.plan.chunk}); H2D {bw:.1f} GB/s; old = uniform fill "
      f"({S // L} a layer), new = front-weighted {quota.tolist()}; {rounds} rounds, arms alternating; medians",
      flush=True)
for n in lengths:
    t = {"old": [], "new": []}; mb = {"old": [], "new": []}; same = True
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, n).tolist()
        outs = {}
        for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
            refill(md)
            ms, outs[md], after, got = timed_prompt(dev, e, p)
            t[md].append(ms); mb[md].append(got)
        same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))   # residency changes no bit
    rr = np.array(t["old"]) / np.array(t["new"])
    print(f"  {n:5d}: " + "  ".join(
        f"{md} {np.median(t[md]):6.2f} ms ({np.median(mb[md]):4.0f} MB, x{np.median(t[md]) / (np.median(mb[md]) / bw):.2f} floor)"
        for md in ("old", "new"))
        + f"  old/new x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}); logits identical: {same}", flush=True)
dec = {"old": [], "new": []}
for r in range(rounds):
    for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
        refill(md)
        dec[md].append(decode())
print("  decode: " + "  ".join(f"{md} {np.median([x for x, _ in dec[md]]):.1f} tok/s (hit rate "
                               f"{np.median([h for _, h in dec[md]]):.3f})" for md in ("old", "new")), flush=True)
