"""In one process: prompts on quarter-cache engines that differ only in MoeBlock's scheduling knobs, CUDA only (two or
more engines on one arena, bench/prefill.py's): arms alternating in a rotating order each round, medians, per-round
ratios against the first arm, logits compared bit for bit (the knobs move host work, not arithmetic).

Knobs (class attributes of strata.accel.moe_block.MoeBlock, set on one engine): rows_on_device (a prompt layer's
pairs laid out on the device, the sync downloading counts only; off: on the host from the downloaded ids). Stop 45
also ran guess_ahead here (the next layer's guess picked before the routing sync, its copies issued after the
combine: 0.988-0.997x, not kept; knobs_ab_q8_stop45.log).

python bench/knobs_ab.py MODEL.gguf 250,600,900,2048 ROUNDS ARM [ARM ...]
ARM: name:knob=0|1[,knob=0|1...], e.g. host:rows_on_device=0 device:rows_on_device=1"""
import sys
import time

import numpy as np

from prefill import quarter_engines, warm      # bench/prefill.py

KNOBS = ("rows_on_device",)
path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
specs = []
for a in sys.argv[4:]:
    name, _, kv = a.partition(":")
    knobs = {k: bool(int(v)) for k, v in (x.split("=") for x in kv.split(",") if x)}
    assert set(knobs) <= set(KNOBS), f"unknown knob in {a}: {KNOBS} only"
    specs.append((name, knobs))
assert len(specs) >= 2, "two arms at least"
dev, m, arena, engines = quarter_engines(path, len(specs))
arms = {}
for (name, knobs), e in zip(specs, engines):
    for k, v in knobs.items():
        setattr(e, k, v)
    arms[name] = e
names = list(arms)
rng = np.random.default_rng(0)
n_vocab = m.cfg.n_vocab
warm(engines, lengths, rng, n_vocab)
print(f"arms: {'; '.join(f'{n} {dict(k)}' for n, k in specs)}; quarter cache {engines[0].plan.cache_slots} slots, chunk "
      f"{engines[0].plan.chunk}; {rounds} rounds, order rotating; medians; ratio = {names[0]} / arm", flush=True)
for L in lengths:
    t = {n: [] for n in names}
    same = True
    for r in range(rounds):
        p = rng.integers(0, n_vocab, L).tolist()
        outs = {}
        for n in names[r % len(names):] + names[:r % len(names)]:
            e = arms[n]
            e.reset()
            dev.synchronize()
            t0 = time.perf_counter()
            outs[n] = e.prefill(p)
            t[n].append((time.perf_counter() - t0) * 1e3)
            dev.synchronize()
        same &= all(np.array_equal(outs[names[0]].view(np.uint32), o.view(np.uint32)) for o in outs.values())
    base = np.array(t[names[0]])
    cols = []
    for n in names:
        rr = base / np.array(t[n])
        cols.append(f"{n} {np.median(t[n]):7.2f} ms" + ("" if n == names[0] else
                    f" x{np.median(base) / np.median(t[n]):.3f} ({rr.min():.3f}-{rr.max():.3f}, median {np.median(rr):.3f})"))
    print(f"  {L:5d}: " + "  ".join(cols) + f"; logits identical: {same}", flush=True)
