"""Diagnostic: does host->device DMA slow the CPU pool? bench/cpu_pool.py's pool_probe of a model's experts, with
and without a thread that keeps the copy stream busy with pinned arena blobs (as the GPU's streamed experts do
while the prefill share runs), interleaved rounds, per pool size. CUDA only.

python bench/probe_under_dma.py MODEL.gguf [--workers 1,14] [--rounds 2] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_pool import pool_probe, probe_line  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--workers", default="1,14")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    from strata import models
    from strata.accel.arena import Arena
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.device.cuda import CudaDevice

    m = models.load(a.model)
    c = m.cfg
    dev = CudaDevice()
    arena = Arena(m, dev, log=lambda s: None)
    src = arena.layers[0][:128].reshape(-1)                  # 128 pinned blobs, copied over and over
    dst = dev.empty((src.nbytes,), np.uint8)
    stop, moved = threading.Event(), [0, 0.0]

    def dma():
        t0 = time.perf_counter()
        while not stop.is_set():
            dev.h2d(dst, src, dev.copy)
            dev.copy.synchronize()
            moved[0] += src.nbytes
        moved[1] = time.perf_counter() - t0

    print(f"# {' '.join(sys.argv)}")
    for w in (int(x) for x in a.workers.split(",")):
        pool = ExpertPool(workers=w)
        for r in range(a.rounds):
            for load in (False, True):
                t = None
                if load:
                    stop.clear()
                    moved[0] = 0
                    t = threading.Thread(target=dma)
                    t.start()
                p = pool_probe(pool, arena.layers, arena.types, c.n_embd, c.n_ff_exp, reps=a.reps)
                if t is not None:
                    stop.set()
                    t.join()
                dma_note = f" ({moved[0] / moved[1] / 1e9:.1f} GB/s H2D meanwhile)" if load else ""
                print(f"{w} workers, round {r}, {'with' if load else 'without'} DMA{dma_note}: {probe_line(p)}",
                      flush=True)
        pool.close()


if __name__ == "__main__":
    main()
