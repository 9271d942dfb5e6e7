"""Prompt and decode speed of the GPU engine with a quarter-size expert cache, beside the PCIe floor and the
all-resident engine (accel GPU issue, item 6).

python bench/prefill.py --model X.gguf [--cache-frac 0.25] [--prompts 250,600,900,2048,8192] [--rounds 3]
                        [--decode 32] [--json out.json] [--few-rows 16[,0,...]] [--groups-ab 16] [--ctx 8200]
                        [--profile-tokens 2048]

Per round, for each prompt length, the quarter-cache engine and the all-resident engine run one after the other
(interleaved, the order alternating by round); medians over rounds. --groups-ab G adds a third engine beside them:
the quarter cache planned with a G-expert weight scratch only (memplan.PROMPT_GROUPS otherwise picks one per plan),
a side-by-side A/B. Several --few-rows values (moe.FEW_ROWS: experts of at most that many rows run from their
blobs, 0 = every expert through the fp16 scratch) run interleaved in each round, one table row each. The PCIe floor
of a run = bytes it streamed ÷ pinned H2D bandwidth measured in this run at the model's blob size. The decode
bound = missed expert bytes per token ÷ host memory bandwidth measured in this run.
The context (--ctx, default 8,200 tokens: the longest default prompt's) sizes KV and so the quarter cache's prompt
plan (chunk, ring, loan): it is fixed, not taken from --prompts, so a run of a few prompt lengths plans as the full
run does (stop 27: --prompts 250,600,900 had planned 768-token chunks against the full run's 1,280).
The quarter cache holds experts 0.. of every layer alike (no routing profile: SPEC §7's uniform fill) unless
--profile-tokens N fills it hottest-first from the routing of one N-token prompt, as a user's --expert-profile
would (the resident engine routes it; the timed prompts are others of the same random kind).
Each length is run twice before the rounds: its first prompt runs the dense segments eagerly, its second captures
them (the quarter cache's is timed: capture ms), and the timed rounds replay them (prompt_graph.py; keys by
64-row bucket, so a user's prompts of nearby lengths share them; STRATA_PROMPT_GRAPH=0 turns them off).
A prompt's time runs from an idle device to its logits; the refill of the cache slots it lent (SPEC §9), which
runs after it returns, is timed apart (refill ms).
Decode runs both ways on each engine, interleaved: the captured decode graph (misses read by the GPU over PCIe)
and the per-layer path (a routing sync per layer, misses shared with the CPU pool).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def h2d_gbps(dev, nbytes: int, reps: int = 64, bursts: int = 3) -> tuple[float, list[float]]:
    """Pinned H2D GB/s at `nbytes` copies: the fastest of `bursts` timed bursts of `reps` copies, after one untimed
    copy, and every burst's reading. The fastest gives the lowest PCIe floor (the strictest ratio): stop 34's first
    run timed one burst with no warm-up copy and read 14.9 GB/s on a link that streamed the prompts at ~50
    (bench/results/h200/prefill_q8_stop34.log)."""
    host = dev.pinned(nbytes)
    buf = dev.empty((nbytes,), np.uint8)
    dev.h2d(buf, host, dev.copy)
    dev.copy.synchronize()
    got = []
    for _ in range(bursts):
        got.append(nbytes / dev.h2d_ms(buf, host, reps) / 1e6)
    return max(got), got


def warm(engines, lengths, rng, n_vocab: int, rounds: int = 2) -> None:
    """Each engine through one random prompt of each length, `rounds` times (kernels compiled, memory pools grown,
    the route memory seeded): the in-process A/B scripts' warm-up."""
    for _ in range(rounds):
        for L in lengths:
            p = rng.integers(0, n_vocab, L).tolist()
            for e in engines:
                e.reset()
                e.prefill(p)


def quarter_engines(path: str, n: int, n_ctx: int = 8200, frac: float = 0.25):
    """The in-process A/B scripts' set-up: n engines with this bench's quarter cache (or a cache of `frac` of the
    experts) on one arena, the CPU share off -> (device, model, arena, engines). CUDA only."""
    import dataclasses

    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding

    dev = CudaDevice()
    m = models.load(path)
    c = m.cfg
    budget = budget_holding(m, n_ctx, int(frac * c.n_layer * c.n_expert))
    arena = Arena(m, dev)
    cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
    return dev, m, arena, [GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, arena=arena)
                           for _ in range(n)]


def refill(dev, e, arena, order) -> None:
    """Empty e's expert cache and fill it again from `order` (cache.fill: its first usable pairs, slots by layer),
    once nothing is in flight: the fill A/B scripts' arms."""
    dev.synchronize()
    ch = e.cache
    ch.poll()
    assert ch.lent == 0 and not ch._pending
    ch.slot_of[:] = -1
    ch.owner = [None] * ch.n_slots
    ch.fill(order, arena)


def timed_prompt(dev, e, tokens) -> tuple[float, np.ndarray, float, float]:
    """One prompt from an idle device: (ms until prefill returns, its logits, ms more until the device is idle
    (the refill of the lent slots), MB streamed)."""
    b0 = e.stats.streamed_bytes
    e.reset()
    dev.synchronize()
    t0 = time.perf_counter()
    out = e.prefill(tokens)
    t1 = time.perf_counter()
    dev.synchronize()
    return (t1 - t0) * 1e3, out, (time.perf_counter() - t1) * 1e3, (e.stats.streamed_bytes - b0) / 1e6


def host_gbps(threads: int) -> float:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from hw_probe import host_bandwidth

    return host_bandwidth(threads)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--prompts", default="250,600,900,2048,8192")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument("--device", choices=("cuda", "host"), default="cuda", help="host: a smoke test on the CPU twin")
    ap.add_argument("--pool-workers", type=int, help="CPU pool workers for decode misses (default: cores - 1)")
    ap.add_argument("--few-rows", default=None, help="expert row thresholds to compare (default: moe.FEW_ROWS)")
    ap.add_argument("--groups-ab", type=int, help="also time the quarter cache planned with this weight scratch only")
    ap.add_argument("--profile-tokens", type=int, default=0,
                    help="fill the quarter cache hottest-first from the routing of one prompt of this many tokens (the "
                    "resident engine's; SPEC §7's profile, as generate's --expert-profile) instead of uniformly")
    ap.add_argument("--ctx", type=int, default=8200, help="context tokens (KV, and so the prompt plan); raised to what "
                    "the longest prompt and the decode rounds need")
    a = ap.parse_args()
    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.device.base import get_device
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding, scratch_group
    from strata.accel.moe import FEW_ROWS

    fews = [int(x) for x in a.few_rows.split(",")] if a.few_rows else [FEW_ROWS]
    lengths = [int(x) for x in a.prompts.split(",")]
    m = models.load(a.model)
    c = m.cfg
    dev = get_device(a.device)
    log = lambda s: print(s, file=sys.stderr)
    n_ctx = max(a.ctx, max(lengths) + 8, 64 + 2 * (a.rounds + 1) * a.decode + 8)
    budget = budget_holding(m, n_ctx, int(a.cache_frac * c.n_layer * c.n_expert))
    arena = Arena(m, dev, log=log)
    import dataclasses

    from strata.accel.cpu.pool import ExpertPool, available_cores, default_workers

    pool = ExpertPool(workers=a.pool_workers if a.pool_workers is not None else max(1, default_workers() - 1))
    # the prompt path without the CPU share (bench/cpu_share.py measures that); decode misses go to the pool
    cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
    er = GpuEngine(m, dev, n_ctx=n_ctx, config=cfg, log=log, arena=arena, few_rows=fews[0])
    order = None
    if a.profile_tokens:                      # count a prompt's (layer, expert) routing, as --dump-routing would
        from collections import Counter

        from strata.routing_trace import hottest_first

        counts = Counter()
        er.on_routing = lambda layer, ids: counts.update((layer, int(e)) for e in ids.ravel())
        er.prefill(np.random.default_rng(1).integers(0, c.n_vocab, a.profile_tokens).tolist())
        er.on_routing = None
        er.reset()
        order = hottest_first(counts, c.n_layer, c.n_expert)
        log(f"bench: quarter cache filled hottest-first from a {a.profile_tokens}-token prompt's routing")
    eq = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, log=log, arena=arena, pool=pool,
                   few_rows=fews[0], profile_order=order)
    engines = [("quarter", eq), ("resident", er)]
    if a.groups_ab:
        eg = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, log=log, arena=arena, few_rows=fews[0],
                       prompt_groups=(a.groups_ab,))
        engines.append(("groups_ab", eg))
    slot = eq.plan.slot_bytes
    bw, bursts = h2d_gbps(dev, slot)
    hbw = host_gbps(available_cores())
    log(f"bench: pinned H2D at {slot / 2**20:.2f} MiB copies {bw:.1f} GB/s (bursts "
        f"{', '.join(f'{b:.1f}' for b in bursts)}; the engine's own probe at load {eq.h2d_gbps:.1f}); host read "
        f"{hbw:.1f} GB/s")
    rng = np.random.default_rng(0)
    cells = [(L, f) for L in lengths for f in fews]
    res = {cell: {"quarter_ms": [], "resident_ms": [], "floor_ms": [], "streamed_mb": [], "sync_ms": [],
                  "refill_ms": [], "groups_ab_ms": [], "groups_ab_floor_ms": []} for cell in cells}
    # warm-up at every length, twice: kernels compiled, memory pools grown, then each length's dense segments
    # captured (prompt_graph.py: a shape's first prompt runs them eagerly, its second captures, later ones replay;
    # the quarter cache's capturing prompt is timed: "capture ms")
    capture_ms = {cell: [] for cell in cells}
    walks = {}
    for warm in range(2):
        for name, eng in engines:
            for cell in cells:
                eng.reset()
                eng.few_rows = cell[1]        # read as each prompt chunk starts
                ids = rng.integers(0, c.n_vocab, cell[0]).tolist()
                dev.synchronize()
                t0 = time.perf_counter()
                eng.prefill(ids)
                if warm and name == "quarter":
                    capture_ms[cell].append((time.perf_counter() - t0) * 1e3)
    for r in range(a.rounds):
        for cell in cells:
            L, f = cell
            if f == fews[0]:
                ids = rng.integers(0, c.n_vocab, L).tolist()      # every threshold runs the same prompt
            for name, eng in (engines if r % 2 == 0 else engines[::-1]):   # alternate who goes first
                eng.reset()
                eng.few_rows = f
                b0, w0, n0 = eng.stats.streamed_bytes, eng.stats.sync_wait_s, len(eng.stats.chunks)
                # the last prompt's lent cache slots are refilled after it returns (SPEC §9): that copy lands
                # before the clock starts, and each prompt's own refill is timed apart (refill ms)
                dev.synchronize()
                t0 = time.perf_counter()
                eng.prefill(ids)
                t1 = time.perf_counter()
                dev.synchronize()
                res[cell][f"{name}_ms"].append((t1 - t0) * 1e3)
                if name == "quarter":
                    res[cell]["refill_ms"].append((time.perf_counter() - t1) * 1e3)
                    nb = eng.stats.streamed_bytes - b0
                    res[cell]["streamed_mb"].append(nb / 1e6)
                    res[cell]["floor_ms"].append(nb / (bw * 1e9) * 1e3)
                    res[cell]["sync_ms"].append((eng.stats.sync_wait_s - w0) * 1e3)
                    walks[cell] = "+".join(sorted({w for _, w, _ in eng.stats.chunks[n0:]}))
                elif name == "groups_ab":
                    res[cell]["groups_ab_floor_ms"].append((eng.stats.streamed_bytes - b0) / (bw * 1e9) * 1e3)
            x = res[cell]
            log(f"round {r} {L} tokens, few rows {f}: quarter {x['quarter_ms'][-1]:.0f} ms (host blocked in routing "
                f"syncs {x['sync_ms'][-1]:.0f} ms), resident {x['resident_ms'][-1]:.0f} ms, "
                f"floor {x['floor_ms'][-1]:.0f} ms")
    eq.few_rows = er.few_rows = fews[0]
    dec = {}
    for name, eng in (("quarter", eq), ("resident", er)):
        # decode both ways on one engine, interleaved per round: the captured graph (misses read over PCIe) and
        # the per-layer path (routing syncs, misses shared with the CPU pool); the graph is set aside for the latter
        graph = eng.dgraph
        eng.reset()
        eng.prefill(rng.integers(0, c.n_vocab, 64).tolist())
        t = int(rng.integers(0, c.n_vocab))
        runs: dict = {"graph": [], "layer": []}
        for r in range(a.rounds + 1):                         # round 0 warms both (capture, kernels, pool)
            for mode in ("graph", "layer"):
                if mode == "graph" and graph is None:
                    continue
                eng.dgraph = graph if mode == "graph" else None
                s0 = (eng.stats.decode_tokens, eng.stats.decode_s, eng.stats.lookups, eng.stats.hits)
                for _ in range(a.decode):        # teacher-forced random tokens: greedy loops repeat one routing,
                    eng.decode([t])                 # which the adaptive tier then caches whole (0 misses)
                    t = int(rng.integers(0, c.n_vocab))
                n = eng.stats.decode_tokens - s0[0]
                misses = (eng.stats.lookups - s0[2]) - (eng.stats.hits - s0[3])
                if r:
                    runs[mode].append((n / (eng.stats.decode_s - s0[1]), misses * slot / n))
        eng.dgraph = graph
        for mode, rs in runs.items():
            if not rs:
                continue
            miss_bytes = statistics.median(b for _, b in rs)
            frac = 0.0 if mode == "graph" else (eng.cpu_block.decode_frac if eng.cpu_block else 0.0)
            dec[f"{name} {mode}"] = {"tok_s": statistics.median(x for x, _ in rs), "runs": [x for x, _ in rs],
                                     "missed_mb_per_token": miss_bytes / 1e6, "cpu_frac": frac,
                                     "bound_tok_s": hbw * 1e9 / miss_bytes if miss_bytes else None}
    print(f"model {a.model}: {c.n_layer} layers x {c.n_expert} experts, blob {slot / 2**20:.2f} MiB; "
          f"quarter cache {eq.plan.cache_slots} slots (chunk {eq.plan.chunk}, groups of {eq.plan.group}, ring "
          f"{eq.plan.ring}, loan {eq.plan.loan_slots}, "
          f"{f'hottest-first from a {a.profile_tokens}-token prompt' if a.profile_tokens else 'uniform fill'}); "
          f"H2D {bw:.1f} GB/s, host {hbw:.1f} GB/s; "
          f"context {n_ctx} tokens; medians of {a.rounds} rounds")
    print(f"{'tokens':>7} {'few':>4} {'quarter ms':>11} {'PCIe floor':>11} {'x floor':>8} {'resident ms':>12} "
          f"{'of bound':>8} {'tok/s q':>8} {'streamed MB':>12} {'loan':>5} {'group':>5} {'refill ms':>9} "
          f"{'capture ms':>10}  walk")
    table = {}
    for cell in cells:
        L, fr = cell
        q = statistics.median(res[cell]["quarter_ms"])
        f = statistics.median(res[cell]["floor_ms"])
        rr = statistics.median(res[cell]["resident_ms"])
        _, _, loan, grp = eq.plan.for_prompt(eq.config, eq.share, L)   # what this prompt borrows, its scratch
        grp = scratch_group(grp)                                        # (DECODE_SCRATCH: decode's)
        major = eq._layer_major(L)
        if major is not None:                                            # layer by layer (policy.layer_major)
            loan, grp = major[1], eq.dbufs.group                        # decode's weight scratch
        # #5's 8K bar: the speed against the lower of the all-resident and the PCIe-bound speeds
        bound = max(f, rr) / q
        key = L if len(fews) == 1 else f"{L}/{fr}"
        table[key] = {"quarter_ms": q, "floor_ms": f, "resident_ms": rr, "few_rows": fr,
                      "streamed_mb": statistics.median(res[cell]["streamed_mb"]), "loan_slots": loan, "group": grp,
                      "refill_ms": statistics.median(res[cell]["refill_ms"]), "capture_ms": capture_ms[cell][0],
                      "of_bound": bound, "walk": walks.get(cell, "")}
        print(f"{L:7d} {fr:4d} {q:11.1f} {f:11.1f} {q / f if f else float('nan'):8.2f} {rr:12.1f} {bound:8.2f} "
              f"{L / q * 1e3:8.0f} {table[key]['streamed_mb']:12.0f} {loan:5d} {grp:5d} "
              f"{table[key]['refill_ms']:9.1f} {capture_ms[cell][0]:10.1f}  {walks.get(cell, '')}")
    pg = eq.pgraphs
    if pg is not None:
        print(f"prompt graphs (quarter cache): {pg.captures} segments captured in {pg.capture_s * 1e3:.1f} ms, "
              f"{pg.replays} replayed, {pg.eager} run eagerly")
        gg = eq.pre_graphs
        print(f"pre-sync group graphs (quarter cache): {gg.captures} captured, {gg.replays} replayed, {gg.eager} run "
              f"eagerly")
    else:
        print("prompt graphs: off (STRATA_PROMPT_GRAPH=0, or a head size the graphs do not take)")
    print(f"guessed walks (quarter cache): {eq.stats.guessed} experts streamed before their layer's routing sync, "
          f"{eq.stats.guessed_unrouted} of them unrouted, {eq.stats.guessed_missed} routed ones missed"
          + ("" if eq.guess else " (STRATA_PROMPT_GUESS=0)"))
    if a.groups_ab:
        def ab(cell):
            g, gf = (statistics.median(res[cell][k]) for k in ("groups_ab_ms", "groups_ab_floor_ms"))
            q, qf = (statistics.median(res[cell][k]) for k in ("quarter_ms", "floor_ms"))
            return f"{cell[0]}: {g:.1f} (x{g / gf:.2f}) vs {q:.1f} (x{q / qf:.2f})"

        print(f"A/B, same rounds: the quarter cache planned with {a.groups_ab}-expert groups only (chunk "
              f"{eg.plan.chunk}, ring {eg.plan.ring}) vs the plan's choice ({eq.plan.group}-expert groups, chunk "
              f"{eq.plan.chunk}), ms (x its own floor): " + "; ".join(ab(cell) for cell in cells))
    for name, d in dec.items():
        b = d["bound_tok_s"]
        print(f"decode {name}: {d['tok_s']:.1f} tok/s; missed {d['missed_mb_per_token']:.0f} MB/token "
              f"(CPU takes {100 * d['cpu_frac']:.0f}% of misses; medians of {len(d['runs'])} runs of {a.decode} tokens)"
              + (f"; host-bandwidth bound {b:.1f} tok/s ({d['tok_s'] / b:.2f} of it)" if b else ""))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"model": a.model, "profile_tokens": a.profile_tokens, "h2d_gbps": bw, "host_gbps": hbw,
                       "prefill": table, "decode": dec,
                       "raw": {f"{L}/{f}": v for (L, f), v in res.items()}}, fh, indent=1)


if __name__ == "__main__":
    main()
