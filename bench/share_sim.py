"""The simulator's prediction for bench/cpu_share.py's runs (the CPU-share issue, item 5), in the run or later
from its JSON: the same GGUF's expert sizes and types (sim.models.from_gguf_metadata), the engine's own cache
residency during a prompt (uniform fill minus the lent tail, strata.accel.cache), the routing the engine saw
(a trace) or, without one, the simulator's Zipf routing, and the catalogue machine. Fixed shares and off are
one prompt each; auto is simulated over every length twice with one session, the second pass reported, as the
bench measures auto's steady state (SPEC §6: the gate persists across requests).

python bench/share_sim.py --model X.gguf --json share.json [--trace routing.npz | --trace LABEL=routing.npz ...]
                          [--machine h200-host16] [--engine stop17 | --routed-group 8] [--no-probe]

A trace is an .npz with `ids` [layers, tokens, k] (int): a prompt of L tokens routes as its first L tokens; with
LABEL= it routes that configuration of the JSON only ("small_pool"), each with its own (bench/cpu_share.py records
one a configuration since stop 19). A configuration's "pool_probe" (bench/cpu_share.py since the probe: its own
pool timed on the model's experts) prices the CPU experts in place of the catalogue's pool model, as the header says;
its "layout_us" (since stop 25: the host's time a layer from the routing sync to the first launch group, measured
in off prompts of its own before the rounds) prices that host work in place of the catalogue's group_us line, as the
lent hosts' Python differs lease to lease.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys

import numpy as np


def engine_slots(cfg, cache_slots: int, by_layer: bool = True) -> list:
    """The GPU engine's uniform fill, slot by slot: its first cache_slots pairs, by layer (strata.accel.cache.by_layer,
    stop 39) or in the fill's order (every stored engine before)."""
    from strata.accel import cache

    kept = cache.uniform_order(cfg.n_layer, cfg.n_expert)[:cache_slots]
    return cache.by_layer(kept) if by_layer else kept


def engine_residency(cfg, cache_slots: int, loan_slots: int, by_layer: bool = True) -> tuple:
    """Which (layer, expert) pairs the GPU engine holds during a prompt: those of its first cache_slots - loan_slots
    slots (the tail slots are lent to the prompt buffers, SPEC §9; a prompt borrows policy.prompt_loan's slots, not
    the plan's largest loan)."""
    res = np.zeros((cfg.n_layer, cfg.n_expert), bool)
    for l, e in engine_slots(cfg, cache_slots, by_layer)[:max(0, cache_slots - loan_slots)]:
        res[l, e] = True
    return tuple(tuple(r) for r in res.tolist())


def engine_refill_copies(cfg, cache_slots: int, loan_slots: int, by_layer: bool = True) -> int:
    """The copy calls of the GPU engine's refill of a prompt's loan (the lent tail's pairs, sorted: one a run,
    strata.accel.cache.refill_runs): the simulator's Run.refill_copies."""
    from strata.accel.cache import refill_runs

    lent = engine_slots(cfg, cache_slots, by_layer)[max(0, cache_slots - loan_slots):cache_slots]
    return len(refill_runs(sorted(lent)))


def sim_model_of(m):
    from sim.models import from_gguf_metadata

    return from_gguf_metadata(m.metadata, {n: m.qtype(n) for n in m.tensors.names}, m.path)


# what one copy of the engine's emulated link (STRATA_DBG_LINK_GBPS) costs beyond n / GB/s on the H200: the
# stamp and hold kernels' launches and gaps on the copy stream; bench/fit_share_sim.py stage 2, fitted to the off
# column of bench/results/h200/share_f_link12_stop15.json (12 GB/s) alone (stop 18's simulator; stop 17's gave 6.9,
# stop 15's 11.1).
EMULATED_COPY_US = 7.0


# the engines that ran stored runs, as the simulator's flags (sim.engine.Run): "stop17" is every
# bench/results/h200/share_*_stop1[4-6] run's, before d616513 (the embedding rows dequantised on the host) and
# b1162ae (routed-only groups of 8 in 16 slots, a CUDA event after every copy run, and the copy stream running dry
# ahead of a group: prefill_timeline_stop18.log, 250 tokens, 29.8 ms of 118 idle with the host late, ~22 ms inside
# the MoE blocks over 280 groups; 50 us a group fitted by a scan of 30/50/80/110 over every stored run's cells,
# share_sim_checks_stop19.log); "stop19": share_f_losing_stop19's, routed-only groups of 16 in 32 slots (64 since
# stop 19's routed_ring_ab_stop19.log); "stop20": share_f_losing_stop20's (cc5f0ed); none of them had auto's floor
# veto (67e7045); "stop21": the runs of stop 21 (5b306f6) and of stop 20 after the veto; every one of them issued a
# stream-all chunk's first copies before the embedding's upload (a7c891c: embed_ab_stop21.log) and refilled a
# prompt's loan through CuPy views with an event a slot (d7467e0: rows_ab_stop21.log); "stop32": the runs of stops 25
# to 32 (the engines before those above are also these): a copy a lent slot in the loan's refill, before ac18e97
# (stop 33, ab_refill_stop33.log); "stop34": that stop's runs (169bccd and after: a refused chunk counts the waste);
# every one of them streamed no expert before its layer's routing sync, each walk from ring slot 0 (guessed walks,
# stop 35: policy.guess); None: today's
NO_GUESS = dict(guess=False, layer_major=False)   # before stop 35: no guessed walks (sim.engine.Run.guess), and
#                                                   before stop 37 no layer-major prompts (Run.layer_major)
SLOT_REFILL = dict(slot_refill=True, **NO_GUESS)   # before ac18e97: a copy a lent slot (Run.refill_copies None);
#                                                    and no guess, as every stored engine
OLD_COPIES = dict(embed_behind_prefetch=True, refill_factor=1.85, **SLOT_REFILL)   # before a7c891c and d7467e0
# before auto's meter per layer (78d1d29, stop 23), before a new size class's meter started from the last one's
# (015a381, stop 23), before the meter's margin (c0a2aac, stop 24), before its start from a load probe (stop 24)
# every one of those runs was replayed with the catalogue's layout line of stop 21 from then on
# (share_sim_check_stop2[1-3].log), refitted in stop 25 to the layouts the engine measures: their replays keep it
OLD_LAYOUT = dict(calib={"group_us": 700.0, "group_us_per_pair": 0.08, "group_us_per_expert": 0.0})
UNPRIMED = dict(prime=False, **OLD_LAYOUT)
BALANCE = dict(margin=0.0, **UNPRIMED)
UNSEEDED = dict(class_seed=False, **BALANCE)
ONE_METER = dict(layer_meters=False, **UNSEEDED)
ENGINES = {"stop17": dict(routed_group=8, host_embed=True, event_per_copy=True, link_gap_us=50.0, veto=False,
                         **OLD_COPIES, **ONE_METER),
           "stop19": dict(routed_slots=32, veto=False, **OLD_COPIES, **ONE_METER),
           "stop20": dict(veto=False, **OLD_COPIES, **ONE_METER),
           "stop21": dict(OLD_COPIES, **ONE_METER),
           "stop22": dict(ONE_METER, **SLOT_REFILL),
           "stop23": dict(UNSEEDED, **SLOT_REFILL),   # stop 23's runs at 52e907c
           "stop23b": dict(BALANCE, **SLOT_REFILL),   # stop 23's runs at 015a381 and after (seeded classes)
           "stop24": dict(UNPRIMED, **SLOT_REFILL),   # stop 24's runs at 113965e (the meter's margin)
           "stop32": dict(SLOT_REFILL),
           "stop33": dict(NO_GUESS),   # every stored engine's walk choice probes (StreamWaste(counted=False)) ...
           "stop34": dict(NO_GUESS, counted=True)}   # ... but stop 34's (169bccd: a refused chunk counts the waste)


@contextlib.contextmanager
def routed_walk(group: int | None, slots: int | None = None):
    """The routed-only walk of the engine that ran a stored run: launch groups of `group` experts in `slots` ring
    slots, twice the group unless given (8 in 16 before b1162ae, stop 18: every bench/results/h200/share_*_stop1[4-6]
    run; 16 in 32 until stop 19); None: today's (policy.stream.ROUTED_ONLY_GROUP, ROUTED_ONLY_SLOTS). The engine's
    plan (memplan.for_prompt) and the simulator read them."""
    from unittest import mock

    from strata.policy import stream

    if group is None and slots is None:
        yield
        return
    group = group or stream.ROUTED_ONLY_GROUP
    with mock.patch.object(stream, "ROUTED_ONLY_GROUP", group), \
            mock.patch.object(stream, "ROUTED_ONLY_SLOTS", slots or 2 * group):
        yield


def predict(m, plan, lengths, names, workers: int, n_ctx: int, machine_name: str, routing=None,
            link_gbps: float | None = None, calib: dict | None = None,
            link_copy_us: float = EMULATED_COPY_US, host_issue_us: float | None = None,
            cpu: dict | None = None, routed_group: int | None = None, engine: str | None = None,
            probe: dict | None = None, h2d_gbps: float | None = None, layout: dict | None = None) -> dict:
    """{(L, setting): predicted prompt ms} for settings 'off', fixed shares ('0.3') and 'auto' (and 'auto_share', the
    simulated meter's share after auto's session, 'auto_policy' its GatedShare per size class). link_gbps: the
    bench ran with STRATA_DBG_LINK_GBPS, so every copy took n / link_gbps (the engine holds the copy stream from
    the copy's start: its real time, being shorter, disappears inside). cpu: fields of the catalogue CPU to
    replace (bench/fit_share_sim.py fits turbo_ghz). routed_group: the run's routed-only walk (routed_walk).
    engine: the run's engine (ENGINES: its routed-only group unless routed_group names one, and Run's flags).
    probe: the configuration's "pool_probe" (bench/cpu_share.py): its pool's measured cost in place of the modelled
    one (sim.costs.PoolProbe); None: the catalogue's pool. h2d_gbps: the run's link probe (bench/cpu_share.py, one
    blob copied back to back): the catalogue's link scaled to it (LinkSpec.probed); ignored on an emulated link.
    layout: the run's host layout a layer, {tokens: µs} (bench/cpu_share.py host_layout), in
    place of the catalogue's group_us line (sim.costs.Costs.group_us)."""
    flags = dict(ENGINES[engine]) if engine else {}
    calib = {**flags.pop("calib", {}), **(calib or {})}
    group = flags.pop("routed_group", None)
    slots = flags.pop("routed_slots", None)
    group = routed_group or group
    slot_refill = flags.pop("slot_refill", False)
    counted = flags.pop("counted", engine is None)   # the walk choice's (policy.StreamWaste)
    with routed_walk(group, slots):
        if layout:
            flags["layout"] = tuple((int(t), float(us)) for t, us in layout.items())
        # every stored engine lent the fill's own tail of slots; today's lends the last layers' residents
        return _predict(m, plan, lengths, names, workers, n_ctx, machine_name, routing, link_gbps, calib, link_copy_us,
                        host_issue_us, cpu, flags, probe, h2d_gbps, slot_refill, counted=counted,
                        by_layer=engine is None)


def _predict(m, plan, lengths, names, workers, n_ctx, machine_name, routing, link_gbps, calib, link_copy_us,
             host_issue_us, cpu, flags, probe, h2d_gbps, slot_refill=False, counted=True,
             by_layer=True) -> dict:
    from sim.costs import PoolProbe
    from sim.engine import Run, Session, prefill
    from sim.hardware import machine
    from sim.whatif import setting_config
    from strata.accel import memplan
    from strata.policy import StreamWaste, share_policy
    from strata.policy.guess import RouteMemory

    sm = sim_model_of(m)
    # the pool's threads: its workers alone (since stop 15 the share submits its batch and the engine thread takes no
    # tiles: CpuBlock.launch -> ExpertPool.submit)
    mach = dataclasses.replace(machine(machine_name), pool_workers=min(workers, machine(machine_name).cpu.threads))
    if link_gbps:
        mach = dataclasses.replace(mach, link=dataclasses.replace(mach.link, h2d_gbps=link_gbps, h2d_curve=(),
                                                                  h2d_latency_us=link_copy_us,
                                                                  h2d_queued_us=link_copy_us))
    elif h2d_gbps:
        mach = dataclasses.replace(mach, link=mach.link.probed(h2d_gbps, plan.slot_bytes))
    if calib:
        mach = dataclasses.replace(mach, calib={**mach.calib, **calib})
    if host_issue_us is not None:
        mach = dataclasses.replace(mach, host_issue_us=host_issue_us)
    if cpu:
        mach = dataclasses.replace(mach, cpu=dataclasses.replace(mach.cpu, **cpu))
    cfgs = {n: setting_config("default" if n == "auto" else n) for n in names}
    if probe is not None:
        if probe["workers"] != workers:
            raise ValueError(f"a probe of {probe['workers']} pool workers for a run of {workers}")
        flags = {**flags, "probe": PoolProbe.from_json(probe)}

    out = {}
    waste = StreamWaste(counted)   # GpuEngine.stream_waste, kept across the bench's prompts and settings
    routes = RouteMemory(sm.n_layer, sm.n_expert)   # GpuEngine.routes (the guessed walks' memory), likewise

    def session_of(run):   # a fresh policy of the run's engine, the walk choice's and the guesses' state shared
        return Session(share_policy(run.share, run.gated, veto=run.veto, layer_meters=run.layer_meters,
                                    class_seed=run.class_seed, margin=run.margin), waste=waste, routes=routes)

    def run_of(n, L):   # with what the engine lends that prompt (policy.prompt_loan through its plan), its group
        loan, group = plan.for_prompt(cfgs[n], cfgs[n].share(True), L)[2:]
        group = memplan.scratch_group(group)            # a routed-only prompt's is decode's
        copies = None if slot_refill else engine_refill_copies(m.cfg, plan.cache_slots, loan, by_layer)
        return Run(mach, sm, L, qualifies=True, ctx=n_ctx, cache_slots=plan.cache_slots, cfg=cfgs[n],
                   routing=routing, residency=engine_residency(m.cfg, plan.cache_slots, loan, by_layer), loan=loan,
                   refill_copies=copies, plan=(plan.chunk, plan.ring, group), **flags)   # chunks, ring, scratch

    # the bench's warm-up (every setting at every length) runs before the rounds: the walk choice has measured a
    # stream-all chunk by then, and a wasteful one sends the rounds' chunks down the routed-only walk (each counting
    # the waste again; the stored engines': one in STREAM_ALL_PROBE re-measures). off at every length stands for it.
    cfgs.setdefault("off", setting_config("off"))
    for L in lengths:
        warm = run_of("off", L)
        prefill(warm, session_of(warm))
    for n in names:
        session = None
        for _ in range(2 if n == "auto" else 1):
            for L in lengths:
                # the bench times each prompt with the previous prompt's loan refilled (bench/cpu_share.py)
                run = run_of(n, L)
                if session is None or n != "auto":   # one engine ran every setting: one walk choice state
                    session = session_of(run)
                out[(L, n)] = prefill(run, session).prompt_ms
        if n == "auto":
            out["auto_share"] = {c: p.meter.share for c, p in session.policy.by_class.items() if p.gate.layers}
            out["auto_policy"] = {c: p for c, p in session.policy.by_class.items() if p.gate.layers}
    return out


def link_note(h2d_gbps: float | None, emulated: float | None) -> str:
    return f", link probed: {h2d_gbps:.1f} GB/s a blob" if h2d_gbps and not emulated else ""


def layout_note(layout: dict | None) -> str:
    """The header's word on the host: nothing where the catalogue's line priced the layout."""
    if not layout:
        return ""
    us = layout.values()
    return f", host layout measured: {min(us) / 1e3:.1f}..{max(us) / 1e3:.1f} ms a layer"


def probe_note(probe: dict | None) -> str:
    """The header's word on the pool: nothing where the catalogue's model priced it."""
    if probe is None:
        return ""
    us = probe["us_per_expert"]
    return (f", pool probed: {'/'.join(probe['types'])} {us[0]:.0f}..{us[-1]:.0f} us an expert at 1..{len(us)} "
            f"tokens + {probe['batch_us']:.0f} us a batch")


def probe_extremes(probe: dict | None) -> tuple[dict, dict] | None:
    """The run's fastest and slowest single probe (bench/cpu_pool.py merge_probes keeps each one's us an expert) as
    probes of their own: the pool as it was at its quickest and slowest through the run; None for fewer than two."""
    each = (probe or {}).get("each") or []
    if len(each) < 2:
        return None
    return tuple({**probe, "us_per_expert": list(min(each, key=sum) if fast else max(each, key=sum))}
                 for fast in (True, False))


def range_line(table: dict, pred: dict, lo: dict, hi: dict, lengths, names, tol: float = 0.15) -> str:
    """The cells beyond `tol` with the predictions of the run's fastest and slowest probe beside them: a miss inside
    that range is the pool's drift through the run, which no single price of it follows (stop 21's one-worker
    pool flipped between two speeds, share_f_w1_stop21.log)."""
    out = [f"{L} {n}: measured {table[L][n]['ms']:.0f}, predicted {pred[(L, n)]:.0f} "
           f"[{lo[(L, n)]:.0f}..{hi[(L, n)]:.0f}]" for L in lengths for n in names
           if abs(pred[(L, n)] / table[L][n]["ms"] - 1) > tol]
    return (f"beyond {100 * tol:.0f}%, with the run's fastest and slowest pool probe: " + "; ".join(out)) if out \
        else f"every prompt time within {100 * tol:.0f}%"


def comparison_lines(table: dict, pred: dict, lengths, names) -> list[str]:
    lines = [f"{'tokens':>7} " + " ".join(f"{n:>20}" for n in names)]
    for L in lengths:
        cells = []
        for n in names:
            ms, p = table[L][n]["ms"], pred[(L, n)]
            cells.append(f"{ms:6.0f}/{p:6.0f} ({100 * (p / ms - 1):+5.0f}%)")
        lines.append(f"{L:7d} " + " ".join(f"{x:>20}" for x in cells))
    errs = [abs(pred[(L, n)] / table[L][n]["ms"] - 1) for L in lengths for n in names]
    lines.append(f"largest |predicted / measured - 1|: {100 * max(errs):.0f}%")
    return lines


def _scores_scratch(cfg, cap: int, n_ctx: int) -> int:
    """buffers.attn_scratch_bytes before stop 17 (59a2900): the blocked attention's score buffers for every head
    size (stop 17 keeps the scores of head sizes 64 and 128 in registers and gives those 64 MiB to the chunk)."""
    from strata.accel.buffers import ATTN_SCRATCH_TARGET

    per_q = cfg.n_head * (6 * n_ctx + 6 * cfg.head_dim) + 1024
    return max(1, min(cap, 128, ATTN_SCRATCH_TARGET // per_q)) * per_q + 4096


def _bench_plan(m, lengths, stored: dict | None = None):
    """bench/cpu_share.py's quarter-cache plan, recomputed (it depends on the model and the budget formula).
    stored: the run's own {"chunk", "cache_slots"}; when today's plan is not the one the run names, the earlier
    layouts are tried, newest first: before fda6281 (stop 18) the step temporaries priced at the 8,192-token
    ceiling, before stop 17 also the attention's score buffers for every head size, before stop 16 also a
    16-expert weight scratch only (memplan.PROMPT_GROUPS since)."""
    from unittest import mock

    from strata.accel import memplan
    from strata.policy.plan import GRID

    c = m.cfg
    n_ctx = max(lengths) + 16

    def plan(groups, scratch=None, ceiling_temps=False):
        if scratch is None and not ceiling_temps:
            budget = memplan.budget_holding(m, n_ctx, int(0.25 * c.n_layer * c.n_expert))
            return memplan.plan_memory(m, 1 << 42, n_ctx=n_ctx, vram_budget=budget, groups=groups)

        def old(fn):   # the budget, the plan and each prompt's loan (for_prompt, later) on the old layout
            def call(*a, **kw):
                with contextlib.ExitStack() as stack:
                    if scratch is not None:
                        stack.enter_context(mock.patch.object(memplan, "attn_scratch_bytes", scratch))
                    if ceiling_temps:   # before fda6281 the step temporaries were priced at the 8,192 ceiling
                        top = max(GRID, min(8192, n_ctx) // GRID * GRID)
                        stack.enter_context(mock.patch.object(memplan, "temp_bytes",
                                                              lambda cfg, t, f=memplan.temp_bytes: f(cfg, top)))
                    return fn(*a, **kw)
            return call

        p = old(plan)(groups)
        if p.request is None:
            return p
        req = lambda r: dataclasses.replace(r, buffer_bytes=old(r.buffer_bytes))  # noqa: E731
        return dataclasses.replace(p, request=req(p.request), larger=tuple((g, req(r)) for g, r in p.larger))

    if stored is None:
        return plan(memplan.PROMPT_GROUPS), n_ctx
    tried = []
    for groups, scratch, ceiling_temps in ((memplan.PROMPT_GROUPS, None, False), (memplan.PROMPT_GROUPS, None, True),
                                           (memplan.PROMPT_GROUPS, _scores_scratch, True),
                                           ((16,), _scores_scratch, True)):
        p = plan(groups, scratch, ceiling_temps)
        if (p.chunk, p.cache_slots) == (stored["chunk"], stored["cache_slots"]):
            # every stored run is older than stop 38: its routed-only prompts carved a weight scratch of their own
            # beside a ring of at most the plan's (rows=None keeps for_prompt to that)
            return (p if p.request is None else dataclasses.replace(p, rows=None)), n_ctx
        tried.append((p.chunk, p.cache_slots))
    raise ValueError(f"the recomputed plans {tried} (chunk, cache slots) are not the bench's {stored}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True, help="bench/cpu_share.py --json output")
    ap.add_argument("--trace", action="append", help=".npz routing trace (ids [layers, tokens, k]) of this model, "
                    "or LABEL=.npz for one configuration (repeat)")
    ap.add_argument("--machine", default="h200-host16")
    ap.add_argument("--routed-group", type=int, help="the run's routed-only launch group (8 before b1162ae, stop 18; "
                    "default: today's)")
    ap.add_argument("--engine", choices=sorted(ENGINES), help="the run's engine where not today's (stop17: every "
                    "share_*_stop1[4-6] run's; stop19: share_f_losing_stop19's; stop20: share_f_losing_stop20's; "
                    "stop22, stop23: those stops' runs; stop32: the runs of stops 25 to 32, a copy a lent slot in the "
                    "loan's refill; stop33: that stop's, whose refused chunks counted no waste; stop34: that "
                    "stop's, before guessed walks)")
    ap.add_argument("--no-probe", action="store_true", help="price the pool, the link and the host's layout by the "
                    "catalogue even where the JSON holds the run's pool_probe, h2d_probe_gbps and layout_us")
    a = ap.parse_args()
    sys.path.insert(0, __file__.rsplit("/", 2)[0])
    from sim.workload import TraceRouting
    from strata import models

    m = models.load(a.model)
    report = json.load(open(a.json))
    traces = {}
    for spec in a.trace or []:
        label, _, path = spec.rpartition("=")
        with np.load(path) as z:
            traces[label.replace("_", " ")] = TraceRouting(np.asarray(z["ids"], np.int64))
    for label, rep in report.items():
        routing = traces.get(label, traces.get(""))
        table = {int(L): row for L, row in rep["table"].items()}
        lengths = sorted(table)
        names = list(next(iter(table.values())))
        plan, n_ctx = _bench_plan(m, lengths, rep.get("plan"))
        link = rep.get("link_gbps")
        probe = None if a.no_probe else rep.get("pool_probe")
        h2d = None if a.no_probe else rep.get("h2d_probe_gbps")
        layout = None if a.no_probe else rep.get("layout_us")
        pred = predict(m, plan, lengths, names, rep["workers"], n_ctx, a.machine, routing, link,
                       routed_group=a.routed_group, engine=a.engine, probe=probe, h2d_gbps=h2d, layout=layout)
        print(f"{label}: {rep['workers']} pool workers{f', link held to {link:g} GB/s' if link else ''}; "
              f"simulator ({a.machine}, "
              f"{'traced' if routing is not None else 'Zipf'} routing{probe_note(probe)}{link_note(h2d, link)}"
              f"{layout_note(layout)}), ms: measured / predicted (error)")
        print("\n".join(comparison_lines(table, pred, lengths, names)))
        ends = probe_extremes(probe)
        if ends:
            lo, hi = (predict(m, plan, lengths, names, rep["workers"], n_ctx, a.machine, routing, link,
                              routed_group=a.routed_group, engine=a.engine, probe=p, h2d_gbps=h2d, layout=layout)
                      for p in ends)
            print(range_line(table, pred, lo, hi, lengths, names))


if __name__ == "__main__":
    main()
