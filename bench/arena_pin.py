"""Where the arena's load goes (CUDA only): pinning its memory (CuPy's alloc_pinned_memory, a layer at a time, from
one thread or from N at once) against filling it from the GGUF's pages (N threads, as Arena does). CuPy's pinned pool
is emptied before each way, so each pins anew. With ROUNDS: Arena's two ways (pin_after: filled in
Device.host_buffer memory, then cudaHostRegister; off: cudaHostAlloc, then filled), arms alternating, medians, and
an H2D copy of a layer out of each.

python bench/arena_pin.py MODEL.gguf THREADS [ROUNDS]"""
import gc
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from strata import models
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice

path, n = sys.argv[1], int(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 0
dev = CudaDevice()
m = models.load(path)
c = m.cfg
sizes = [m.expert_blob_bytes(l) * c.n_expert for l in range(c.n_layer)]
gib = sum(sizes) / 2**30
pool = dev.cp.get_default_pinned_memory_pool()


def fresh():
    gc.collect()
    pool.free_all_blocks()


fresh()
t0 = time.perf_counter()
bufs = [dev.pinned(s) for s in sizes]
t_one = time.perf_counter() - t0
t0 = time.perf_counter()


def fill(l):
    b = bufs[l].reshape(c.n_expert, -1)
    for e in range(c.n_expert):
        m.expert(l, e).copy_into(b[e])


with ThreadPoolExecutor(n) as ex:
    list(ex.map(fill, range(c.n_layer)))
t_fill = time.perf_counter() - t0
t0 = time.perf_counter()
with ThreadPoolExecutor(n) as ex:            # the pages already pinned and read once: a second fill
    list(ex.map(fill, range(c.n_layer)))
t_fill2 = time.perf_counter() - t0
del bufs
fresh()
t0 = time.perf_counter()
with ThreadPoolExecutor(n) as ex:
    bufs = list(ex.map(dev.pinned, sizes))
t_many = time.perf_counter() - t0
print(f"arena {gib:.2f} GiB: pinned from one thread in {t_one:.2f} s ({gib / t_one:.2f} GiB/s), from {n} threads "
      f"in {t_many:.2f} s ({gib / t_many:.2f} GiB/s); filled by {n} threads in {t_fill:.2f} s ({gib / t_fill:.2f} "
      f"GiB/s), again {t_fill2:.2f} s ({gib / t_fill2:.2f} GiB/s)", flush=True)
bufs = None
try:
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
except OSError:
    thp = "?"
t = {True: [], False: []}
gbps = {True: [], False: []}
for r in range(rounds):
    for way in ((True, False) if r % 2 == 0 else (False, True)):
        fresh()
        t0 = time.perf_counter()
        a = Arena(m, dev, threads=n, pin_after=way)
        t[way].append(time.perf_counter() - t0)
        src = a.layers[0]
        dst = dev.empty(src.shape, src.dtype)
        gbps[way].append(src.nbytes / dev.h2d_ms(dst, src, 5) / 1e6)
        del a, src, dst
for way, name in ((True, "filled, then registered (pin_after)"), (False, "cudaHostAlloc, then filled")):
    if t[way]:
        med = statistics.median(t[way])
        print(f"Arena {name}: {med:.2f} s ({gib / med:.2f} GiB/s; rounds {[round(x, 2) for x in t[way]]}); a layer "
              f"copied to the device at {statistics.median(gbps[way]):.1f} GB/s", flush=True)
if rounds:
    print(f"transparent huge pages: {thp}; ratio old/new x{statistics.median(t[False]) / statistics.median(t[True]):.2f}")
