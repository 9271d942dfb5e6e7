"""Diagnostic: where the prefill CPU share gains or loses, layer by layer. CUDA only.

python bench/share_layers.py --model X.gguf [--workers 2] [--prompts 250,512,900,1000] [--rounds 8]
                             [--warm 6] [--fixed 0.08] [--ctx 2064] [--lines gate_lines.log]

One engine, interleaved rounds (the order reversed every other round) of off, the fixed shares, auto whose meter
aims at SPEC §5's balance (share_policy(margin=0): the engine up to stop 23) and auto (today's: the meter's
margin). Per length: the prompts' wall ms (medians; side by side over the round's off); per
setting and layer, the MoE block's device time (events on the compute stream around GpuEngine.moe, the first
chunk's layers) and its parts: up to the routing sync's event (the previous shared layer's settle, the input's
copy to the host), from there to the combine (the gate's window less that copy: layout, experts, the wait for the
pool, its rows), the combine; then the CPU experts and the pool's ms. With STRATA_DBG_CPU_GATE=1 the meter and gate lines, tagged
with round, setting and length, go to --lines. Every setting runs --warm rounds first (SPEC §6: auto's state
persists across requests). --ctx is the plan's context, as bench/cpu_share.py's (2,048 + 16): the chunk follows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prompts", default="250,512,900,1000")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warm", type=int, default=6)
    ap.add_argument("--fixed", default="0.08", help="fixed shares to run beside off and the two autos")
    ap.add_argument("--ctx", type=int, default=2064, help="the plan's context (bench/cpu_share.py: 2,048 + 16)")
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--lines", help="file for the STRATA_DBG_CPU_GATE lines")
    a = ap.parse_args()
    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding
    from strata.policy import Share, ShareMode, share_policy

    lengths = [int(x) for x in a.prompts.split(",")]
    m = models.load(a.model)
    c = m.cfg
    dev = CudaDevice()
    budget = budget_holding(m, a.ctx, int(a.cache_frac * c.n_layer * c.n_expert))
    lines, tag = [], ["warm"]

    def log(s):
        if s.startswith("cpu "):
            lines.append(f"[{tag[0]}] {s}")
        else:
            print(s, file=sys.stderr)

    arena = Arena(m, dev, log=log)
    eng = GpuEngine(m, dev, n_ctx=a.ctx, vram_budget=budget, config=policy.from_process(), log=log, arena=arena,
                    pool=ExpertPool(workers=a.workers))
    eng.cpu_block.log = log
    auto = Share(ShareMode.AUTO, by_default=True)
    settings = ([("off", Share(ShareMode.OFF), None)]
                + [(x, Share(ShareMode.FIXED, float(x)), None) for x in a.fixed.split(",") if x]
                + [("auto-bal", auto, share_policy(auto, margin=0.0)),
                   ("auto", auto, share_policy(auto))])
    pols = {n: eng.use_share(sh, p) for n, sh, p in settings}
    ends, marks = [], []
    for n, pol in pols.items():          # each layer's end as the policy sees it: nstream, CPU experts, CPU ms
        def end_layer(end, _orig=pol.end_layer):
            ends.append(end)
            return _orig(end)
        pol.end_layer = end_layer
    block, sync_record, combine = eng.ops.moe, eng.sync_ev.record, eng.k.combine
    stamps: list = []     # the current block's events: at its start, at the routing sync, before the combine

    def stamp():
        ev = dev.event()
        ev.record(dev.compute)
        stamps.append(ev)

    def at_sync(stream):            # GpuEngine.moe records its routing-sync event once a block
        stamp()
        sync_record(stream)

    def before_combine(*args, **kw):
        stamp()
        combine(*args, **kw)

    def timed_moe(h, layer, ids, w, **kw):
        stamps.clear()
        stamp()
        out = block(h, layer, ids, w, **kw)
        stamp()
        marks.append((layer, *stamps))   # (layer, start, sync, combine, end)
        return out
    eng.ops.moe, eng.sync_ev.record, eng.k.combine = timed_moe, at_sync, before_combine

    def prompt(name, share, ids):
        eng.use_share(share, pols[name])
        eng.reset()
        dev.synchronize()
        eng.cache.poll()           # the previous prompt's loan refilled (bench/cpu_share.py's settle)
        marks.clear()
        ends.clear()
        p0, p1 = dev.event(), dev.event()
        p0.record(dev.compute)
        t0 = time.perf_counter()
        eng.prefill(ids)
        ms = (time.perf_counter() - t0) * 1e3
        p1.record(dev.compute)
        dev.synchronize()
        moe = {}
        for layer, e0, es, ec, e1 in marks:              # the first chunk's: whole block, then its three parts
            moe.setdefault(layer, (e0.elapsed_ms(e1), e0.elapsed_ms(es), es.elapsed_ms(ec), ec.elapsed_ms(e1)))
        # the device's prompt outside the MoE blocks: before the first, between blocks (attention, norms, router,
        # and any wait for the host), after the last (head); every chunk's blocks
        gaps = [marks[i][4].elapsed_ms(marks[i + 1][1]) for i in range(len(marks) - 1)]
        outside = (p0.elapsed_ms(marks[0][1]), sum(gaps), marks[-1][4].elapsed_ms(p1), p0.elapsed_ms(p1),
                   sum(m[1].elapsed_ms(m[4]) for m in marks), gaps)
        return ms, moe, list(ends), outside

    rng = np.random.default_rng(1)
    for _ in range(a.warm):
        for L in lengths:
            ids = rng.integers(0, c.n_vocab, L).tolist()
            for name, share, _ in settings:
                prompt(name, share, ids)
    res = {(L, n): [] for L in lengths for n, _, _ in settings}
    for r in range(a.rounds):
        for L in lengths:
            ids = rng.integers(0, c.n_vocab, L).tolist()
            for name, share, _ in (settings if r % 2 == 0 else settings[::-1]):
                tag[0] = f"r{r} {name} {L}"
                res[(L, name)].append(prompt(name, share, ids))
    print(f"{a.model}: {a.workers} pool workers, chunk {eng.plan.chunk}, quarter cache {eng.plan.cache_slots} slots; "
          f"{a.warm} warm-up rounds, medians of {a.rounds}")
    med = statistics.median
    for L in lengths:
        off = [x[0] for x in res[(L, "off")]]
        print(f"\n{L} tokens, prompt ms: " + ", ".join(
            f"{n} {med([x[0] for x in res[(L, n)]]):.1f}"
            + ("" if n == "off" else f" ({100 * med([x[0] / o - 1 for x, o in zip(res[(L, n)], off)]):+.1f}% sbs)")
            for n, _, _ in settings))
        print("  device ms (medians over rounds of each round's sums): prompt = before the first MoE block + MoE "
              "blocks + between blocks + after the last; the gaps between blocks, each")
        for n, _, _ in settings:
            o = [x[3] for x in res[(L, n)]]
            gl = [med([g[5][i] for g in o]) for i in range(min(len(g[5]) for g in o))]
            print(f"  {n:>8} prompt {med([g[3] for g in o]):6.1f} = before {med([g[0] for g in o]):5.2f} + MoE "
                  f"{med([g[4] for g in o]):6.1f} + between {med([g[1] for g in o]):5.2f} + after "
                  f"{med([g[2] for g in o]):5.2f}; gaps " + " ".join(f"{x:.2f}" for x in gl))
        for n, _, _ in settings:
            rows = res[(L, n)]
            layers = sorted(rows[0][1])
            for part, what in enumerate(("MoE ms ", "to sync", "sync-cb", "combine")):
                v = [med([r[1][l][part] for r in rows]) for l in layers]
                print(f"  {n:>8} {what} " + " ".join(f"{x:6.2f}" for x in v) + f"  sum {sum(v):.1f}")
            if n == "off":
                continue
            by = {}
            for r in rows:
                for e in r[2]:
                    by.setdefault(e.layer, []).append(e)
            for what, key, fmt in (("CPU exp", "n_cpu", "6.1f"), ("CPU ms ", "cpu_ms", "6.2f")):
                vals = [statistics.mean(getattr(e, key) for e in by[l]) if l in by else 0.0 for l in layers]
                print(f"  {n:>8} {what} " + " ".join(f"{v:{fmt}}" for v in vals))
    for n in ("auto-bal", "auto"):
        for cl, g in sorted(pols[n].by_class.items()):
            own = "" if not g.layer_meters else ", layers' shares " + " ".join(
                f"{l}:{lm.share:.3f}" for l, lm in sorted(g.layer_meters.items()))
            bal = "none" if g.meter.balance is None else f"{g.meter.balance:.3f}"
            print(f"{n} class {cl}: meter share {g.meter.share:.3f} (balance {bal}, {g.vetoed} vetoed), gate "
                  f"{'share' if g.gate.gate else 'do not share'} (ratios "
                  + " ".join(f"{x:.3f}" for x in g.gate.ratios) + f"){own}")
    if a.lines:
        with open(a.lines, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
