"""The prompt experts' grouped GEMM alone: throughput on the expert shapes of the two bench models, this tree's
two kernels side by side (`gemm_grouped_mma128` over tiles of up to 128 rows, `gemm_grouped_mma` over 64-row
tiles), and optionally the same kernels of another git revision, timed in the same interleaved rounds.

python bench/gemm_kernel.py [--rows 8,32,56,128,512] [--experts 64] [--rounds 5] [--kernels mma128,mma]
                            [--against REV|FILE]

Each case is one launch over `--experts` experts with the same number of rows each (the tiles each kernel takes),
fp16 inputs, fp32 outputs. TFLOPS counts the useful products only (2·R·N·Kd). With --against, REV's
engine_kernels.cu is compiled beside this tree's and each of --kernels runs from both (REV's launch shape read
from its source: stop 43's and earlier kernels took 128 threads, BN columns, the 128-row one 4 stages of k32 in
dynamic shared memory). Every kernel runs on the same inputs in alternating order; `bits` says whether every
output equals the first kernel's.
Needs CUDA.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from strata.accel.gpu import dequant as dq
from strata.accel.gpu.cuda_experts import GEMM64, GEMM128, GemmLaunch
from strata.accel.moe import GEMM_BM, ROWS_TILE
from strata.accel.rows_host import group_tiles

ROOT = Path(__file__).resolve().parents[1]


def gemm_tiles(experts: int, rows: int, bm: int = GEMM_BM) -> np.ndarray:
    """The engine's GEMM tiles (g, start, end) of `experts` experts of `rows` rows each, one after another: one launch
    group whose members all take the scratch path (few_rows 0), as ExpertRunner.tables builds them."""
    tl, cut, _, _ = group_tiles(np.full(experts, rows, np.int64), np.arange(experts, dtype=np.int64) * rows,
                                np.zeros(1, np.int64), np.full(1, experts, np.int64), 0, ROWS_TILE,
                                np.full(1, bm, np.int64))
    return tl[cut[1]:cut[2]]
# (label, N, Kd): gate|up and down of qwen3-30b-a3b (D 2048, F 768) and flash-shape (D 2560, F 640)
SHAPES = (("qwen3 gate|up", 1536, 2048), ("qwen3 down", 2048, 768),
          ("flash gate|up", 1280, 2560), ("flash down", 2560, 640))


def _source_at(rev: str, name: str = "engine_kernels.cu") -> str:
    """cuda/`name` of git revision `rev` with its local headers inlined from the same revision; or, where `rev`
    names a file, that file (a source already flattened, for a machine without the repository's history)."""
    if Path(rev).is_file():
        return Path(rev).read_text()
    seen: set[str] = set()

    def flat(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = subprocess.run(["git", "show", f"{rev}:strata/accel/gpu/cuda/{name}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.replace("#pragma once\n", "")
        return re.sub(r'^#include "([^"]+)"\s*$', lambda m: flat(m.group(1)), text, flags=re.M)

    return flat(name)


def _launch_of(code: str, big: bool) -> GemmLaunch:
    """A source's launch shape for one of its two kernels: this tree's GemmLaunch where the source takes the
    templated tile (mma.cuh GEMM64_ARGS), else stop 43's fixed one (BN from `#define BN`)."""
    if "GEMM64_ARGS" in code:
        return GEMM128 if big else GEMM64
    bn = int(re.search(r"^#define BN (\d+)", code, re.M).group(1))
    return GemmLaunch(128, bn, 128, 4 * (128 + bn) * 40 * 2) if big else GemmLaunch(GEMM_BM, bn, 128, 0)


class Kernel:
    """One grouped-GEMM kernel of a source: `big` takes gemm_grouped_mma128 (128-row tiles), else gemm_grouped_mma
    (64-row tiles), each launched as its source sizes it."""

    def __init__(self, cp, code: str, name: str, big: bool = False):
        self.name = name
        self.fn = cp.RawModule(code=code, options=("--std=c++17",)).get_function(
            "gemm_grouped_mma128" if big else "gemm_grouped_mma")
        self.shape = _launch_of(code, big)
        if self.shape.smem:
            self.shape.prepare(self.fn)
        self.bm = self.shape.rows

    def __call__(self, out, a, w, tiles, n_tiles, stream):
        N, Kd = w.shape[1], w.shape[2]
        self.shape.launch(self.fn, n_tiles, N, (out, np.int32(out.shape[1]), a, np.int32(a.shape[1]), w, tiles,
                                                np.int32(N), np.int32(Kd)), stream)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="8,32,56,128,512", help="rows per expert, comma-separated")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10, help="launches per timing")
    ap.add_argument("--kernels", default="mma128,mma", help="this tree's kernels to run, comma-separated")
    ap.add_argument("--against", help="a git revision (or a flattened .cu file) whose kernels of --kernels run "
                                       "beside this tree's")
    args = ap.parse_args(argv)
    print(f"# python bench/gemm_kernel.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    import cupy as cp

    here = dq.source("engine_kernels.cu")
    names = args.kernels.split(",")
    kernels = [Kernel(cp, here, name, big=name == "mma128") for name in names]
    if args.against:
        there = _source_at(args.against)
        kernels += [Kernel(cp, there, f"{args.against}:{name}", big=name == "mma128") for name in names]
    print(f"# {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; {args.experts} experts a launch, "
          f"median of {args.rounds} rounds of {args.reps} launches, kernels alternating by round")
    head = "| shape | rows/expert | " + " | ".join(f"{k.name} ms (TFLOPS)" for k in kernels)
    print(head + "".join(f" | {k.name}/{kernels[0].name} | bits" for k in kernels[1:]) + " |")
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    for label, N, Kd in SHAPES:
        w = cp.asarray((rng.standard_normal((args.experts, N, Kd)) / 32).astype(np.float16))
        for rows in (int(r) for r in args.rows.split(",")):
            R = rows * args.experts
            a = cp.asarray(rng.standard_normal((R, Kd)).astype(np.float16))
            ts = {k.bm: gemm_tiles(args.experts, rows, k.bm) for k in kernels}
            tiles = {bm: cp.asarray(t) for bm, t in ts.items()}
            outs = [cp.full((R, N), np.nan, np.float32) for _ in kernels]
            cp.cuda.Device().synchronize()     # the inputs and tiles, made on the null stream, have landed: the
                                               # launches go on a non-blocking stream that does not wait for it
            times: list[list[float]] = [[] for _ in kernels]
            for rnd in range(args.rounds + 1):                      # round 0 warms up
                order = range(len(kernels)) if rnd % 2 == 0 else reversed(range(len(kernels)))
                for i in order:
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(stream)
                    for _ in range(args.reps):
                        kernels[i](outs[i], a, w, tiles[kernels[i].bm], len(ts[kernels[i].bm]), stream)
                    e1.record(stream)
                    e1.synchronize()
                    if rnd:
                        times[i].append(cp.cuda.get_elapsed_time(e0, e1) / args.reps)
            flops = 2.0 * R * N * Kd
            ms = [statistics.median(x) for x in times]
            cells = [f"{m:.3f} ({flops / m / 1e9:.0f})" for m in ms]
            line = f"| {label} | {rows} | " + " | ".join(cells)
            for i in range(1, len(kernels)):
                same = bool(cp.array_equal(outs[0], outs[i]))
                line += f" | {ms[i] / ms[0]:.2f}x | {'same' if same else 'DIFFER'}"
            line += " |"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
