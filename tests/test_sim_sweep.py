"""A 200-point sweep on a local Dask cluster (2 worker processes), reduced simulations, cluster cleaned up."""

import csv
import io
import multiprocessing
import time

from sim.sweep import Point, grid, run_point, sweep, table

MACHINES = ["rtx3060-5600x", "rtx4090-7950x", "rtx5090-9950x3d", "rx6800-5700x3d", "p100-e5-2686v4"]
MODELS = ["qwen3-30b-a3b:Q4_K_M", "olmoe-1b-7b:Q4_K_M"]
PROMPTS = [64, 128, 256, 512, 1024]
SHARES = ["off", "0.3", "auto", "default"]


def test_point():
    row = run_point(Point("rtx4090-7950x", "olmoe-1b-7b:Q4_K_M", 128, "auto", layers=2))
    assert row["layers"] == 2 and row["prompt_ms"] > 0 and row["walk"] == "routed-only"


def test_sweep_200_points_on_dask():
    points = grid(MACHINES, MODELS, PROMPTS, SHARES, layers=2)
    assert len(points) == 200
    t0 = time.perf_counter()
    rows = sweep(points, workers=2)
    elapsed = time.perf_counter() - t0
    assert len(rows) == 200 and {r["share"] for r in rows} == set(SHARES)
    assert [(r["machine"], r["model"], r["prompt"], r["share"]) for r in rows] == [
        (p.machine, p.model, p.prompt, p.share) for p in points
    ]  # gathered in order
    parsed = list(csv.DictReader(io.StringIO(table(rows))))
    assert len(parsed) == 200 and all(r["vs_off_pct"] != "" for r in parsed)
    assert all(float(r["vs_off_pct"]) == 0.0 for r in parsed if r["share"] == "off")
    assert multiprocessing.active_children() == []  # the cluster is gone
    print(f"200-point sweep: {elapsed:.1f} s")
