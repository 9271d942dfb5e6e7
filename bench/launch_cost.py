"""Host time of one kernel launch and of the small calls a prompt layer makes (CUDA only).

python bench/launch_cost.py [--calls 3000]

Each line: microseconds of host time a call (enqueue only; the stream is synchronised outside the timed loop).
Rows are interleaved in rounds and the median round is printed, so a slow moment of a shared host hits all
rows alike. What it answers: how much of a host-bound prompt layer (~50 launches, a few uploads) each path costs.
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np

SRC = r"""extern "C" __global__ void nop(float* a, const float* b, int n, int m, unsigned long long p) {
    if (n < 0 && threadIdx.x == 0) a[0] = b[0] + m + p; }"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    import cupy as cp
    from cupy_backends.cuda.api import driver

    from strata.accel.device.cuda import CudaDevice

    dev = CudaDevice()
    s = dev.compute.s
    raw = cp.RawModule(code=SRC).get_function("nop")
    x, y = cp.zeros(16, cp.float32), cp.zeros(4096, cp.float32)
    # the floor under any Python launch path: cuLaunchKernel with its parameter block packed once, outside the loop
    vals = [ctypes.c_uint64(x.data.ptr), ctypes.c_uint64(x.data.ptr), ctypes.c_int32(1), ctypes.c_int32(2),
            ctypes.c_uint64(3)]
    params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    fptr, pptr = raw.kernel.ptr, ctypes.addressof(params)
    table = np.zeros(256, np.int32)

    def add():
        with s:
            y + y

    # the engine's kernel methods on shapes small enough that the GPU keeps up with the host (no queue back-pressure)
    from strata import quants
    from strata.accel.gpu.kernels import BlobRef

    k, st = dev.k, dev.compute
    q4k = quants.get(12)
    blobs = cp.zeros((1, 8 * q4k.row_bytes(256)), cp.uint8)               # one 8 x 256 Q4_K matrix of zero blocks
    btab = k.upload(k.blob_table([BlobRef(blobs, 0)], 0), st)
    tiles = k.upload(np.array([[0, 0, 8]], np.int32), st)
    a16 = cp.zeros((64, 256), cp.float16)
    out8, w16 = cp.zeros((64, 8), cp.float32), cp.zeros((1, 8, 256), cp.float16)
    gu, hh = cp.zeros((8, 128), cp.float32), cp.zeros((8, 64), cp.float16)
    x32, o32, wl = cp.zeros((16, 64), cp.float32), cp.zeros((16, 64), cp.float32), cp.zeros((64, 64), cp.float16)
    nw = cp.ones(64, cp.float32)
    method_rows = {
        "k.dequant (8 x 256 Q4_K)": lambda: k.dequant(w16, btab, 12, 8, 256, st),
        "k.expert_rows (one 8-row tile)": lambda: k.expert_rows(out8, a16, btab, tiles, 1, 12, 8, 256, st),
        "k.gemm_grouped (one tile)": lambda: k.gemm_grouped(out8, a16, w16, tiles, 1, st),
        "k.swiglu (8 rows)": lambda: k.swiglu(hh, gu, 64, st),
        "k.linear (16 tokens: to_f16 + cuBLAS)": lambda: k.linear(o32, x32, wl, st),
        "k.rms_norm (16 tokens)": lambda: k.rms_norm(o32, x32, nw, 1e-6, st),
        "k.add (16 x 64)": lambda: k.add(o32, x32, x32, st),
    }

    rows = {
        "RawKernel call (CuPy)": lambda: raw((1,), (32,), (x, x, np.int32(1), np.int32(2), np.uint64(3)), stream=s),
        "cuLaunchKernel, parameters packed beforehand": lambda: driver.launchKernel(fptr, 1, 1, 1, 32, 1, 1, 0,
                                                                                    s.ptr, pptr, 0),
        "upload of a 1 KiB table (CudaKernels.upload)": lambda: dev.k.upload(table, dev.compute),
        "cp.empty (pool)": lambda: cp.empty(256, cp.float32),
        "event, recorded": lambda: cp.cuda.Event(disable_timing=True).record(s),
        "CuPy elementwise y + y": add,
        "numpy .ctypes.data of an array": lambda: table.ctypes.data,
    } | method_rows
    got = {k: [] for k in rows}
    for _ in range(a.rounds):
        for name, f in rows.items():
            for _ in range(200):
                f()
            s.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                f()
            got[name].append((time.perf_counter() - t0) / a.calls * 1e6)
            s.synchronize()
    print(f"host time a call, median of {a.rounds} interleaved rounds of {a.calls} calls")
    for name, v in got.items():
        print(f"  {name:46s} {np.median(v):7.2f} us")
    r = np.median(got["cuLaunchKernel, parameters packed beforehand"]) / np.median(got["RawKernel call (CuPy)"])
    print(f"  prepacked cuLaunchKernel / RawKernel call: {r:.2f}x")


if __name__ == "__main__":
    main()
