"""Measure what the simulator's hardware entry and the benchmarks' floors need: pinned H2D/D2H bandwidth by copy
size, per-copy latency, host memory bandwidth (threads), cores. Prints a table and writes JSON.

python bench/hw_probe.py [--out probe.json] [--rounds 5]     (medians of interleaved rounds)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _stream_sum(a):
    s = np.uint64(0)
    for i in range(a.size):
        s += a[i]
    return s


def host_bandwidth(threads: int, nbytes: int = 2 << 30, rounds: int = 5) -> float:
    """GB/s of a streaming read: `threads` Python threads each summing a disjoint slice in nogil Numba code (a
    numpy reduction per thread reads less: 62-66 against 91-94 GB/s on the H200 host's 16 cores). The one host
    bandwidth the benchmarks hold kernels and the decode bound to."""
    a = np.ones(nbytes // 8, np.uint64)
    parts = np.array_split(a, threads)
    _stream_sum(parts[0][:16])
    runs = []
    for _ in range(rounds):
        ts = [threading.Thread(target=_stream_sum, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        runs.append(nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe.json")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    res = {"cores": os.cpu_count()}
    res["host_read_gbps"] = {str(t): round(host_bandwidth(t), 1) for t in (1, 4, 8, os.cpu_count())}
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no CuPy, or no usable CUDA device: the host figures alone
        print(f"no CUDA device ({type(e).__name__}): host figures only")
        cp = None
    if cp is not None:
        s = cp.cuda.Stream(non_blocking=True)
        sizes = [64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
        pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(sizes[-1]), np.uint8, sizes[-1])
        pinned[:] = 1
        dev = cp.empty(sizes[-1], np.uint8)
        h2d, d2h = {}, {}
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        for n in sizes:
            reps = max(4, min(200, (256 << 20) // n))
            hs, ds = [], []
            for _ in range(a.rounds):
                e0.record(s)
                for _ in range(reps):
                    dev.data.copy_from_host_async(pinned.ctypes.data, n, s)
                e1.record(s)
                e1.synchronize()
                hs.append(n * reps / (cp.cuda.get_elapsed_time(e0, e1) / 1e3) / 1e9)
                e0.record(s)
                for _ in range(reps):
                    dev.data.copy_to_host_async(pinned.ctypes.data, n, s)
                e1.record(s)
                e1.synchronize()
                ds.append(n * reps / (cp.cuda.get_elapsed_time(e0, e1) / 1e3) / 1e9)
            h2d[str(n)], d2h[str(n)] = round(statistics.median(hs), 2), round(statistics.median(ds), 2)
        # per-copy latency: many 4 KiB copies
        e0.record(s)
        for _ in range(1000):
            dev.data.copy_from_host_async(pinned.ctypes.data, 4096, s)
        e1.record(s)
        e1.synchronize()
        res.update(h2d_gbps_by_size=h2d, d2h_gbps_by_size=d2h,
                   h2d_latency_us=round(cp.cuda.get_elapsed_time(e0, e1), 3),
                   gpu=cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
