"""Diagnostic (tried at stop 41, not kept): the decode GEMV (engine_kernels.cu's gemv_f16/gemv_f32, `linear` at up
to GEMV_MAX_T tokens) as in the tree (A) against its vec loop under `#pragma unroll 4` (B) and `unroll 8` (C), and
each lane issuing four 16-byte weight loads before their products (D, fp16 weights only). Every variant adds in the
same order, so the bits must match A's. Kernels built from the tree's source with the loop's text replaced (an
assert says when the source has moved on); 7 interleaved rounds of back-to-back launches, medians. CUDA only.

python bench/gemv_loads.py        (bench/results/h200/gemv_ab_stop41.log)
"""

from __future__ import annotations

import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from strata.accel.gpu import dequant as dq  # noqa: E402

OLD_LOOP = """        for (int k = lane * 8; k + 8 <= Kd; k += 256) {
            float wf[8];"""
UNROLLED_LOOP = """        GEMV_UNROLL
        for (int k = lane * 8; k + 8 <= Kd; k += 256) {
            float wf[8];"""
OLD_VEC = "    if (vec) {\n        for (int k = lane * 8; k + 8 <= Kd; k += 256) {"
PREFETCH_VEC = """    if (vec) {
        int kk = lane * 8;
        if constexpr (sizeof(Wt) == 2) {
            for (; kk + 3 * 256 + 8 <= Kd; kk += 1024) {
                uint4 vv[4];
#pragma unroll
                for (int j = 0; j < 4; j++) vv[j] = __ldg(reinterpret_cast<const uint4*>(w + kk + 256 * j));
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float wf[8];
                    const u32 u[4] = {vv[j].x, vv[j].y, vv[j].z, vv[j].w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        wf[2 * i] = h2f((half_t)(u[i] & 0xffff));
                        wf[2 * i + 1] = h2f((half_t)(u[i] >> 16));
                    }
                    const int k = kk + 256 * j;
#pragma unroll
                    for (int t = 0; t < 8; t++) {
                        if (t >= T) break;
                        const float4 a = *reinterpret_cast<const float4*>(x + (long long)t * ldx + k);
                        const float4 b = *reinterpret_cast<const float4*>(x + (long long)t * ldx + k + 4);
                        acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                                  wf[6] * b.z + wf[7] * b.w;
                    }
                }
            }
        }
        for (int k = kk; k + 8 <= Kd; k += 256) {"""


def modules() -> dict:
    """The four variants' modules, compiled from the tree's engine_kernels.cu."""
    src, opts = dq.source("engine_kernels.cu"), ("--std=c++17",)
    assert src.count(OLD_LOOP) == 1 and src.count(OLD_VEC) == 1, "engine_kernels.cu's GEMV loop has moved on"
    unrolled = src.replace(OLD_LOOP, UNROLLED_LOOP)
    return {"A": cp.RawModule(code=src, options=opts),
            "B": cp.RawModule(code='#define GEMV_UNROLL _Pragma("unroll 4")\n' + unrolled, options=opts),
            "C": cp.RawModule(code='#define GEMV_UNROLL _Pragma("unroll 8")\n' + unrolled, options=opts),
            "D": cp.RawModule(code=src.replace(OLD_VEC, PREFETCH_VEC), options=opts)}


def main() -> None:
    fns = {k: (m.get_function("gemv_f16"), m.get_function("gemv_f32")) for k, m in modules().items()}
    rng = np.random.default_rng(0)
    shapes = [(1, 4096, 2048, 16), (1, 512, 2048, 16), (1, 2048, 4096, 16), (1, 151936, 2048, 16), (1, 128, 2048, 32),
              (1, 8192, 4096, 16), (4, 4096, 2048, 16), (1, 2048, 1536, 16)]
    s = cp.cuda.Stream(non_blocking=True)
    for T, N, K, wbits in shapes:
        wt = np.float16 if wbits == 16 else np.float32
        W = cp.asarray(rng.standard_normal((N, K)).astype(wt))
        x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
        outs = {k: cp.zeros((T, N), np.float32) for k in fns}
        idx = 0 if wbits == 16 else 1
        args = lambda o: (o, np.int32(N), x, np.int32(K), W, np.int32(N), np.int32(K), np.int32(T), np.int32(1))
        grid = (-(-N * 32 // 256),)
        reps = 20 if N > 100000 else 200
        times = {k: [] for k in fns}
        for r in range(7):
            for k, f in fns.items():
                for _ in range(5):
                    f[idx](grid, (256,), args(outs[k]), stream=s)
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(s)
                for _ in range(reps):
                    f[idx](grid, (256,), args(outs[k]), stream=s)
                e1.record(s); e1.synchronize()
                times[k].append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / reps)
        med = {k: float(np.median(v)) for k, v in times.items()}
        same = {k: bool(cp.array_equal(outs[k], outs["A"])) for k in fns}
        gb = N * K * (2 if wbits == 16 else 4) / 1e9
        print(f"T={T} N={N:6d} K={K} w{wbits}: " + "  ".join(f"{k} {med[k]:7.2f} us ({gb / med[k] * 1e6 / 1e3:5.2f} TB/s)" for k in fns)
              + "  " + " ".join(f"A/{k} x{med['A'] / med[k]:.3f}" for k in fns if k != 'A') + f"; bits same {same}")


if __name__ == "__main__":
    main()
