"""cuda_modules.ModuleSet: the CUDA modules compile together in threads from the device's opening, a use waits for its
own module only, a compile error reaches the caller, and a compile long enough to be a first run says so in one line.
Oracle: a stand-in for CuPy whose compiles sleep and record their threads (CI has no NVRTC); on the H200 the real
modules compile this way in every `gpu` test's engine."""

import threading
import time

import pytest

from strata.accel.gpu import cuda_modules
from strata.accel.gpu.cuda_modules import MODULES, ModuleSet

SLEEP = 0.2


class _FakeCp:
    def __init__(self, fail=None):
        self.threads, self.devices, self.fail = set(), [], fail
        fake = self

        class Device:
            def __init__(self, i):
                fake.devices.append(i)

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

        class RawModule:
            def __init__(self, code, options):
                self.code, self.options = code, options

            def compile(self):
                fake.threads.add(threading.current_thread().name)
                time.sleep(SLEEP)
                if fake.fail is not None and fake.fail in self.code:
                    raise RuntimeError("nvrtc: error")

        self.cuda = type("cuda", (), {"Device": Device})
        self.RawModule = RawModule


def test_every_module_compiles_at_once_in_threads_and_get_waits_for_its_own():
    cp, lines = _FakeCp(), []
    t0 = time.perf_counter()
    ms = ModuleSet(cp, 3, lines.append)
    assert time.perf_counter() - t0 < SLEEP                  # the constructor does not wait
    mod = ms.get("rows")
    assert "expert_rows_" in mod.code                         # rows_kernels.cu, its headers inlined
    assert mod.options == MODULES["rows"][1]
    for name in MODULES:
        ms.get(name)
    wall = time.perf_counter() - t0
    assert wall < SLEEP * len(MODULES) / 2, wall             # together, not one after another
    assert len(cp.threads) == len(MODULES) and all(n.startswith("nvrtc") for n in cp.threads)
    assert cp.devices == [3] * len(MODULES)                  # each loads into the engine's device
    assert ms.get("dequant").options == MODULES["dequant"][1]


def test_a_first_runs_compile_says_so_when_it_starts_and_ends(monkeypatch):
    lines = []
    ms = ModuleSet(_FakeCp(), 0, lines.append)
    for name in MODULES:
        ms.get(name)
    time.sleep(0.05)                                         # the last callback may run just after the last get
    assert lines == []                                       # done within SAY_AFTER_S: from the cache, nothing said
    monkeypatch.setattr(cuda_modules, "SAY_AFTER_S", 0.1)    # the fake compiles take 0.2 s
    ms = ModuleSet(_FakeCp(), 0, lines.append)
    for name in MODULES:
        ms.get(name)
    time.sleep(0.05)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"kernels: compiling {len(MODULES)} of {len(MODULES)} CUDA modules in parallel")
    assert lines[1].startswith("kernels: compiled in ")


def test_a_compile_error_reaches_the_caller_of_get():
    ms = ModuleSet(_FakeCp(fail="expert_rows_"), 0)
    ms.get("engine")
    with pytest.raises(RuntimeError, match="nvrtc"):
        ms.get("rows")
