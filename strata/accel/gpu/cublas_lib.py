"""cuBLAS called straight through ctypes, on the library CuPy has loaded (its handle, the same arithmetic).

CuPy's bindings refuse any cuBLAS call while a stream is capturing (cupy_backends' cublas.setStream raises
NotImplementedError), so a prompt's dense part could not become a graph through them (prompt_graph.py). The same
`cublasGemmEx` called here gave CuPy's wrapper's bits on the H200 (bench/results/h200/probe_stop34.log), and under
capture it needs a workspace of its own: cuBLAS may not allocate one while a stream captures (cuBLAS docs,
"CUDA Graphs Support"), so `set_workspace` gives the handle one at start, used outside graphs too.
"""

from __future__ import annotations

import ctypes

WORKSPACE_BYTES = 32 << 20        # cuBLAS's own default on Hopper is 32 MiB (cuBLAS docs, cublasSetWorkspace)


def _loaded() -> ctypes.CDLL:
    """The libcublas CuPy's bindings already loaded (not cublasLt): one library, so CuPy's handle is valid here."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            name = path.rsplit("/", 1)[-1]
            if name.startswith("libcublas.so"):
                return ctypes.CDLL(path)
    raise RuntimeError("libcublas is not loaded in this process (CuPy loads it with its cuBLAS handle)")


class Cublas:
    """The three calls the dense products need, with ctypes' argument types declared once."""

    def __init__(self):
        lib = self.lib = _loaded()
        V, I = ctypes.c_void_p, ctypes.c_int
        lib.cublasSetStream_v2.argtypes = [V, V]
        lib.cublasSetWorkspace_v2.argtypes = [V, V, ctypes.c_size_t]
        # handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, compute, algo
        lib.cublasGemmEx.argtypes = [V, I, I, I, I, I, V, V, I, I, V, I, I, V, V, I, I, I, I]

    def set_workspace(self, handle: int, ptr: int, nbytes: int) -> None:
        _check(self.lib.cublasSetWorkspace_v2(handle, ptr, nbytes), "cublasSetWorkspace")

    def gemm_ex(self, handle, stream_ptr, transa, transb, m, n, k, alpha, A, atype, lda, B, btype, ldb, beta, C,
                ctype, ldc, compute, algo) -> None:
        _check(self.lib.cublasSetStream_v2(handle, stream_ptr), "cublasSetStream")
        _check(self.lib.cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, atype, lda, B, btype, ldb, beta, C,
                                     ctype, ldc, compute, algo), "cublasGemmEx")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed: cublasStatus_t {status}")
