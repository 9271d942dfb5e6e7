"""The accel CPU backend: Numba q8-path kernels, the expert pool and its pipeline, CPU-only generation.

Threading: the pool runs its own Python threads that call `nogil` kernels (pool.py); no kernel here uses
`parallel=True`, so Numba's threading layer never starts for our work. We still pin the layer to `workqueue`
(unless the user chose one) for any `prange` code elsewhere in the process: the OpenMP layer's idle threads spin
and slow numpy's BLAS and CuPy's host threads about 4x (notes/tooling.md §5.2), TBB is absent, and workqueue
never spins. Its limit (no nested or concurrent parallel launches) does not touch the pool.
"""

from __future__ import annotations

import numba

if numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"
