"""Diagnostic: where a decode token's GPU time goes. The captured decode graph's body run uncaptured behind a held
compute stream (released once the step is enqueued, so the GPU runs it back to back), every kernel call timed by
CUDA events, summed per kernel per token; beside it the captured graph's time per token. Quarter cache (misses
read over PCIe) and all-resident. CUDA only.

python bench/decode_profile.py --model X.gguf [--tokens 32] [--cache-frac 0.25]
"""

from __future__ import annotations

import argparse
import collections
import mmap
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def timed_kernels(dev):
    """Wrap every public kernel of `dev.k` so each outermost call is bracketed by events on the compute stream;
    returns the list the (name, start, end) triples go to, and a function that unwraps them."""
    cp, s, calls, depth = dev.cp, dev.compute.s, [], [0]
    k = dev.k
    names = [n for n in dir(type(k)) if not n.startswith("_") and callable(getattr(k, n))]
    for name in names:
        fn = getattr(k, name)

        def wrapped(*a, _fn=fn, _name=name, **kw):
            if depth[0]:
                return _fn(*a, **kw)
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            depth[0] += 1
            try:
                return _fn(*a, **kw)
            finally:
                depth[0] -= 1
                e1.record(s)
                calls.append((_name, e0, e1))

        setattr(k, name, wrapped)
    return calls, lambda: [delattr(k, n) for n in names]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    a = ap.parse_args()
    import dataclasses

    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.device.base import Graph
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding

    log = lambda s: print(s, file=sys.stderr)
    m = models.load(a.model)
    c = m.cfg
    dev = CudaDevice()
    n_ctx = 64 + 4 * a.tokens + 8
    arena = Arena(m, dev, log=log)
    cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
    rng = np.random.default_rng(0)
    page = mmap.mmap(-1, mmap.PAGESIZE)                  # the go word, on a page of its own for the device to map
    go = np.frombuffer(page, np.int64)
    words = dev.map_words(go)
    print(f"# {' '.join(sys.argv)}")
    engines = [("quarter", budget_holding(m, n_ctx, int(a.cache_frac * c.n_layer * c.n_expert))), ("resident", None)]
    for label, budget in engines:
        eng = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, log=log, arena=arena)
        eng.prefill(rng.integers(0, c.n_vocab, 64).tolist())
        toks = rng.integers(0, c.n_vocab, 2 * a.tokens).tolist()
        for t in toks[:4]:                              # capture, warm-up
            eng.decode([t])
        dev.synchronize()
        t0 = time.perf_counter()
        for t in toks[4:4 + a.tokens]:
            eng.decode([t])
        dev.synchronize()
        graph_ms = (time.perf_counter() - t0) * 1e3 / a.tokens
        captured, eng.dgraph.graph = eng.dgraph.graph, Graph(eng.dgraph._body)   # replays = the body, uncaptured
        calls, unwrap = timed_kernels(dev)
        eng.decode([toks[-1]])                           # the wrappers' first calls
        dev.synchronize()
        calls.clear()
        n, t0, busy = a.tokens // 2, time.perf_counter(), 0.0
        for t in toks[a.tokens:a.tokens + n]:
            # the compute stream holds until the whole step is enqueued: each kernel's events then time the GPU's
            # work back to back, not the host's launch gaps (an uncaptured step is host-bound)
            go[0] = 0
            dev.wait_words(words, 0, 1, dev.compute)
            e0 = dev.event()
            e0.record(dev.compute)
            eng.dgraph.launch(int(t), eng.pos)
            e1 = dev.event()
            e1.record(dev.compute)
            go[0] = 1
            eng.dgraph.wait()
            busy += e0.elapsed_ms(e1)
            eng.pos += 1
        wall_ms = (time.perf_counter() - t0) * 1e3 / n
        per = collections.defaultdict(lambda: [0.0, 0])
        for name, e0, e1 in calls:
            per[name][0] += dev.cp.cuda.get_elapsed_time(e0, e1)
            per[name][1] += 1
        total = sum(v[0] for v in per.values()) / n
        hits = eng.stats.hits / max(1, eng.stats.lookups)
        print(f"\n{label}: captured graph {graph_ms:.3f} ms/token ({1e3 / graph_ms:.0f} tok/s); uncaptured step "
              f"{busy / n:.3f} ms/token on the GPU once enqueued ({wall_ms:.3f} wall), its kernels {total:.3f}; cache "
              f"hit rate {hits:.2f}")
        print(f"{'kernel':>22} {'ms/token':>9} {'share':>6} {'calls/token':>12} {'us/call':>8}")
        for name, (ms, cnt) in sorted(per.items(), key=lambda kv: -kv[1][0]):
            print(f"{name:>22} {ms / n:9.3f} {100 * ms / n / total:5.1f}% {cnt / n:12.1f} {1e3 * ms / cnt:8.1f}")
        unwrap()
        eng.dgraph.graph = captured
        del eng


if __name__ == "__main__":
    main()
