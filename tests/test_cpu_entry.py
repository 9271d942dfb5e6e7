"""The row kernels' entry points (strata/accel/cpu/entry.py): every CPU type in exactly one family, and a process
compiling only the families its jobs use, each before the pool's scheduler calls it (an entry left at 0 would be
a call to address 0: the subprocess below would crash)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from strata.accel.cpu import entry
from strata.accel.cpu.kernels import SUPPORTED

ROOT = Path(__file__).resolve().parents[1]


def test_every_supported_type_has_one_family():
    seen = [t for _, _, ts in entry.FAMILIES for t in ts]
    assert len(seen) == len(set(seen)), "a type in two families"
    assert set(SUPPORTED) <= set(seen), set(SUPPORTED) - set(seen)
    assert max(seen) < entry.N_TYPES
    with pytest.raises(ValueError, match="no CPU row kernel"):
        entry.ensure(9)             # Q8_1: an activation type, no weight kernel
    with pytest.raises(ValueError, match="no CPU row kernel"):
        entry.family(99)


_CHILD = r"""
import numpy as np
from strata import quants
from strata.accel.cpu import entry
from strata.accel.cpu.pool import ExpertJob, ExpertPool, LinearJob
from strata.reference import linalg

Q4_K, Q6_K, Q8_0 = 12, 14, 8
t = entry._ENTRIES.table
assert not t.any(), t.nonzero()                      # nothing compiled at import or at the pool's start
pool = ExpertPool(1, host=True)
assert not t.any(), t.nonzero()
D = F = 256
rng = np.random.default_rng(0)
types = (Q4_K, Q4_K, Q6_K)
parts = [quants.get(q).random_blocks(rng, n * k // quants.get(q).block_size, 0.05).reshape(-1)
         for q, (n, k) in zip(types, ((F, D), (F, D), (D, F)))]
blob = np.concatenate(parts)
x = rng.standard_normal((3, D)).astype(np.float32)
out = np.empty_like(x)
pool.run([ExpertJob(blob, types, D, F, x, out)])     # Q4_K and Q6_K compiled by the job's plan, before the run
g = F * quants.get(Q4_K).row_bytes(D)
ref = linalg.swiglu_ffn(x, (blob[:g].reshape(F, -1), Q4_K), (blob[g:2 * g].reshape(F, -1), Q4_K),
                        (blob[2 * g:].reshape(D, -1), Q6_K), linalg.Path.Q8)
assert np.array_equal(out, ref)
assert sorted(t.nonzero()[0].tolist()) == [Q4_K, Q6_K], t.nonzero()
w = quants.get(Q8_0).random_blocks(rng, 64 * D // 32, 0.05).reshape(64, -1)
y = np.empty((3, 64), np.float32)
pool.run([LinearJob(w, Q8_0, x, y)])                   # a dense job's type too
assert np.array_equal(y, linalg.matmul(x, w, Q8_0, linalg.Path.Q8)), "linear"
assert sorted(t.nonzero()[0].tolist()) == [Q8_0, Q4_K, Q6_K]
pool.close()
print("ok")
"""


def test_a_process_compiles_only_its_jobs_families():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
