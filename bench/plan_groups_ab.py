"""In one process: the pre-sync groups' table kernel (cuda/route_kernels.cu `plan_groups`) of an older tree against
the tree's, CUDA only (bench/kernel_ab.py's harness: arms alternating, medians, per-round ratios, bits compared).

python bench/plan_groups_ab.py MODEL.gguf OLD.cu 250,600,900 ROUNDS
    OLD.cu: route_kernels.cu of an older tree (git show REV:strata/accel/gpu/cuda/route_kernels.cu > OLD.cu) whose
    plan_groups takes the tree's arguments (the wrapper's: 9 since its sizes ride in the upload; the 24-argument
    kernels of 2645a04 and c6f78a6 ran against each other at c6f78a6, plan_ab_q8_stop54.log)

- alone: GPU us a call at qwen3's shape (128 experts, top 8, groups of 16, two residents' groups and two of a guessed
  walk's), the tables compared bit for bit. Each call also runs the staging ring's pull of its order and pointers
  (the same in both arms).
- prompts: two engines on one arena, the quarter cache (its chunks of 768 tokens or more take pre-sync groups in
  narrow layers) and all resident (every layer takes them), one on each kernel; logits compared bit for bit."""
import dataclasses
import sys

import cupy as cp
import numpy as np

from kernel_ab import EngineAB
from strata import models, policy
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.gpu import dequant as dq
from strata.accel.gpu.kernels import ROUTE_TILE
from strata.accel.memplan import budget_holding
from strata.accel.presync import PreShape, fills, pre_bytes


class PlanAB(EngineAB):
    """Arms: the device's plan_groups function swapped under the engines (they share the device's kernels)."""

    def __init__(self, dev, m, old_eng, new_eng, rounds, fns):
        super().__init__(dev, m, old_eng, new_eng, rounds)
        self.fns = fns

    def use(self, md: str) -> None:
        self.dev.k._route["plan_groups"] = self.fns[md]


def alone(dev, fns, T: int, rounds: int, rng) -> None:
    k, s, E, K, G, J, few = dev.k, dev.compute, 128, 8, 16, 4, 8
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    P, nt = T * K, -(-T * K // ROUTE_TILE)
    hist = dev.zeros((nt, E), np.int32)
    k.route_hist(hist, dev.asarray(ids.reshape(-1)), P, s)
    res_ids = np.flatnonzero(rng.random(E) < 0.25)
    guessed = rng.permutation(np.flatnonzero(~np.isin(np.arange(E), res_ids)))[:18]
    order = np.concatenate([res_ids, guessed]).astype(np.int64)
    shape = PreShape.of(J, G, 3, E, T, K, few, 8, 64)
    cache, ring = dev.zeros((E, 4096), np.uint8), dev.zeros((18, 4096), np.uint8)
    blobs = [(cache, np.arange(res_ids.size)), (ring, np.arange(guessed.size))]
    tiling = (few, 8, 128)
    fill = fills(T, K, G, *tiling)
    busy = cp.empty(1 << 28, np.uint8)
    us, outs = {"old": [], "new": []}, {}
    for i in range(rounds * 4 + 2):
        for md in ("old", "new"):
            k._route["plan_groups"] = fns[md]
            buf = dev.zeros((pre_bytes(shape),), np.uint8)
            pt = k.pre_tables(buf, shape)
            e0, e1 = dev.event(), dev.event()
            with s.s:
                busy.fill(i & 255)
            e0.record(s)
            for _ in range(20):
                k.plan_groups(pt, hist, nt, order, res_ids.size, blobs, (0, 1000, 2500), 2, J, tiling, fill, s)
            e1.record(s)
            e1.synchronize()
            if i >= 2:
                us[md].append(e0.elapsed_ms(e1) * 1e3 / 20)
            outs[md] = cp.asnumpy(buf)
    same = np.array_equal(outs["old"], outs["new"])
    print(f"  alone, {T} tokens: old {np.median(us['old']):7.1f} us  new {np.median(us['new']):7.1f} us  old/new "
          f"x{np.median(us['old']) / np.median(us['new']):.2f}; tables identical: {same}", flush=True)


def main():
    path, old_src, lengths, rounds = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
    text = open(old_src, encoding="utf-8").read().replace('#include "common.cuh"', dq.source("common.cuh"))
    dev = CudaDevice()
    old = cp.RawModule(code=text, options=("--std=c++17",)).get_function("plan_groups")
    new = dev.k._route_fn("plan_groups")
    fns = {"old": old, "new": new}
    rng = np.random.default_rng(0)
    for T in (250, 900):
        alone(dev, fns, T, rounds, rng)
    m = models.load(path)
    c = m.cfg
    arena = Arena(m, dev)
    cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
    for label, frac in (("quarter cache", 0.25), ("all resident", 1.0)):
        budget = budget_holding(m, 8200, int(frac * c.n_layer * c.n_expert))
        eo, en = (GpuEngine(m, dev, n_ctx=8200, vram_budget=budget, config=cfg, arena=arena) for _ in range(2))
        print(f"{label}:", flush=True)
        PlanAB(dev, m, eo, en, rounds, fns).prompts(lengths, rng)
        del eo, en
    dev.close()


if __name__ == "__main__":
    main()
