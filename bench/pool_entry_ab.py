"""The pool's row calls, timed in one process: one pool.run of 8 experts of qwen3-30b-a3b's shape (Q4_K gate and
up, Q6_K down; D 2048, F 768) at 1 and 8 tokens, median of 30 runs after one warm-up. Run it interleaved against
another tree's strata (PYTHONPATH) to compare engines; argv[1]: the pool's workers (default: the machine's).

for i in 1 2 3 4 5; do for d in OLD NEW; do PYTHONPATH=$d python bench/pool_entry_ab.py; done; done
"""
import time, sys, warnings
import numpy as np
from strata import quants
from strata.accel.cpu.pool import ExpertJob, ExpertPool
warnings.simplefilter("ignore")
D, F = 2048, 768
rng = np.random.default_rng(0)
types = (12, 12, 14)
parts = [quants.get(q).random_blocks(rng, n * k // quants.get(q).block_size, 0.05).reshape(-1)
         for q, (n, k) in zip(types, ((F, D), (F, D), (D, F)))]
blobs = [np.concatenate(parts) for _ in range(8)]
pool = ExpertPool(int(sys.argv[1]) if len(sys.argv) > 1 else None)
res = {}
for T in (1, 8):
    x = rng.standard_normal((T, D)).astype(np.float32)
    outs = [np.empty_like(x) for _ in range(8)]
    jobs = [ExpertJob(b, types, D, F, x, o) for b, o in zip(blobs, outs)]
    pool.run(jobs)
    ts = []
    for _ in range(30):
        t = time.perf_counter(); pool.run(jobs); ts.append(time.perf_counter() - t)
    res[T] = np.median(ts) * 1e3
pool.close()
print(" ".join(f"T{T} {v:.3f} ms" for T, v in res.items()))
