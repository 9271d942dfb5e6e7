"""A machine's first run compiles the CPU kernels in several processes at once. Numba compiles one function at a
time in a process (its compiler lock), and a first run's ~20 s is a few independent trees: the pool's scheduler
(its workers' side and its host's), the GPU engine's host layout (rows_host.py), the CPU backend's steps between
batches (glue.py), one row-kernel family per quant type of the model (entry.py). Each cold part compiles in a
child process, which writes Numba's cache; this process then loads it (~1 s) where it would have compiled.

    w = start(model_types(model), note)   # None when nothing is cold (every later run)
    ...                                   # anything that compiles nothing
    w.wait()                              # before the first use of the kernels

A part counts as cold when its sentinel function has no cache index. A child that fails costs nothing but time:
whatever it did not cache compiles here, as before. `python -m strata.accel.cpu.warm PART...` runs parts here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from strata.accel.cpu import entry

CPU_PARTS = ("sched", "plan", "family", "glue")     # the CPU backend's parts (the layout is the GPU engine's)
GPU_PARTS = ("sched", "plan", "family", "layout")   # the GPU engine's (its CPU pool takes experts only)
MIN_CORES = 4          # on 2 cores the children took as long as this process alone (21 s, the default model)
WAIT_S = 600           # a child past this is left to finish alone; this process compiles what it lacks itself


def _cached(dispatcher) -> bool:
    """Whether Numba's cache holds an index for this function (any signature). Numba's private layout: where it
    moves, every part counts as cached and nothing is spawned (the kernels compile here, as before)."""
    try:
        return os.path.exists(dispatcher._cache._cache_file._index_path)
    except AttributeError:
        return True


def _sched_sentinel():
    from strata.accel.cpu import _sched
    return _sched.step


def _layout_sentinel():
    from strata.accel import rows_host
    return rows_host.pack_layer


def _pool_types():
    """Numba's types of the pool's scheduler arguments: an int, a flag, int64 [n] and [n, m], uint8 [n]."""
    from numba import typeof

    return (typeof(0), typeof(True), typeof(np.zeros(1, np.int64)), typeof(np.zeros((1, 1), np.int64)),
            typeof(np.zeros(1, np.uint8)))


def _warm_sched() -> None:
    """The workers' side of the pool's scheduler: `step` and everything it links (the tiles' work, quantisers,
    attention; the row kernels are called by address, entry.py), at the signature pool.py calls it with."""
    from strata.accel.cpu import _sched as S

    i, b, a1, _, _ = _pool_types()
    S.step.compile((a1, i, i, i, b))


def _warm_plan() -> None:
    """The host's side of the pool's scheduler: a batch's tiles and its publication, the host's park, ctl words."""
    from strata.accel.cpu import _sched as S

    i, b, a1, a2, u1 = _pool_types()
    S.launch.compile((a1, i, a2, a1, i, u1, b))
    S.park_host.compile((a1, i))
    S.ctl_load.compile((a1, i))
    S.ctl_add.compile((a1, i, i))
    S.ctl_store.compile((a1, i, i))
    S.tick_count.compile(())


def _plan_sentinel():
    from strata.accel.cpu import _sched
    return _sched.launch


def _warm_layout() -> None:
    from strata.accel import rows_host
    rows_host.warm()


def _glue_sentinel():
    from strata.accel.cpu import glue
    return glue.expert_plan


def _warm_glue() -> None:
    from strata.accel.cpu import glue
    glue.warm()


def parts(types) -> dict[str, tuple]:
    """name -> (sentinel dispatcher getter, compile function) of the scheduler, the layout, and the families of
    `types` (ggml ids without a CPU kernel are skipped)."""
    out = {"sched": (_sched_sentinel, _warm_sched), "plan": (_plan_sentinel, _warm_plan),
           "layout": (_layout_sentinel, _warm_layout),
           "glue": (_glue_sentinel, _warm_glue)}
    for i in sorted({entry.family_of(t) for t in types if entry.has_kernel(t)}):
        fam = entry.FAMILIES[i]
        out[f"family-{i}"] = ((lambda f=fam: f[0]), (lambda f=fam: entry.ensure(f[2][0])))
    return out


def model_types(model) -> set[int]:
    return {model.qtype(n) for n in model.tensors.names}


class Warming:
    """The children compiling a first run's cold parts."""

    def __init__(self, names: list[str], procs: list, t0: float, note):
        self.names, self._procs, self._t0, self._note = names, procs, t0, note

    def wait(self) -> None:
        failed = []
        try:
            for name, (p, err) in zip(self.names, self._procs):
                try:
                    if p.wait(timeout=max(1.0, WAIT_S - (time.perf_counter() - self._t0))) != 0:
                        err.seek(0)
                        tail = err.read().decode(errors="replace").strip()[-300:]
                        failed.append(f"{name} (exit {p.returncode}: {tail})")
                except subprocess.TimeoutExpired:
                    failed.append(f"{name} (still compiling after {WAIT_S} s)")
        except BaseException:            # an interrupt (Ctrl-C) takes the children with it
            for p, _ in self._procs:
                if p.poll() is None:
                    p.kill()
            raise
        finally:
            for _, err in self._procs:
                err.close()
        if self._note:
            msg = f"compiled the CPU kernels in {len(self.names)} processes in {time.perf_counter() - self._t0:.1f} s"
            self._note(msg + (f"; not cached, compiling here: {'; '.join(failed)}" if failed else ""))


def start(types, note=None, only=None, min_cores: int = MIN_CORES) -> Warming | None:
    """Spawn one child per cold part (of `only`, where given: "sched", "layout", "glue", "family"); None when none
    is cold, or on a machine of fewer than `min_cores` cores (the parts then compile here, one after another)."""
    from strata.accel.cpu.pool import available_cores

    if available_cores() < min_cores:
        return None
    cold = [n for n, (sentinel, _) in parts(types).items()
            if (only is None or n.split("-")[0] in only) and not _cached(sentinel())]
    if not cold:
        return None
    root = str(Path(__file__).resolve().parents[3])          # the children import this same source tree
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spec = ",".join(str(t) for t in sorted(types))
    if note:
        note(f"compiling the CPU kernels in {len(cold)} processes (a first run on this machine: Numba caches them "
             f"for the next) ...")
    t0 = time.perf_counter()
    procs = []
    for n in cold:
        err = tempfile.TemporaryFile()                # a child's error, for the line that says it failed
        procs.append((subprocess.Popen([sys.executable, "-m", "strata.accel.cpu.warm", "--types", spec, n], env=env,
                                       stdout=subprocess.DEVNULL, stderr=err), err))
    return Warming(cold, procs, t0, note)


def main(argv: list[str]) -> int:
    types: set[int] = set()
    if argv[:1] == ["--types"]:
        types = {int(t) for t in argv[1].split(",") if t}
        argv = argv[2:]
    table = parts(types)
    for name in argv:
        if name not in table:
            print(f"strata.accel.cpu.warm: no part {name!r} (parts: {', '.join(table)})", file=sys.stderr)
            return 2
        table[name][1]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
