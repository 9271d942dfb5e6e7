"""``python -m sim sweep``: a grid of machines x models x prompt lengths x share settings on Dask.

Each point is one simulated prompt (``Run.layers`` can cut it to the first N layers, scaled up: a reduced
simulation for big grids). A local cluster of worker processes by default; ``scheduler`` names a running one
(``tcp://host:8786``). The cluster this module starts is closed before it returns.
"""

from __future__ import annotations

import csv
import io
import itertools
from dataclasses import dataclass, replace

from .engine import Run, prefill
from .hardware import machine as get_machine
from .models import model as get_model
from .whatif import setting_config


@dataclass(frozen=True, slots=True)
class Point:
    machine: str
    model: str
    prompt: int
    share: str
    layers: int | None = None  # simulate only the first N layers (scaled to the model's depth)
    seed: int = 0


def run_point(p: Point) -> dict:
    """One grid point -> one table row (a plain dict, cheap to ship between processes)."""
    m, mod = get_machine(p.machine), get_model(p.model)
    run = Run(m, mod, p.prompt, setting_config(p.share), qualifies=m.gpu.api == "cuda", seed=p.seed)
    r = prefill(replace(run, layers=p.layers) if p.layers else run)
    return {
        "machine": p.machine,
        "model": p.model,
        "prompt": p.prompt,
        "share": p.share,
        "layers": p.layers or mod.n_layer,
        "prompt_ms": round(r.prompt_ms, 3),
        "tok_s": round(r.tok_s, 2),
        "walk": "+".join(sorted({w.value for _, _, w in r.chunks})),
        "n_cpu": r.n_cpu,
        "n_streamed": r.n_streamed,
        "final_share": None if r.final_share is None else round(r.final_share, 4),
        "shared_layers": sum(1 for s in r.layer_shares if s > 0),
    }


def grid(machines, models, prompts, shares, layers=None, seed=0) -> list[Point]:
    return [
        Point(a, b, int(c), str(d), layers, seed)
        for a, b, c, d in itertools.product(machines, models, prompts, shares)
    ]


def sweep(points: list[Point], scheduler: str | None = None, workers: int = 2) -> list[dict]:
    from dask.distributed import Client, LocalCluster

    if scheduler:
        with Client(scheduler) as client:
            return client.gather(client.map(run_point, points, pure=False))
    with LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        with Client(cluster) as client:
            return client.gather(client.map(run_point, points, pure=False))


def table(rows: list[dict]) -> str:
    """The rows as CSV, with each row's change against the same point with the share off."""
    off = {(r["machine"], r["model"], r["prompt"]): r["prompt_ms"] for r in rows if r["share"] == "off"}
    out = io.StringIO()
    cols = list(rows[0]) + ["vs_off_pct"] if rows else []
    w = csv.DictWriter(out, cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        base = off.get((r["machine"], r["model"], r["prompt"]))
        w.writerow({**r, "vs_off_pct": "" if base is None else round(100 * (r["prompt_ms"] / base - 1), 2)})
    return out.getvalue()
