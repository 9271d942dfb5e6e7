"""Diagnostic: CuPy's memory pool's growth over one prompt (bench/prefill.py's quarter cache; 8K walks layer by
layer), the deferred blocks on the compute stream and on the side stream alternating, beside what the memory plan
prices for a chunk's temporaries (buffers.temp_bytes, prompt_graph.graph_temp_bytes). Free blocks are released
before each prompt, so the growth is the pool's high-water mark over it (fragmentation and what the prompt keeps
included). CUDA only.

python bench/pool_growth.py MODEL.gguf [TOKENS]
"""
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prefill import quarter_engines, timed_prompt, warm      # bench/prefill.py
from strata.accel.buffers import temp_bytes
from strata.accel.prompt_graph import graph_temp_bytes

dev, m, arena, (e,) = quarter_engines(sys.argv[1], 1)
c, L = m.cfg, int(sys.argv[2]) if len(sys.argv) > 2 else 8192
rng = np.random.default_rng(0)
pool = cp.get_default_memory_pool()
chunk = e.plan.chunk
new = temp_bytes(c, chunk); old = new - 3 * chunk * c.n_embd * 4
print(f"chunk {chunk}: temp_bytes {new / 2**20:.1f} MiB (without the side term {old / 2**20:.1f}); graph_temp_bytes {graph_temp_bytes(c, chunk) / 2**20:.1f}")
for side in (False, True, False, True):
    e.side_blocks = side
    warm((e,), [L], rng, c.n_vocab)
    dev.synchronize(); pool.free_all_blocks(); base, used0 = pool.total_bytes(), pool.used_bytes()
    ms, _, _, _ = timed_prompt(dev, e, rng.integers(0, c.n_vocab, L).tolist())
    dev.synchronize()
    print(f"side={side}: {ms:.1f} ms, pool grew {(pool.total_bytes() - base) / 2**20:.1f} MiB over the prompt (used before {used0 / 2**20:.1f}, after {pool.used_bytes() / 2**20:.1f}); walk {e.stats.chunks[-1][1]}", flush=True)
