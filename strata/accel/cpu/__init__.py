"""The accel CPU backend: Numba q8-path kernels, the expert pool and its pipeline, CPU-only generation.

Threading: the pool runs its own Python threads that call `nogil` kernels (pool.py); no kernel here uses
`parallel=True`, so Numba's threading layer never starts for our work. We still pin the layer to `workqueue`
(unless the user chose one) for any `prange` code elsewhere in the process: the OpenMP layer's idle threads spin
and slow numpy's BLAS and CuPy's host threads about 4x (notes/tooling.md §5.2), TBB is absent, and workqueue
never spins. Its limit (no nested or concurrent parallel launches) does not touch the pool.

Compiled kernels are cached (`cache=True`, in __pycache__ beside the sources). Numba keys a cached function on
its own file alone, but ours inline intrinsics and decoders from the other files of this package, so a change
to any of them must drop every cached kernel: `_drop_stale_cache` does that at import, keyed on a hash of the
package's sources.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numba

if numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"


def _drop_stale_cache() -> None:
    here = Path(__file__).resolve().parent
    cache = here / "__pycache__"
    h = hashlib.sha256(numba.__version__.encode())
    for f in sorted(here.glob("*.py")) + [here.parents[1] / "mathfn.py"]:
        h.update(f.read_bytes())
    stamp = cache / "strata-kernels.sha256"
    try:
        if stamp.read_text() == h.hexdigest():
            return
    except OSError:
        pass
    try:
        cache.mkdir(exist_ok=True)
        for f in cache.glob("*.nb[ic]"):
            f.unlink(missing_ok=True)
        stamp.write_text(h.hexdigest())
    except OSError:  # a read-only install: Numba then caches elsewhere, keyed on file stamps as usual
        pass


_drop_stale_cache()
