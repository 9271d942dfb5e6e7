"""The kernel set's CUDA modules, compiled all at once in threads when the device opens.

NVRTC compiles a module in ~2-6 s and releases the GIL; CuPy keeps the cubins on disk, keyed by source and options,
so only a machine's first run compiles. On the H200's host, on an empty cache (bench/results/h200/
kernel_compile_stop36.log): the five modules took 20.2 s one after another, 10.6 s in threads, 0.3 s from the cache.
Compiled lazily, one at first use, a first run's prompt stalled ~21 s with nothing said; started in threads when the
device opens, they compile while the engine pins its arena and uploads its weights, and a use waits only for its own
module. When they are still compiling a second on, one line says so, and another when they are done.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from strata.accel.gpu import dequant as dq

CXX17 = ("--std=c++17",)
# name -> (source, NVRTC options): the source is read when the module compiles
MODULES = {
    "engine": (lambda: dq.source("engine_kernels.cu"), CXX17),
    "dequant": (dq.cuda_source, dq.NVRTC_OPTIONS),
    "rows": (lambda: dq.source("rows_kernels.cu"), CXX17),
    "attn": (lambda: dq.source("attn_kernels.cu"), CXX17),
    "decode": (lambda: dq.source("decode_kernels.cu"), CXX17),
    "route": (lambda: dq.source("route_kernels.cu"), CXX17),
    "gemm_q": (lambda: dq.source("gemm_q_kernels.cu"), dq.NVRTC_OPTIONS),
}
SAY_AFTER_S = 1.0    # modules still compiling this long after the start were not in CuPy's cache: say so


class ModuleSet:
    """Every module of MODULES compiling in its own thread from construction; `get(name)` waits for one."""

    def __init__(self, cp, device_id: int = 0, log=None, modules: dict = MODULES):
        self._t0 = time.perf_counter()
        self._log, self._left, self._lock = log, len(modules), threading.Lock()
        pool = ThreadPoolExecutor(max_workers=len(modules), thread_name_prefix="nvrtc")
        self._futures = {name: pool.submit(self._compile, cp, device_id, src, opts)
                         for name, (src, opts) in modules.items()}
        self._said = False
        self._timer = threading.Timer(SAY_AFTER_S, self._still)
        self._timer.daemon = True
        self._timer.start()
        for f in self._futures.values():
            f.add_done_callback(self._done)
        pool.shutdown(wait=False)

    @staticmethod
    def _compile(cp, device_id: int, src, opts):
        with cp.cuda.Device(device_id):          # the module loads into this thread's (the primary) context
            mod = cp.RawModule(code=src(), options=opts)
            mod.compile()
        return mod

    def _still(self) -> None:
        with self._lock:                       # the lock orders this line before `_done`'s
            self._said = self._left > 0 and self._log is not None
            if self._said:
                self._log(f"kernels: compiling {self._left} of {len(self._futures)} CUDA modules in parallel, beside "
                          f"the load (a first run on this machine: CuPy keeps them for the next)")

    def _done(self, _future) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self._timer.cancel()
                if self._said:
                    self._log(f"kernels: compiled in {time.perf_counter() - self._t0:.1f} s")

    def get(self, name: str):
        """The compiled module (a compile error is raised here, in the caller's thread)."""
        return self._futures[name].result()
