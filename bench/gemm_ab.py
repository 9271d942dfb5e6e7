"""In one process: the experts' grouped GEMMs of this tree against another revision's (bench/gemm_kernel.py's
REV|FILE: a git revision, or its engine_kernels.cu flattened), CUDA only (bench/kernel_ab.py): prompts and decode on
two quarter-cache engines, logits compared bit for bit. Each arm's `gemm_grouped` launches its own source's two
kernels (64- and 128-row tiles) as that source sizes them.

python bench/gemm_ab.py MODEL.gguf 250,900,2048,8192 ROUNDS REV|FILE"""
import sys

import numpy as np
import cupy as cp

from gemm_kernel import _launch_of, _source_at
from kernel_ab import AB
from strata.accel.gpu.cuda_experts import _tab_ptr
from strata.accel.moe import GEMM_BM

path, lengths, rounds, rev = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), sys.argv[4]
code = _source_at(rev)
mod = cp.RawModule(code=code, options=("--std=c++17",))
old = {}
for big in (False, True):
    fn = mod.get_function("gemm_grouped_mma128" if big else "gemm_grouped_mma")
    shape = _launch_of(code, big)
    if shape.smem:
        shape.prepare(fn)
    old[big] = fn, shape


def old_gemm_grouped(out, a, w, tiles, n_tiles, stream, max_rows=None):
    """CudaKernels.gemm_grouped's launch, on REV's kernels."""
    if not n_tiles:
        return
    N, Kd = w.shape[1], w.shape[2]
    fn, shape = old[max_rows is None or max_rows > GEMM_BM]
    shape.launch(fn, n_tiles, N, (out, np.int32(out.strides[0] // 4), a, np.int32(a.strides[0] // 2), w,
                                  _tab_ptr(tiles), np.int32(N), np.int32(Kd)), stream.s)


ab = AB(path, "gemm_grouped", old_gemm_grouped, rounds)
print(f"gemm_grouped: old = {rev}'s kernels, new = this tree's", flush=True)
rng = np.random.default_rng(0)
ab.prompts(lengths, rng)
ab.decode(rng, 8)
