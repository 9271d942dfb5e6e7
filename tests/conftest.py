import os

# Numba's OpenMP layer spins next to numpy's BLAS threads (notes/tooling.md §5.2); the engine picks its
# layer itself, tests do the same before anything imports numba.
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import pytest


def _has_cuda() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (cupy sees none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
