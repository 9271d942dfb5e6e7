"""A first run's kernels compiled in processes of their own (strata/accel/cpu/warm.py): after the children, the
GPU engine (on its host twin; on CUDA with the prefill CPU share on, which lays rows out on the host, and off, the
device) and the CPU backend compile nothing of ours for the default model, so the parts and their argument types
(rows_host.warm, glue.warm, the scheduler's jobs, the families) are the ones those runs use. Child processes
with an empty Numba cache of their own (NUMBA_CACHE_DIR)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import sys
from numba.core import event
from strata.accel.cpu import warm
from strata.accel.__main__ import main
from strata.models import load
from strata.data import default_model_path as default_model

compiled = []
class Seen(event.Listener):
    def on_start(self, ev):
        pass
    def on_end(self, ev):
        f = ev.data["dispatcher"].py_func
        compiled.append(f"{f.__module__}.{f.__qualname__}")

m = load(default_model())
types = warm.model_types(m)
lines = []
w = warm.start(types, lines.append, min_cores=1)
if sys.argv[1] == "first":
    assert w is not None and sorted(w.names) == sorted(warm.parts(types)), (w and w.names)
    w.wait()
    assert lines[-1].startswith("compiled the CPU kernels in") and "not cached" not in lines[-1], lines
assert warm.start(types, lines.append, min_cores=1) is None, "a second start found cold parts"
event.register("numba:compile", Seen())
for dev in sys.argv[2:]:
    assert main(["generate", "--device", dev, "-n", "3", "--prompt", "def f(x):"]) == 0
ours = [c for c in compiled if c.startswith("strata.")]
assert not ours, ours
print("ok")
"""


def _child(tmp_path, *args, **env):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    r = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=env, timeout=900,
                       cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


def test_warm_children_leave_nothing_to_compile(tmp_path):
    _child(tmp_path, "first", "host", "cpu")


@pytest.mark.gpu
def test_warm_children_leave_nothing_to_compile_on_cuda(tmp_path):
    _child(tmp_path, "first", "cuda")                                     # the CPU share on: rows on the host
    _child(tmp_path, "again", "cuda", STRATA_PREFILL_CPU_SHARE="0")        # off: rows on the device


def test_a_bad_part_is_refused():
    r = subprocess.run([sys.executable, "-m", "strata.accel.cpu.warm", "nonsense"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 2 and "no part 'nonsense'" in r.stderr, r.stderr


def test_an_interrupted_wait_kills_the_children(monkeypatch):
    from strata.accel.cpu import warm

    procs = [(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]), open(os.devnull, "rb"))
             for _ in range(2)]
    w = warm.Warming(["a", "b"], procs, 0.0, None)

    def interrupted(*a, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(procs[0][0], "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        w.wait()
    for p, err in procs:
        assert subprocess.Popen.wait(p, timeout=10) != 0 and err.closed
