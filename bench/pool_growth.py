"""Diagnostic: CuPy's memory pool's growth over one prompt (bench/prefill.py's quarter cache; 8K walks layer by
layer), the deferred blocks on the compute stream and on the side stream alternating, beside what the memory plan
prices for a chunk's temporaries (buffers.temp_bytes, prompt_graph.graph_temp_bytes). Free blocks are released
before each prompt, so the growth is the pool's high-water mark over it (fragmentation and what the prompt keeps
included). Python's cyclic collector is off over each prompt: what it would free late shows as growth, and the
objects it then finds are counted (a cycle holding device arrays frees them only when the collector runs).
--trace: a memory hook follows every allocation of the prompt; at the pool's peak of live bytes, those bytes by
the engine's line that allocated them. CUDA only.

python bench/pool_growth.py MODEL.gguf [TOKENS] [--trace]
"""
import gc
import os
import sys
from collections import defaultdict

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prefill import quarter_engines, timed_prompt, warm      # bench/prefill.py
from strata.accel.buffers import temp_bytes
from strata.accel.prompt_graph import graph_temp_bytes

MIB = 2**20


class LiveHook(cp.cuda.MemoryHook):
    """Live pool allocations by the allocating line (the innermost frame under strata/, and its caller's)."""

    name = "LiveHook"

    def __init__(self):
        self.live, self.now, self.peak, self.at_peak = {}, 0, 0, {}

    def malloc_postprocess(self, **kw):
        f, site = sys._getframe(1), []
        while f is not None and len(site) < 2:
            if "/strata/" in f.f_code.co_filename:
                site.append(f"{f.f_code.co_filename.rsplit('/strata/', 1)[1]}:{f.f_lineno}")
            f = f.f_back
        self.live[kw["mem_ptr"]] = (kw["mem_size"], " < ".join(site) or "?")
        self.now += kw["mem_size"]
        if self.now > self.peak:
            self.peak, self.at_peak = self.now, dict(self.live)

    def free_preprocess(self, **kw):
        got = self.live.pop(kw["mem_ptr"], None)
        if got is not None:
            self.now -= got[0]

    def report(self, top: int = 14) -> list[str]:
        by = defaultdict(lambda: [0, 0])
        for size, site in self.at_peak.values():
            by[site][0] += size
            by[site][1] += 1
        rows = sorted(by.items(), key=lambda kv: -kv[1][0])[:top]
        return [f"  peak {self.peak / MIB:.1f} MiB live from the prompt's allocations:"] + [
            f"    {b / MIB:8.1f} MiB in {n:4d}  {site}" for site, (b, n) in rows]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    trace = "--trace" in sys.argv
    dev, m, arena, (e,) = quarter_engines(args[0], 1)
    c, L = m.cfg, int(args[1]) if len(args) > 1 else 8192
    rng = np.random.default_rng(0)
    pool = cp.get_default_memory_pool()
    chunk = e.plan.chunk
    print(f"chunk {chunk}: temp_bytes {temp_bytes(c, chunk) / MIB:.1f} MiB; graph_temp_bytes "
          f"{graph_temp_bytes(c, chunk) / MIB:.1f}")
    for side in (False, True, False, True):
        e.side_blocks = side
        warm((e,), [L], rng, c.n_vocab)
        gc.collect()
        dev.synchronize(); pool.free_all_blocks(); base, used0 = pool.total_bytes(), pool.used_bytes()
        hook = LiveHook() if trace else None
        gc.disable()
        try:
            if hook is not None:
                with hook:
                    ms, _, _, _ = timed_prompt(dev, e, rng.integers(0, c.n_vocab, L).tolist())
            else:
                ms, _, _, _ = timed_prompt(dev, e, rng.integers(0, c.n_vocab, L).tolist())
            dev.synchronize()
            grew, used1 = pool.total_bytes() - base, pool.used_bytes()
            cyc = gc.collect()
        finally:
            gc.enable()
        print(f"side={side}: {ms:.1f} ms, pool grew {grew / MIB:.1f} MiB over the prompt (used before "
              f"{used0 / MIB:.1f}, after {used1 / MIB:.1f}); cyclic garbage {cyc} objects; walk "
              f"{e.stats.chunks[-1][1]}, chunks of {e.stats.chunks[-1][0]}", flush=True)
        if hook is not None:
            print("\n".join(hook.report()), flush=True)


if __name__ == "__main__":
    main()
