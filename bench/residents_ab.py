"""In one process, one engine: the quarter cache's residents in slots by layer (cache.by_layer since stop 39: a
prompt's loan, the cache's last slots, takes the last layers' residents first) against slots in the fill's own
order (the uniform fill alternates layers slot by slot: the loan took every layer's highest experts alike). The
cache is refilled in the other arm's layout between the arms (the same residents, other slots); the CPU share off;
logits compared bit for bit; MB streamed, each arm's ratio to its own PCIe floor (H2D measured here) and the refill
after the prompt reported. CUDA only.

python bench/residents_ab.py MODEL.gguf 250,600,900 ROUNDS"""
import sys, numpy as np
from strata.accel import cache as cache_mod

from prefill import h2d_gbps, quarter_engines, refill, timed_prompt, warm      # bench/prefill.py

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev, m, arena, (e,) = quarter_engines(path, 1)
c = m.cfg
order = cache_mod.uniform_order(c.n_layer, c.n_expert)
by_layer = cache_mod.by_layer


def layout(md):
    """Refill the cache with the same residents in arm md's slots."""
    cache_mod.by_layer = by_layer if md == "new" else (lambda pairs: list(pairs))
    try:
        refill(dev, e, arena, order)
    finally:
        cache_mod.by_layer = by_layer
    cache_mod.by_layer = by_layer


bw, _ = h2d_gbps(dev, arena.blob(0, 0).nbytes)
rng = np.random.default_rng(0)
for md in ("old", "new"):
    layout(md)
    warm((e,), lengths, rng, c.n_vocab)
for md in ("old", "new"):
    layout(md)
    k = e.plan.for_prompt(e.config, e.share, lengths[0])[2]
    lent = np.bincount([o[0] for o in e.cache.owner[e.cache.n_slots - k:]], minlength=c.n_layer)
    print(f"{md}: a {lengths[0]}-token prompt's loan of {k} slots takes residents of layers 0..{c.n_layer - 1}: {lent.tolist()}")
print(f"{path}: quarter cache {e.plan.cache_slots} slots (chunk {e.plan.chunk}); H2D {bw:.1f} GB/s; old = slots in the fill's order, new = by layer; {rounds} rounds, arms alternating; medians", flush=True)
for L in lengths:
    t = {"old": [], "new": []}; mb = {"old": [], "new": []}; same = True; rf = {"old": [], "new": []}
    loan = e.plan.for_prompt(e.config, e.share, L)[2]
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, L).tolist()
        outs = {}
        for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
            layout(md)
            ms, outs[md], after, got = timed_prompt(dev, e, p)
            t[md].append(ms); rf[md].append(after); mb[md].append(got)
        same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
    rr = np.array(t["old"]) / np.array(t["new"])
    print(f"  {L:5d} (loan {loan}): " + "  ".join(
        f"{md} {np.median(t[md]):6.2f} ms ({np.median(mb[md]):4.0f} MB, x{np.median(t[md]) / (np.median(mb[md]) / bw):.2f} floor, refill {np.median(rf[md]):.1f})"
        for md in ("old", "new"))
        + f"  old/new x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}, median {np.median(rr):.3f}); logits identical: {same}", flush=True)
