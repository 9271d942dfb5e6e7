"""In one process: the decode graph's expert GEMV (`moe_gemv`, decode_kernels.cu) of this tree against another
revision's (REV|FILE: a git revision, or its decode_kernels.cu flattened), CUDA only (bench/kernel_ab.py): alone on
one layer's routed experts of MODEL's quarter-cache engine, all resident and all read over PCIe from the arena
(gate|up and down as the graph launches them), then decode on two quarter-cache engines, logits compared bit for bit.

python bench/moe_gemv_ab.py MODEL.gguf ROUNDS REV|FILE"""
import sys

import numpy as np
import cupy as cp

from gemm_kernel import _source_at
from kernel_ab import AB
from strata.accel.gpu import dequant as dq
from strata.accel.gpu.cuda_decode import MG_ROWS, MG_STAGE, MG_WARPS

path, rounds, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
mod = cp.RawModule(code=_source_at(rev, "decode_kernels.cu"), options=("--std=c++17",))


def old_moe_gemv(out, x, x_div, ids, src, off, qtype, n, k, stream, glu=False):
    """CudaDecodeKernels.moe_gemv's launch, on REV's kernel (its launch shape: this tree's, as at stop 43)."""
    cls = dq.quants.get(qtype)
    f32 = x.dtype == np.float32
    nul = np.uint64(0)
    mod.get_function(f"moe_gemv_{dq.SUFFIX[qtype]}")(
        (-(-n // (MG_WARPS * MG_ROWS)), ids.size), (32 * MG_WARPS,),
        (out, np.int32(out.strides[0] // 4), x if f32 else nul, nul if f32 else x, np.int32(x.strides[0] // x.itemsize),
         np.int32(x_div), ids, src.slot_of, src.cache, np.int64(src.cache.strides[0]),
         np.uint64(src.arena.ctypes.data), np.int64(src.arena.strides[0]), np.int64(off), np.int32(n),
         np.int32(k // cls.block_size), np.int32(glu)),
        stream=stream.s, shared_mem=(k + k // 32) * 4 + MG_WARPS * MG_STAGE)


ab = AB(path, "moe_gemv", old_moe_gemv, rounds)
print(f"moe_gemv: old = {rev}'s kernel, new = this tree's", flush=True)
rng = np.random.default_rng(0)
en = ab.arms["new"][0]
ab.use("new")
en.reset()
en.prefill(rng.integers(0, ab.m.cfg.n_vocab, 16).tolist())
en.decode([1])                                              # builds the decode graph (its expert sources)
c = ab.m.cfg
D, F, K = c.n_embd, c.n_ff_exp, c.n_expert_used
for layer in (0, c.n_layer - 1):
    g = en.dgraph
    src = g.srcs[layer]
    slot_of = cp.asnumpy(src.slot_of)
    tg, tu, td = g.arena.types[layer]
    _, up, down = g.offsets[layer]
    for label, pick in (("resident", np.flatnonzero(slot_of >= 0)), ("over PCIe", np.flatnonzero(slot_of < 0))):
        if pick.size < K:
            continue
        ids = cp.asarray(rng.choice(pick, K, replace=False).astype(np.int32))
        h = cp.asarray(rng.standard_normal((1, D)).astype(np.float32))
        gu = cp.empty((K, 2 * F), np.float32)
        gu2 = cp.asarray(rng.standard_normal((K, 2 * F)).astype(np.float32))
        dm = cp.empty((K, D), np.float32)
        s = ab.dev.compute
        if tg == tu:
            ab.alone(f"layer {layer} gate|up {label}", lambda f: (f(gu, h, K, ids, src, 0, tg, 2 * F, D, s), (gu,))[1])
        ab.alone(f"layer {layer} down+glu {label}",
                 lambda f: (f(dm, gu2, 1, ids, src, down, td, D, F, s, glu=True), (dm,))[1])
ab.decode(rng)
