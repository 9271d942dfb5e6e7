"""Fit the simulator's H200 constants to bench/cpu_share.py runs, and show how well every column then agrees.

python bench/fit_share_sim.py --model f8.gguf --fit RUN.json:TRACE.npz [--fit ...] [--check RUN.json:TRACE.npz ...]

Stage 1 fits the CPU pool's cost model (sim/costs.py: cycles a weight to unpack an i-quant, cycles a weight a
token or, with --pool, the measured cost by token count), fixed costs (on a machine with the original's MMQ
experts the GPU's per expert, gpu_expert_us; with this engine's, whose GPU ops are modelled by op, the layer's time
with the link idle that no other term holds, group_us + group_us_per_pair a (token, k) pair) and the host's slowdown
while the pool runs (host_issue_factor) to the off and fixed-share columns of the --fit runs (repeats of one
setting, fitted together so that no one run's noise sets the constants): the
engine's own pool at the share's token counts (1..8), with the DMA beside it; the host's time per streamed expert
is the catalogue's, measured. The bench times each prompt with the previous prompt's loan refilled, and each
prompt borrows its own loan (share_sim.predict: the same residency). Stage 2 fits, for each --check run held to
an emulated link (STRATA_DBG_LINK_GBPS), the per-copy cost of that emulation to its off
column alone. Every other column (the fit runs' auto; the checks' shares and auto) is a prediction. Prints the
constants and the tables; the catalogue (sim/data/catalogue.json) carries the stage-1 constants with this command
as source.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from scipy.optimize import minimize, minimize_scalar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from share_sim import _bench_plan, comparison_lines, predict  # noqa: E402


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


def _load(m, spec: str):
    from sim.workload import TraceRouting

    path, trace = spec.split(":")
    rep = next(iter(json.load(open(path)).values()))
    table = {int(L): row for L, row in rep["table"].items()}
    lengths = sorted(table)
    names = list(next(iter(table.values())))
    plan, n_ctx = _bench_plan(m, lengths, rep.get("plan"))
    with np.load(trace) as z:
        routing = TraceRouting(np.asarray(z["ids"], np.int64))
    return dict(table=table, lengths=lengths, names=names, plan=plan, n_ctx=n_ctx, routing=routing,
                workers=rep["workers"], link=rep.get("link_gbps"), path=path,
                auto_share={int(c): v["share"] for c, v in rep.get("auto_classes", {}).items()})


def _pred(m, run, machine, calib, copy_us=0.0):   # (copy_us matters only for a run on an emulated link)
    return predict(m, run["plan"], run["lengths"], run["names"], run["workers"], run["n_ctx"], machine,
                   run["routing"], run["link"], calib, copy_us)


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
    a = ap.parse_args()
    from sim.calibration import CALIB
    from strata.policy import size_class_floor
    from sim.hardware import machine
    from strata import models

    m = models.load(a.model)
    base = machine(a.machine).calib
    fits = [_load(m, spec) for spec in a.fit]
    shares = [n for n in fits[0]["names"] if n not in ("off", "auto")]
    assert all(f["names"] == fits[0]["names"] for f in fits), "the --fit runs must have the same columns"

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

    def loss(x):
        c = calib_of(x)
        errs = [e for f in fits for e in _err(f, _pred(m, f, a.machine, c), ["off"] + shares)]
        return float(np.mean(np.square(errs)))

    # the fit works in logs. The fixed cost is fitted beside the CPU's constants: with each prompt borrowing only
    # its own loan, more experts stay resident and the off column turned on it (-10..-15% at the catalogue's
    # 12.76 us an expert, stop 15). The pool's cost per job stays the catalogue's: no column moves with it.
    x0 = ([base["cpu_cycles_per_weight"]["iq"]] + ([] if curves else [base["cpu_cycles_per_mac"]])
          + [base.get(f, v) for f, v in fixed.items()] + [base.get("host_issue_factor", 1.87)])
    res = minimize(loss, np.log(x0), method="Nelder-Mead",
                   options=dict(xatol=0.01, fatol=1e-5, maxfev=55 * (len(x0) - 1)))
    calib = calib_of(res.x)
    preds = [_pred(m, f, a.machine, calib) for f in fits]
    print(f"stage 1 (the CPU pool, from {['off'] + shares} of {', '.join(f['path'] for f in fits)}): iq "
          f"{calib['cpu_cycles_per_weight']['iq']:.3f} cycles a weight"
          + ("" if curves else f", {calib['cpu_cycles_per_mac']:.4f} a weight a token")
          + (f"; the GPU's {calib['gpu_expert_us']:.2f} us an expert beyond its roofline" if mmq else
             f"; the layer's time outside the modelled ops {calib['group_us']:.0f} us + "
             f"{calib['group_us_per_pair']:.3f} us a (token, k) pair")
          + "; host time per streamed "
          f"expert x{calib['host_issue_factor']:.2f} "
          f"while the pool runs; the meter's share per size class, simulated against the engine's (first run): "
          + ", ".join(f"{size_class_floor(c)}+ tokens {s:.2f}/{fits[0]['auto_share'].get(c, float('nan')):.2f}"
                      for c, s in sorted(preds[0]["auto_share"].items())))
    for f, pred in zip(fits, preds):
        print(f"{f['path']}:")
        print("\n".join(comparison_lines(f["table"], pred, f["lengths"], f["names"])))
    for spec in a.check:
        run = _load(m, spec)
        copy_us = 0.0
        if run["link"]:
            one = minimize_scalar(lambda c: float(np.mean(np.square(_err(run, _pred(m, run, a.machine, calib, c),
                                                                          ["off"])))),
                                  bounds=(0.0, 200.0), method="bounded", options=dict(xatol=0.5))
            copy_us = float(one.x)
            print(f"\nstage 2 ({run['path']}, link held to {run['link']:g} GB/s): {copy_us:.1f} us a copy, "
                  f"from its off column")
        print("\n".join(comparison_lines(run["table"], _pred(m, run, a.machine, calib, copy_us), run["lengths"],
                                         run["names"])))


if __name__ == "__main__":
    main()
