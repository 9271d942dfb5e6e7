"""A launch group's experts alone: the quantised grouped GEMM (`gemm_q`: each weight dequantised in the GEMM from the
blob's bytes) against the scratch path it replaces (`dequant` into fp16, then `gemm_grouped`), on the expert shapes
and types of the two bench models, interleaved rounds, medians, bits compared.

python bench/gemm_q.py [--rows 16,32,56,128,512] [--experts 16] [--rounds 7] [--reps 10]

Each case is one launch group: --experts experts of the same number of rows, their blobs in one device buffer (as
ring or cache slots), tiles cut as the engine cuts them (64-row tiles up to 64 rows an expert, else 128). `scratch`
times dequant + gemm_grouped, `gemm_q` the one kernel; `bits`: whether their outputs are equal. Needs CUDA.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from strata import quants
from strata.accel.gpu.kernels import BlobRef
from strata.accel.moe import GEMM_BM

# (label, type, N, K): gate|up and down of qwen3-30b-a3b Q4_K (D 2048, F 768) and flash-shape (IQ2_XS gate|up,
# IQ4_NL down; D 2560, F 640)
SHAPES = (("qwen3 gate|up Q4_K", 12, 1536, 2048), ("qwen3 down Q4_K", 12, 2048, 768),
          ("flash gate|up IQ2_XS", 17, 1280, 2560), ("flash down IQ4_NL", 20, 2560, 640))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="16,32,56,128,512", help="rows per expert, comma-separated")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=10, help="launches per timing")
    args = ap.parse_args(argv)
    print(f"# python bench/gemm_q.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    from strata.accel.device.cuda import CudaDevice

    c = CudaDevice()
    cp, s = c.cp, c.compute
    G = args.experts
    print(f"# {c.name}; {G} experts a launch, median of {args.rounds} rounds of {args.reps} launches, arms "
          f"alternating by round")
    print("| shape | rows/expert | scratch ms | gemm_q ms | gemm_q/scratch | gemm_q TFLOPS | blob GB/s | bits |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for label, qtype, N, K in SHAPES:
        cls = quants.get(qtype)
        nbytes = N * cls.row_bytes(K)
        buf = c.asarray(cls.random_blocks(rng, G * nbytes // cls.type_size, 1.0 / np.sqrt(K)).reshape(G, nbytes))
        tab = c.k.upload(c.k.blob_table([BlobRef(buf, g) for g in range(G)], 0), s)
        w = c.zeros((G, N, K), np.float16)
        for rows in (int(r) for r in args.rows.split(",")):
            R = rows * G
            bm = GEMM_BM if rows <= GEMM_BM else c.k.gemm_big_rows
            t = np.array([(g, r, min(r + bm, (g + 1) * rows)) for g in range(G)
                          for r in range(g * rows, (g + 1) * rows, bm)], np.int32)
            tiles = c.k.upload(t, s)
            a = c.asarray((rng.standard_normal((R, K)) / 4).astype(np.float16))
            outs = [c.zeros((R, N), np.float32), c.zeros((R, N), np.float32)]

            def scratch(out):
                c.k.dequant(w, tab, qtype, N, K, s)
                c.k.gemm_grouped(out, a, w, tiles, len(t), s, bm)

            def fused(out):
                c.k.gemm_q(out, a, tab, qtype, N, K, tiles, len(t), s, bm)

            arms = (scratch, fused)
            times: list[list[float]] = [[], []]
            for rnd in range(args.rounds + 1):                  # round 0 warms up (and compiles)
                for i in (0, 1) if rnd % 2 == 0 else (1, 0):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(s.s)
                    for _ in range(args.reps):
                        arms[i](outs[i])
                    e1.record(s.s)
                    e1.synchronize()
                    if rnd:
                        times[i].append(cp.cuda.get_elapsed_time(e0, e1) / args.reps)
            ms = [statistics.median(x) for x in times]
            same = np.array_equal(c.tohost(outs[0]).view(np.uint32), c.tohost(outs[1]).view(np.uint32))
            tflops = 2.0 * R * N * K / (ms[1] * 1e-3) / 1e12
            print(f"| {label} | {rows} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[1] / ms[0]:.3f} | {tflops:.0f} | "
                  f"{G * nbytes / (ms[1] * 1e-3) / 1e9:.0f} | {'equal' if same else 'DIFFER'} |", flush=True)
    c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
