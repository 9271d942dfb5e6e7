"""Diagnostic: the engine's five CUDA modules compiled by CuPy/NVRTC into CACHE_DIR (use an empty one for a first run),
one after another (seq) or all at once in threads with a thread spinning beside them (par: does NVRTC hold the GIL?).
CUDA only.

python bench/kernel_compile.py seq|par CACHE_DIR

(bench/results/h200/kernel_compile_stop36.log, run as .scratch/kc.py: this file.)"""
import os, sys, time, threading
mode, cache = sys.argv[1], sys.argv[2]
os.environ["CUPY_CACHE_DIR"] = cache
import cupy as cp
from strata.accel.gpu import dequant as dq
O = ("--std=c++17",)
mods = {"engine_kernels": (dq.source("engine_kernels.cu"), O), "dequant": (dq.cuda_source(), dq.NVRTC_OPTIONS),
        "rows_kernels": (dq.source("rows_kernels.cu"), O), "attn_kernels": (dq.source("attn_kernels.cu"), O),
        "decode_kernels": (dq.source("decode_kernels.cu"), O)}
def comp(name, out):
    src, opts = mods[name]
    t = time.perf_counter(); cp.RawModule(code=src, options=opts).compile(); out[name] = time.perf_counter() - t
out = {}
if mode == "seq":
    t = time.perf_counter()
    for n in mods: comp(n, out)
    print(f"{mode} ({cache}): {time.perf_counter() - t:.2f} s;", {n: round(v, 2) for n, v in out.items()}, flush=True)
else:
    ticks, stop = [0], [False]
    def spin():
        while not stop[0]: ticks[0] += 1
    ths = [threading.Thread(target=comp, args=(n, out)) for n in mods]
    t = time.perf_counter()
    for th in ths: th.start()
    sp = threading.Thread(target=spin); sp.start()
    for th in ths: th.join()
    stop[0] = True; sp.join()
    wall = time.perf_counter() - t
    t = time.perf_counter(); n0 = 0
    while time.perf_counter() - t < 0.3: n0 += 1
    print(f"{mode} ({cache}): {wall:.2f} s;", {n: round(v, 2) for n, v in out.items()},
          f"a spinning thread ran {ticks[0] / wall / 1e6:.2f} M loops/s meanwhile (alone {n0 / 0.3 / 1e6:.2f})", flush=True)
