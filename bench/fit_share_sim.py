"""Fit the simulator's H200 constants to bench/cpu_share.py runs, and show how well every column then agrees.

python bench/fit_share_sim.py --model f8.gguf --fit RUN.json:TRACE.npz [--fit ...] [--check RUN.json:TRACE.npz ...]
                            [--pool cpu_pool.json] [--routed-group 8 | --engine stop17] [--jobs 2] [--maxfev N]

Stage 1 fits the CPU pool's cost model (sim/costs.py: cycles a weight to unpack an i-quant, cycles a weight a
token or, with --pool, the measured cost by token count; where the --fit runs differ in pool workers, the CPU's
clock with one core busy, sim/hardware.py CPU.turbo_ghz), fixed costs (on a machine with the original's MMQ
experts the GPU's per expert, gpu_expert_us; with this engine's, whose GPU ops are modelled by op, the layer's time
with the link idle that no other term holds, group_us + group_us_per_pair a (token, k) pair) and the host's slowdown
while the pool runs (host_issue_factor) to the off and fixed-share columns of the --fit runs (repeats of one
setting, fitted together so that no one run's noise sets the constants): the
engine's own pool at the share's token counts (1..8), with the DMA beside it; the host's time per streamed expert
is the catalogue's, measured. The bench times each prompt with the previous prompt's loan refilled, and each
prompt borrows its own loan (share_sim.predict: the same residency). Stage 2 fits, for each --check run held to
an emulated link (STRATA_DBG_LINK_GBPS), the per-copy cost of that emulation to its off
column alone. Every other column (the fit runs' auto; the checks' shares and auto) is a prediction. A run is
RUN.json[@label]:TRACE.npz[:engine=NAME][:model=M.gguf], the label one of the JSON's configurations ("small_pool"; the
first if absent), the trace that configuration's routing (bench/cpu_share.py records one a configuration since
stop 19), the engine the one that ran it (bench/share_sim.py ENGINES: stop17 for the share_*_stop1[4-6] runs, stop19
for share_f_losing_stop19; --engine's, else today's, if absent) and the model its GGUF (--model's if absent), so runs
of different engines and models fit together. A --fit run held to an emulated link is simulated with
share_sim.EMULATED_COPY_US a copy (stage 2 fits it for the checks only). Prints the constants, the tables and each
run's cells within 15%; the catalogue (sim/data/catalogue.json) carries the stage-1 constants with this command as
source.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys

import numpy as np
from scipy.optimize import OptimizeResult, minimize, minimize_scalar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from share_sim import ENGINES, EMULATED_COPY_US, _bench_plan, comparison_lines, predict  # noqa: E402


def token_curves(pool_json: str) -> dict:
    """cost(t) / cost(1), t = 1..8, per type family, from bench/cpu_pool.py's expert rows at its largest thread
    count (phased pool); token counts it did not run are interpolated linearly."""
    from sim.models import family

    rows = json.load(open(pool_json))["experts"]
    top = max(r["threads"] for r in rows)
    out = {}
    for name in sorted({r["type"] for r in rows}):
        us = {r["tokens"]: 1e6 / r["experts_per_s"] for r in rows
              if r["type"] == name and r["threads"] == top and not r.get("pipeline")}
        if 1 not in us or len(us) < 2:
            continue
        ts = sorted(us)
        out[family(name)] = tuple(round(float(np.interp(t, ts, [us[k] for k in ts]) / us[1]), 3) for t in range(1, 9))
    return out


def thread_lines(pool_json: str, cpu) -> str:
    """bench/cpu_pool.py's speed a thread by thread count (phased pool, every thread computing) against the
    clock the CPU model gives that many busy cores, both relative to the largest count: a check of the turbo."""
    rows = [r for r in json.load(open(pool_json))["experts"] if not r.get("pipeline")]
    top = max(r["threads"] for r in rows)
    out = []
    for name in sorted({r["type"] for r in rows}):
        for t in sorted({r["tokens"] for r in rows if r["type"] == name}):
            rate = {r["threads"]: r["experts_per_s"] / r["threads"] for r in rows
                    if r["type"] == name and r["tokens"] == t}
            out.append(f"  {name} {t} tok: " + ", ".join(
                f"{n} thr x{rate[n] / rate[top]:.2f}/{cpu.clock_at(n) / cpu.clock_at(top):.2f}" for n in sorted(rate)))
    return (f"speed a thread against {top} threads, measured ({pool_json}) / the model's clock:\n"
            + "\n".join(out))


def _load(m, spec: str, engine: str | None = None, models: dict | None = None):
    """A run of bench/cpu_share.py: RUN.json[@label]:TRACE.npz[:engine=NAME][:model=M.gguf] (module docstring);
    m and engine: the model and engine where the spec names none; models: the loaded models by path (a cache)."""
    from sim.workload import TraceRouting
    from strata import models as strata_models

    path, trace, *opts = spec.split(":")
    for opt in opts:
        key, _, value = opt.partition("=")
        if key == "engine":
            engine = value or None
        elif key == "model":
            if models is None:
                models = {}
            if value not in models:
                models[value] = strata_models.load(value)
            m = models[value]
        else:
            raise ValueError(f"{spec}: unknown option {opt!r} (engine=NAME, model=M.gguf)")
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"{spec}: engine {engine!r} is not one of share_sim.ENGINES {sorted(ENGINES)}")
    path, _, label = path.partition("@")
    reps = json.load(open(path))
    rep = reps[label.replace("_", " ")] if label else next(iter(reps.values()))
    table = {int(L): row for L, row in rep["table"].items()}
    lengths = sorted(table)
    names = list(next(iter(table.values())))
    plan, n_ctx = _bench_plan(m, lengths, rep.get("plan"))
    with np.load(trace) as z:
        routing = TraceRouting(np.asarray(z["ids"], np.int64))
    return dict(table=table, lengths=lengths, names=names, plan=plan, n_ctx=n_ctx, routing=routing,
                workers=rep["workers"], link=rep.get("link_gbps"), path=path + (f"@{label}" if label else ""),
                auto_share={int(c): v["share"] for c, v in rep.get("auto_classes", {}).items()},
                m=m, engine=engine)


def _pred(m, run, machine, calib, copy_us=0.0, cpu=None, names=None):   # (copy_us: a run on an emulated link)
    return predict(run.get("m", m), run["plan"], run["lengths"], names or run["names"], run["workers"], run["n_ctx"],
                   machine, run["routing"], run["link"], calib, copy_us, cpu=cpu, routed_group=_STATE.get("routed"),
                   engine=run.get("engine"))


def _within(run, pred, limit: int = 15) -> tuple[int, int]:
    """(cells within limit %, cells) of every column, by the integer percent comparison_lines prints."""
    errs = [100 * (pred[(L, n)] / run["table"][L][n]["ms"] - 1) for L in run["lengths"] for n in run["names"]]
    return sum(abs(float(f"{e:.0f}")) <= limit for e in errs), len(errs)


def _fitted(run) -> list[str]:
    """The columns stage 1 fits: off and the fixed shares (auto is a prediction)."""
    return [n for n in run["names"] if n != "auto"]


_STATE: dict = {}   # the model, the --fit runs and --routed-group, for _pred and the forked workers of --jobs


def _fit_errs(args) -> list[float]:
    i, machine, calib, cpu = args
    m, run = _STATE["m"], _STATE["fits"][i]
    copy_us = EMULATED_COPY_US if run["link"] else 0.0
    return _err(run, _pred(m, run, machine, calib, copy_us, cpu=cpu, names=_fitted(run)), _fitted(run))


def _err(run, pred, cols):
    return [np.log(pred[(L, n)] / run["table"][L][n]["ms"]) for L in run["lengths"] for n in cols]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--fit", action="append", required=True,
                    help="RUN.json:TRACE.npz of bench/cpu_share.py on the real link (repeat for repeats)")
    ap.add_argument("--check", action="append", default=[], help="more runs (an emulated link: its copy cost "
                    "is fitted to its off column)")
    ap.add_argument("--machine", default="h200-host16")
    ap.add_argument("--pool", help="bench/cpu_pool.py --json at 1..8 tokens on this machine: the CPU's cost by "
                    "token count (else the linear unpack + mac x tokens model, its mac fitted too)")
    ap.add_argument("--routed-group", type=int, help="the runs' routed-only launch group (share_sim.routed_walk: 8 "
                    "before b1162ae, stop 18; default: today's)")
    ap.add_argument("--engine", choices=sorted(ENGINES), help="the engine of every run whose spec names none "
                    "(share_sim.ENGINES; default: today's)")
    ap.add_argument("--jobs", type=int, default=1, help="processes for stage 1's runs (the result is the same)")
    ap.add_argument("--maxfev", type=int, help="stage 1's evaluations at most (default 55 a fitted constant beyond "
                    "the first; 0: none, the catalogue's constants)")
    a = ap.parse_args()
    from sim.calibration import CALIB
    from strata.policy import size_class_floor
    from sim.hardware import machine
    from strata import models

    m = models.load(a.model)
    loaded = {a.model: m}
    _STATE["routed"] = a.routed_group
    base = machine(a.machine).calib
    fits = [_load(m, spec, a.engine, loaded) for spec in a.fit]
    cpu0 = machine(a.machine).cpu
    # a pool of one worker beside pools of many tells its clock with one core busy from the all-core one
    turbo = len({f["workers"] for f in fits}) > 1

    curves = token_curves(a.pool) if a.pool else {}
    if curves:
        print(f"token curves from {a.pool}: " + "; ".join(f"{k} {v}" for k, v in curves.items()))

    # the fixed costs fitted beside the CPU's constants: the original's GPU overhead per expert; for this engine's
    # experts (their GPU time modelled by op from the op logs, sim/costs.py) the layer's time with the link idle that
    # no other term holds (the host's layout after the routing sync, launch gaps outside the MoE block), a fixed part
    # and one per (token, k) pair, started where prefill_timeline_stop15.log puts them (0.35-0.8 ms from a MoE
    # block's entry to its first copy at 2,000-6,000 pairs)
    mmq = CALIB.over(base).gpu_experts == "mmq"
    fixed = {"gpu_expert_us": CALIB.gpu_expert_us} if mmq else {"group_us": 300.0, "group_us_per_pair": 0.1}

    def calib_of(x):
        x = list(np.exp(x))
        per = dict(base.get("cpu_cycles_per_weight", {}))
        per["iq"] = x.pop(0)
        mac = base["cpu_cycles_per_mac"] if curves else x.pop(0)
        out = {"cpu_cycles_per_weight": per, "cpu_cycles_per_mac": mac, "cpu_token_curve": curves}
        out |= {f: x.pop(0) for f in fixed}
        return out | {"host_issue_factor": x.pop(0)}

    def cpu_of(x):   # the last parameter, when fitted: the one-core clock, at least the all-core one
        return {"turbo_ghz": max(float(np.exp(x[-1])), cpu0.clock_ghz)} if turbo else None

    def split(x):
        return calib_of(x[:-1] if turbo else x), cpu_of(x)

    _STATE.update(m=m, fits=fits)
    import sim.engine  # noqa: F401 (before the fork: every worker runs the code the main process runs)

    sys.stdout.flush()   # a forked worker would print what is buffered again
    workers = multiprocessing.get_context("fork").Pool(a.jobs) if a.jobs > 1 else None

    def loss(x):
        c, cpu = split(x)
        jobs = [(i, a.machine, c, cpu) for i in range(len(fits))]
        errs = sum((workers.map(_fit_errs, jobs) if workers else map(_fit_errs, jobs)), [])
        return float(np.mean(np.square(errs)))

    # the fit works in logs. The fixed cost is fitted beside the CPU's constants: with each prompt borrowing only
    # its own loan, more experts stay resident and the off column turned on it (-10..-15% at the catalogue's
    # 12.76 us an expert, stop 15). The pool's cost per job stays the catalogue's: no column moves with it.
    x0 = ([base["cpu_cycles_per_weight"]["iq"]] + ([] if curves else [base["cpu_cycles_per_mac"]])
          + [base.get(f, v) for f, v in fixed.items()] + [base.get("host_issue_factor", 1.87)]
          + ([cpu0.turbo_ghz or 1.3 * cpu0.clock_ghz] if turbo else []))
    if a.maxfev == 0:   # no fit: the catalogue's constants, their tables and counts
        res = OptimizeResult(x=np.log(x0), fun=loss(np.log(x0)), nfev=1)
    else:
        res = minimize(loss, np.log(x0), method="Nelder-Mead",
                       options=dict(xatol=0.01, fatol=1e-5, maxfev=a.maxfev or 55 * (len(x0) - 1)))
    if workers:
        workers.close()
    calib, cpu = split(res.x)
    preds = [_pred(m, f, a.machine, calib, EMULATED_COPY_US if f["link"] else 0.0, cpu=cpu) for f in fits]
    runs = ", ".join(f"{f['path']} ({f['workers']}w{', ' + f['engine'] if f['engine'] else ''})" for f in fits)
    print(f"stage 1 (the CPU pool, from the off and fixed-share columns of {runs}): iq "
          f"{calib['cpu_cycles_per_weight']['iq']:.3f} cycles a weight"
          + ("" if curves else f", {calib['cpu_cycles_per_mac']:.4f} a weight a token")
          + (f"; the GPU's {calib['gpu_expert_us']:.2f} us an expert beyond its roofline" if mmq else
             f"; the layer's time outside the modelled ops {calib['group_us']:.0f} us + "
             f"{calib['group_us_per_pair']:.3f} us a (token, k) pair")
          + "; host time per streamed "
          f"expert x{calib['host_issue_factor']:.2f} "
          f"while the pool runs"
          + (f"; the CPU's clock {cpu['turbo_ghz']:.2f} GHz with one core busy ({cpu0.clock_ghz:g} with all "
             f"{cpu0.cores}): x{cpu['turbo_ghz'] / cpu0.clock_ghz:.2f}" if turbo else "")
          + f"; loss {res.fun:.5f} after {res.nfev} evaluations"
          + "; the meter's share per size class, simulated against the engine's (first run): "
          + ", ".join(f"{size_class_floor(c)}+ tokens {s:.2f}/{fits[0]['auto_share'].get(c, float('nan')):.2f}"
                      for c, s in sorted(preds[0]["auto_share"].items())))
    if turbo and a.pool:
        print(thread_lines(a.pool, dataclasses.replace(cpu0, **cpu)))
    counts = []
    for f, pred in zip(fits, preds):
        print(f"{f['path']}:")
        print("\n".join(comparison_lines(f["table"], pred, f["lengths"], f["names"])))
        counts.append((f, _within(f, pred)))
    for spec in a.check:
        run = _load(m, spec, a.engine, loaded)
        copy_us = 0.0
        if run["link"]:
            one = minimize_scalar(lambda c: float(np.mean(np.square(_err(run, _pred(m, run, a.machine, calib, c, cpu,
                                                                                    ["off"]), ["off"])))),
                                  bounds=(0.0, 200.0), method="bounded", options=dict(xatol=0.5))
            copy_us = float(one.x)
            print(f"\nstage 2 ({run['path']}, link held to {run['link']:g} GB/s): {copy_us:.1f} us a copy, "
                  f"from its off column")
        else:
            print(f"\ncheck ({run['path']}, {run['workers']} pool workers):")
        pred = _pred(m, run, a.machine, calib, copy_us, cpu)
        print("\n".join(comparison_lines(run["table"], pred, run["lengths"], run["names"])))
        counts.append((run, _within(run, pred)))
    print("\ncells (prompt x column) within 15%:")
    for run, (k, n) in counts:
        print(f"  {run['path']:60s} {run['workers']:2d}w  {k}/{n}")
    print(f"  all: {sum(k for _, (k, _n) in counts)}/{sum(n for _, (_k, n) in counts)}")


if __name__ == "__main__":
    main()
