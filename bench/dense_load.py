"""A load's two long steps, each way measured in one process (CUDA only), arms alternating, medians:

- the dense weights (DenseWeights): dequantised by numpy on the host and uploaded as fp16 (on_device=False), or
  uploaded as their GGUF bytes and dequantised by the device (Kernels.dequant_matrix); every array compared bit for
  bit between the two;
- the arena (Arena): pinned and filled by N threads, for each N given (CuPy's pinned pool emptied between arenas, so
  each pins its memory anew).

python bench/dense_load.py MODEL.gguf ROUNDS [ARENA_THREADS,...]"""
import gc
import statistics
import sys
import time

import numpy as np

from strata import models
from strata.accel.arena import Arena
from strata.accel.dense import DenseWeights
from strata.accel.device.cuda import CudaDevice

path, rounds = sys.argv[1], int(sys.argv[2])
threads = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else []
dev = CudaDevice()
m = models.load(path)


def same(a: DenseWeights, b: DenseWeights) -> bool:
    arrs = [(a.w[n], b.w[n]) for n in b.w] + [(a.qkv[n][0], b.qkv[n][0]) for n in b.qkv]
    return sorted(a.w) == sorted(b.w) and all(
        np.array_equal(dev.tohost(x).view(np.uint8), dev.tohost(y).view(np.uint8)) for x, y in arrs)


host, on_dev = DenseWeights(m, dev, on_device=False), DenseWeights(m, dev)      # warm: page cache, kernels
print(f"dense weights: the device's dequantisation gives the host's bits: {same(on_dev, host)}", flush=True)
del host, on_dev
t = {"host": [], "device": []}
for r in range(rounds):
    for arm in (("host", "device") if r % 2 == 0 else ("device", "host")):
        gc.collect()
        dev.synchronize()
        t0 = time.perf_counter()
        w = DenseWeights(m, dev, on_device=arm == "device")
        t[arm].append(time.perf_counter() - t0)
        del w
h, d = statistics.median(t["host"]), statistics.median(t["device"])
print(f"dense weights ({rounds} rounds): host dequantisation {h:.2f} s, device {d:.2f} s: x{h / d:.1f} "
      f"(per round {min(a / b for a, b in zip(t['host'], t['device'])):.1f}-"
      f"{max(a / b for a, b in zip(t['host'], t['device'])):.1f})", flush=True)
pool = dev.cp.get_default_pinned_memory_pool()
ta = {n: [] for n in threads}
for r in range(rounds if threads else 0):
    for n in (threads if r % 2 == 0 else threads[::-1]):
        gc.collect()
        pool.free_all_blocks()
        t0 = time.perf_counter()
        a = Arena(m, dev, threads=n)
        ta[n].append(time.perf_counter() - t0)
        gb = a.total_bytes / 2**30
        del a
for n in threads:
    print(f"arena, {n} threads: {statistics.median(ta[n]):.2f} s ({gb / statistics.median(ta[n]):.2f} GiB/s; "
          f"rounds {[round(x, 2) for x in ta[n]]})", flush=True)
