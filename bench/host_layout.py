"""The host's layout window of a prompt layer, without a GPU: what GpuEngine.moe runs between the routing sync and
the first launch group (Stats.layout_s on the device: 2.2-3.0 ms a layer for flash-shape at 250-1,000 tokens on
the H200's host, share_f_full_stop25c.log), less its CUDA calls. The link idles once the ring's first blobs have
landed and until this work ends (prefill_timeline_stop25_detail.log), so its speed is prompt speed.

python bench/host_layout.py [--preset flash-shape] [--tokens 250,1000,2048] [--trace routing.npz] [--reps 30]

Per token count: the medians over --reps interleaved rounds of each step (routing counts, placement, row layout,
launch groups, the tables the kernels read: strata/accel/moe.py with the CUDA kernels' table packing, whose upload
is left out) and of the whole. Routing: a stored trace (bench/cpu_share.py's *_routing.npz: the engine's own, ids
[layers, T, K]) or Zipf; residency: the engine's uniform quarter (strata.accel.cache.uniform_order).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _PackOnly:
    """The CUDA kernels' layer_tables packing (rows_host.pack_layer) with the upload left out."""

    staging = SimpleNamespace(dbase=1 << 40)
    gemm_big_rows = 128

    def _st(self, stream):
        return self.staging

    def _room(self, nbytes, stream):
        return 0, np.empty(nbytes, np.uint8)

    def _send(self, off, nbytes, stream):
        pass

    def layer_tables(self, *args):
        from strata.accel.gpu.cuda_kernels import CudaKernels

        return CudaKernels.layer_tables(self, *args)


def pack_only_runner(group: int):
    """An ExpertRunner that forms launch groups and packs their tables (few rows: the engine's), with no device."""
    from strata.accel.moe import FEW_ROWS, ExpertRunner

    runner = ExpertRunner.__new__(ExpertRunner)
    runner.k, runner.dev = _PackOnly(), SimpleNamespace(compute=None)
    runner.bufs = SimpleNamespace(w_d=np.zeros((group, 1)))    # the weight scratch's depth: the group's
    runner.offsets, runner.few_rows = [(0, 1, 2)], FEW_ROWS
    return runner


def window(ids, resident, runner, ring: int, group: int, blob: int, clock=time.perf_counter) -> dict:
    """One layer's layout window as GpuEngine.moe runs it, step by step (µs)."""
    from strata.accel.moe import placement, row_layout
    from strata.policy.stream import walk_runs

    buf = SimpleNamespace(data=SimpleNamespace(ptr=1 << 30), strides=(blob,))
    t = [clock()]
    cnt = np.bincount(ids.ravel(), minlength=resident.size)
    t.append(clock())
    parts = placement(cnt, resident, ())
    t.append(clock())
    lay = row_layout(ids, cnt, parts)
    t.append(clock())
    res_groups = runner.resident_groups(lay.resident, lay)
    sgroups = walk_runs(list(range(len(lay.streamed))), group, ring)
    t.append(clock())
    plan = [(m, buf, np.arange(len(m))) for m in res_groups]
    plan += [([lay.streamed[k] for k in g], buf, np.asarray(g) % ring) for g in sgroups]
    runner.tables(0, plan, lay, riders=(lay.slot, lay.src))
    t.append(clock())
    names = ("counts", "placement", "row layout", "groups", "tables")
    return {n: (b - a) * 1e6 for n, a, b in zip(names, t, t[1:])} | {"window": (t[-1] - t[0]) * 1e6}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="flash-shape", help="sim.models name: its experts, k and sizes")
    ap.add_argument("--tokens", default="250,1000,2048")
    ap.add_argument("--trace", help="ids [layers, T, K] .npz of the model (bench/cpu_share.py); else Zipf routing")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--ring", type=int, default=64, help="the routed-only walk's ring (bench/cpu_share.py's plan: 64)")
    ap.add_argument("--group", type=int, default=16)
    a = ap.parse_args()
    from sim.models import model
    from strata.accel.cache import uniform_order

    m = model(a.preset)
    E, K = m.n_expert, m.k
    sizes = [int(x) for x in a.tokens.split(",")]
    rng = np.random.default_rng(0)
    if a.trace:
        with np.load(a.trace) as z:
            trace = np.asarray(z["ids"], np.int64)
        assert trace.shape[2] == K and trace.max() < E, f"{a.trace}: ids {trace.shape} are not {a.preset}'s"
        assert trace.shape[1] >= max(sizes), f"{a.trace} holds {trace.shape[1]} tokens, fewer than {max(sizes)}"
        ids_of = {T: trace[3, :T] for T in sizes}                      # a middle layer's first T tokens
    else:
        p = 1.0 / np.arange(1, E + 1) ** 0.8
        p /= p.sum()
        ids_of = {T: np.stack([rng.choice(E, K, replace=False, p=p) for _ in range(T)]) for T in sizes}
    resident = np.zeros(E, bool)                    # the uniform fill of a quarter of 4 layers' pairs: layer 3's
    resident[[e for l, e in uniform_order(4, E)[:E] if l == 3]] = True
    runner = pack_only_runner(a.group)
    blob = m.blob_bytes(0)
    got = {T: [] for T in sizes}
    for r in range(a.reps + 1):                      # interleaved sizes; the first round warms up
        for T in sizes:
            w = window(ids_of[T], resident, runner, a.ring, a.group, blob)
            if r:
                got[T].append(w)
    print(f"# {a.preset}: {E} experts, k {K}, {'traced' if a.trace else 'Zipf'} routing, {int(resident.sum())} "
          f"resident, ring {a.ring}, groups of {a.group}; medians of {a.reps} rounds, us")
    for T in sizes:
        med = {n: statistics.median(w[n] for w in got[T]) for n in got[T][0]}
        print(f"{T:6d} tokens: window {med['window']:7.0f} = " + " + ".join(
            f"{n} {v:.0f}" for n, v in med.items() if n != "window"))


if __name__ == "__main__":
    main()
