"""The prefill CPU share on the GPU engine (issue: STRATA_PREFILL_CPU_SHARE=auto|x|0): interleaved rounds of off /
fixed shares / auto at several prompt lengths, medians, the share chosen, experts the CPU took, gate decisions;
then a losing configuration (the pool cut to two workers) to show the gate caps the loss. STRATA_DBG_LINK_GBPS=x
runs it on an emulated slower PCIe (the copy stream held to x GB/s), the simulator column likewise. The rounds
measure the steady state (the gate's state persists across requests, SPEC §6); auto's first prompts from a fresh gate, its
exploration, are printed beside off before them. Before them and after each round each configuration's pool is
probed on the model's experts (bench/cpu_pool.py pool_probe: µs an expert at 1..8 tokens, a batch's fixed µs; the
lent machines' pools differ from lease to lease and drift within one); the probes' medians (merge_probes) are its
"pool_probe", which the simulator column uses (bench/share_sim.py), as it uses the host's layout a layer measured on
off prompts of each length before auto's first prompts ("layout_us", host_layout: the engine's Python differs lease
to lease too).

python bench/cpu_share.py --model X.gguf [--cache-frac 0.25] [--prompts 250,512,600,900,1000,2048] [--rounds 3]
                          [--shares 0.3,0.6] [--workers N] [--losing-workers 2] [--probe-reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def spread_line(res: dict, lengths, names) -> str:
    """Each setting's round-to-round spread (max / min - 1) per length: a difference of medians well inside it
    is noise (the lent machines' hosts vary from prompt to prompt; an emulated link hardly does)."""
    return "round-to-round spread (max/min - 1): " + "; ".join(
        f"{L}: " + " ".join(f"{n} {100 * (max(res[L][n]) / min(res[L][n]) - 1):.0f}%" for n in names)
        for L in lengths)


def paired(res: dict, L: int, name: str) -> float:
    """A setting's cost against off measured side by side: the median over rounds of its prompt time over the
    same round's off (they run back to back, so a host that drifts between rounds moves both; stop 21's one-worker
    pool flipped between two speeds, and the medians of the columns compared different rounds)."""
    return statistics.median(x / o for x, o in zip(res[L][name], res[L]["off"])) - 1


def paired_line(res: dict, lengths, names) -> str:
    return "side by side (median over rounds of each prompt over its round's off): " + "; ".join(
        f"{L}: " + " ".join(f"{n} {100 * paired(res, L, n):+.1f}%" for n in names if n != "off") for L in lengths)


def class_state(p) -> str:
    """A size class's auto policy after the rounds (policy.GatedShare): the meter's share and its unclamped balance,
    share arms the floor veto held back, the gate's verdict and its last ratios (shared / unshared ms a streamed
    expert; the verdict is their upper median < 1)."""
    bal = "none" if p.meter.balance is None else f"{p.meter.balance:.3f}"
    return (f"meter share {p.meter.share:.2f} (balance {bal}, {p.vetoed} share arms vetoed), gate "
            f"{'share' if p.gate.gate else 'do not share'} after {p.gate.layers} eligible layers (ratios "
            + " ".join(f"{r:.3f}" for r in p.gate.ratios) + ")")


def auto_against_off(logits: dict, cpu: dict, lengths: list[int], rounds: int) -> dict:
    """First-token KL of auto against off over the rounds' prompts (the same tokens for both; #8 item 3, the
    seeds: mean about 0.004, max 0.025), overall and over the prompts where auto's CPU took experts (elsewhere
    both computed the same experts the same way, and the logits are bit-identical), and top-1 agreement."""
    from strata.reference.agree import kl, top1_agreement

    keys = [(r, L) for r in range(rounds) for L in lengths]
    kls = [float(kl(logits[r, L, "off"], logits[r, L, "auto"])) for r, L in keys]
    took = [cpu[L]["auto"][r] > 0 for r, L in keys]
    shared = [k for k, t in zip(kls, took) if t]
    agree, ties = top1_agreement(np.stack([logits[r, L, "off"] for r, L in keys]),
                                 np.stack([logits[r, L, "auto"] for r, L in keys]))
    line = (f"first-token KL of auto against off over the same {len(kls)} prompts: mean {statistics.mean(kls):.2e}, "
            f"max {max(kls):.2e}; over the {len(shared)} where the CPU took experts: "
            + (f"mean {statistics.mean(shared):.2e}, max {max(shared):.2e}" if shared else "none")
            + f"; top-1 agreement {agree:.3f} ({ties} near-ties excluded); the seeds: mean about 0.004, max 0.025")
    return {"n": len(kls), "kl": kls, "cpu_took": took, "top1": agree, "near_ties": ties, "line": line}


LAYOUT_REPS = 3   # one prompt's 8 layers read 1.3 or 2.2 ms a layer at 250 tokens on one lease (stop 25)


def host_layout(eng, settle, off, pol, lengths, n_vocab) -> dict:
    """The host's µs a layer from a routing sync to the first launch group (engine Stats.layout_s), per prompt
    length: the median over LAYOUT_REPS off prompts of each one's mean a layer (bench/share_sim.py's layout_us). Its
    own prompts (a generator of their own), so the rounds' prompts are those of the runs before stop 25."""
    rng = np.random.default_rng(2)
    eng.use_share(off, pol)
    per = {L: [] for L in lengths}
    for _ in range(LAYOUT_REPS):
        for L in lengths:
            eng.reset()
            settle(eng)
            s0, n0 = eng.stats.layout_s, eng.stats.layouts
            eng.prefill(rng.integers(0, n_vocab, L).tolist())
            per[L].append((eng.stats.layout_s - s0) / max(1, eng.stats.layouts - n0) * 1e6)
    return {L: statistics.median(v) for L, v in per.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--prompts", default="250,512,600,900,1000,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shares", default="0.3,0.6")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--losing-workers", type=int, default=2, help="the second, losing configuration's pool "
                    "workers (0: skip it). Two, not one: the H200 host's lone worker flips between two speeds "
                    "(484-514 or 650-722 us an expert) on every CPU it is pinned to, so one probe misses the rounds")
    ap.add_argument("--json")
    ap.add_argument("--spin-us", type=float, help="the pool's spin before it dozes (ExpertPool's default: 2000)")
    ap.add_argument("--sim-machine", default="h200-host16", help="catalogue machine for the prediction column")
    ap.add_argument("--probe-reps", type=int, default=5, help="rounds of the pool probe (0: no probe; the simulator "
                    "column then prices the pool by the catalogue)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.cpu.pool import ExpertPool, default_workers
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding
    from strata.policy import Share, ShareMode, size_class_floor

    from cpu_pool import merge_probes, pool_probe, probe_line
    from prefill import h2d_gbps

    log = lambda s: print(s, file=sys.stderr)

    def settle(eng):
        """A timed prompt starts with the previous prompt's loan refilled: its own time alone (loans follow the
        prompt's length, so waiting for the refill would charge each setting its predecessor's loan)."""
        eng.dev.synchronize()
        eng.cache.poll()

    lengths = [int(x) for x in a.prompts.split(",")]
    m = models.load(a.model)
    c = m.cfg
    dev = CudaDevice()
    n_ctx = max(lengths) + 16
    budget = budget_holding(m, n_ctx, int(a.cache_frac * c.n_layer * c.n_expert))
    arena = Arena(m, dev, log=log)
    cfg = policy.from_process()
    rng = np.random.default_rng(0)
    settings = [("off", Share(ShareMode.OFF))] + [(f"{x}", Share(ShareMode.FIXED, float(x)))
                                                  for x in a.shares.split(",")] + [("auto", Share(ShareMode.AUTO, by_default=True))]
    report = {}
    # the engine thread wants a core and one more is left free, as in every stored run (stream-all had an issuer
    # thread until stop 19; the simulator's constants were fitted on these 14 workers of 16 cores)
    configs = [("pool", a.workers if a.workers is not None else max(1, default_workers() - 1))]
    if a.losing_workers > 0:   # the pool cut down: where sharing should lose and the gate cap the loss
        configs.append(("small pool", a.losing_workers))
    for label, workers in configs:
        pool = ExpertPool(workers=workers, spin_us=a.spin_us)
        eng = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, log=log, arena=arena, pool=pool)
        pols = {name: eng.use_share(sh) for name, sh in settings}
        for name, sh in settings:                                   # warm-up: kernels, Numba, pools
            eng.use_share(sh, pols[name])
            for L in lengths:
                eng.reset()
                eng.prefill(rng.integers(0, c.n_vocab, L).tolist())
        probes, h2ds = [], []

        def probe_pool():      # this lease's pool on the arena's blobs (no loan refill in flight), for the simulator
            if a.probe_reps > 0:
                settle(eng)
                probes.append(pool_probe(pool, arena.layers, arena.types, c.n_embd, c.n_ff_exp, reps=a.probe_reps))
                h2ds.append(h2d_gbps(dev, eng.plan.slot_bytes)[0])   # and its link (46.7-50.4 GB/s lease to lease)

        probe_pool()
        if probes:
            print(f"\n{label}: {probe_line(probes[0])}")
        # auto's first prompts, from a fresh meter and gate (its exploration, SPEC §6), beside off; then the
        # rounds measure the steady state: the gate's state persists across requests (SPEC §6)
        pols = {name: eng.use_share(sh) for name, sh in settings}
        layout = host_layout(eng, settle, dict(settings)["off"], pols["off"], lengths, c.n_vocab)
        first = {n: [] for n in ("off", "auto")}
        for L in lengths:
            ids = rng.integers(0, c.n_vocab, L).tolist()
            for name in ("off", "auto"):
                eng.use_share(dict(settings)[name], pols[name])
                eng.reset()
                settle(eng)
                t0 = time.perf_counter()
                eng.prefill(ids)
                first[name].append((time.perf_counter() - t0) * 1e3)
        print(f"\n{label}: auto's first prompts (exploring), ms: " + ", ".join(
            f"{L}: {a_:.1f} vs off {o:.1f} ({100 * (a_ / o - 1):+.1f}%)"
            for L, a_, o in zip(lengths, first["auto"], first["off"])))
        print(f"{label}: host layout (routing sync to first launch group, off, medians of {LAYOUT_REPS} prompts, for the "
              f"simulator), ms a layer: " + ", ".join(f"{L}: {us / 1e3:.2f}" for L, us in layout.items()))
        res = {L: {n: [] for n, _ in settings} for L in lengths}
        cpu = {L: {n: [] for n, _ in settings} for L in lengths}
        streamed = {L: {n: [] for n, _ in settings} for L in lengths}
        logits = {}                       # (round, length, off | auto) -> the next token's logits [V]
        # off and auto run side by side, the fixed shares after them: a slow fixed share between the two leaves
        # the machine in another state for one than for the other (stop 20, one worker: with the same work as
        # off, auto read -4.3% and +5.1% in that order, share_f_w1_stop20.log)
        order = settings[:1] + settings[-1:] + settings[1:-1]
        for r in range(a.rounds):
            for L in lengths:
                ids = rng.integers(0, c.n_vocab, L).tolist()
                # the order alternates by round, so no setting always follows the same one (a pool that
                # just ran a large share dozes into the next prompt)
                for name, sh in (order if r % 2 == 0 else order[::-1]):
                    eng.use_share(sh, pols[name])
                    eng.reset()
                    if name == "off" and L == max(lengths) and r == a.rounds - 1:   # the routing, for the sim
                        trace = [[] for _ in range(c.n_layer)]
                        eng.on_routing = lambda l, ids: trace[l].append(np.asarray(ids, np.int16))
                    n0, b0 = eng.cpu_block.stats["cpu_experts"], eng.stats.streamed_bytes
                    settle(eng)
                    t0 = time.perf_counter()
                    got = eng.prefill(ids)
                    res[L][name].append((time.perf_counter() - t0) * 1e3)
                    if name in ("off", "auto"):
                        logits[r, L, name] = np.asarray(got, np.float32)
                    eng.on_routing = None
                    cpu[L][name].append(eng.cpu_block.stats["cpu_experts"] - n0)
                    streamed[L][name].append((eng.stats.streamed_bytes - b0) / 1e6)
            probe_pool()                      # the pool's speed drifts through a run: one probe after each round
        probe = merge_probes(probes) if probes else None
        h2d = statistics.median(h2ds) if h2ds and not cfg.dbg_link_gbps else None
        if probe is not None:
            print(f"{label}: {probe_line(probe)}")
        if h2ds:
            print(f"{label}: link probe: one {eng.plan.slot_bytes / 2**20:.2f} MiB blob copied back to back, "
                  f"{statistics.median(h2ds):.1f} GB/s (median of {len(h2ds)} probes through the run, "
                  f"{min(h2ds):.1f}..{max(h2ds):.1f})")
        link = f", link held to {cfg.dbg_link_gbps:g} GB/s (STRATA_DBG_LINK_GBPS)" if cfg.dbg_link_gbps else ""
        print(f"\n{label}: {a.model} ({c.n_layer} layers x {c.n_expert} experts), {workers} pool workers{link}, "
              f"quarter cache {eng.plan.cache_slots} slots, chunk {eng.plan.chunk}; medians of {a.rounds} rounds, ms")
        print(f"{'tokens':>7} " + " ".join(f"{n:>16}" for n, _ in settings))
        tab = {}
        for L in lengths:
            off = statistics.median(res[L]["off"])
            cells, row = [], {}
            for n, _ in settings:
                med = statistics.median(res[L][n])
                row[n] = {"ms": med, "cpu_experts": statistics.median(cpu[L][n]), "vs_off": med / off - 1,
                          "vs_off_paired": paired(res, L, n), "streamed_mb": statistics.median(streamed[L][n])}
                cells.append(f"{med:8.1f} ({100 * (med / off - 1):+5.1f}%)" if n != "off" else f"{med:16.1f}")
            tab[L] = row
            print(f"{L:7d} " + " ".join(f"{x:>16}" for x in cells))
        print(spread_line(res, lengths, [n for n, _ in settings]))
        print(paired_line(res, lengths, [n for n, _ in settings]))
        agreement = auto_against_off(logits, cpu, lengths, a.rounds)
        print(f"{label}: {agreement['line']}")
        print("streamed MB per prompt (median): " + "; ".join(
            f"{L}: " + " ".join(f"{n} {tab[L][n]['streamed_mb']:.0f}" for n, _ in settings) for L in lengths))
        try:
            from sim.workload import TraceRouting
            from share_sim import (comparison_lines, layout_note, link_note, predict, probe_extremes, probe_note,
                                   range_line)

            ids = np.stack([np.concatenate(trace[l]) for l in range(c.n_layer)])          # [layers, T, K]
            if a.json:
                np.savez_compressed(f"{a.json}.{label.replace(' ', '_')}.routing.npz", ids=ids)
            routing = TraceRouting(ids.astype(np.int64))
            names = [n for n, _ in settings]
            pred = predict(m, eng.plan, lengths, names, workers, n_ctx, a.sim_machine, routing, cfg.dbg_link_gbps,
                           probe=probe, h2d_gbps=h2d, layout=layout)
            print(f"simulator ({a.sim_machine}, the routing of the {max(lengths)}-token prompt{probe_note(probe)}"
                  f"{link_note(h2d, cfg.dbg_link_gbps)}{layout_note(layout)}), ms: measured / predicted (error)")
            print("\n".join(comparison_lines(tab, pred, lengths, names)))
            ends = probe_extremes(probe)
            if ends:
                lo, hi = (predict(m, eng.plan, lengths, names, workers, n_ctx, a.sim_machine, routing,
                                  cfg.dbg_link_gbps, probe=p, h2d_gbps=h2d, layout=layout) for p in ends)
                print(range_line(tab, pred, lo, hi, lengths, names))
            for L in lengths:
                for n in names:
                    tab[L][n]["sim_ms"] = pred[(L, n)]
            if pred.get("auto_policy"):   # the simulated auto's view beside the engine's (printed below)
                print("simulated auto, per size class: " + "; ".join(
                    f"{size_class_floor(c)}+ tokens: {class_state(p)}" for c, p in sorted(pred["auto_policy"].items())))
        except ImportError as e:   # the prediction column needs simpy (the `sim` extra)
            print(f"simulator: no prediction ({e!r})")
        auto = pols["auto"]
        classes = {c: p for c, p in sorted(auto.by_class.items()) if p.gate.layers}
        print("auto, per size class (half-octave of tokens): " + "; ".join(
            f"{size_class_floor(c)}+ tokens: {class_state(p)}" for c, p in classes.items())
              + "; CPU experts per run (auto) " + ", ".join(f"{L}: {statistics.median(cpu[L]['auto']):.0f}"
                                                            for L in lengths))
        report[label] = {"workers": workers, "link_gbps": cfg.dbg_link_gbps, "table": tab,
                         "auto_classes": {str(c): {"share": p.meter.share, "gate": p.gate.gate,
                                                   "layers": p.gate.layers, "balance": p.meter.balance,
                                                   "vetoed": p.vetoed, "ratios": list(p.gate.ratios)}
                                          for c, p in classes.items()},
                         "first_prompts": {"lengths": lengths, **first}, "raw_ms": res, "raw_cpu": cpu,
                         "auto_against_off": {k: v for k, v in agreement.items() if k != "line"},
                         "plan": {"chunk": eng.plan.chunk, "cache_slots": eng.plan.cache_slots},
                         "layout_us": {str(L): us for L, us in layout.items()}}
        if probe is not None:
            report[label]["pool_probe"] = probe
        if h2ds:
            report[label]["h2d_probes_gbps"] = h2ds
            if h2d is not None:
                report[label]["h2d_probe_gbps"] = h2d
        pool.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
