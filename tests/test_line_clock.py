"""bench/line_clock.py, the clock behind bench/host_lines.py (a CUDA-only diagnostic that never runs in CI): a function
compiled again with a reading after each statement runs as before, reads in statement order (a loop once, after it;
branches and handlers inside), and names each reading by its line in the function's source."""

import os
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import line_clock as LC  # noqa: E402

SRC = '''
SCALE = 3


def f(xs, flag):
    total = 0
    for x in xs:
        total += x
    if flag:
        total *= SCALE
    else:
        total = -total
    try:
        raise KeyError
    except KeyError:
        total += 1
    return total


class Box:
    def g(self, n):
        a = n + 1
        return a * 2
'''


def _module():
    mod = types.ModuleType("line_clock_subject")
    mod.__file__ = "line_clock_subject.py"
    exec(compile(SRC, mod.__file__, "exec"), mod.__dict__)
    sys.modules[mod.__name__] = mod
    return mod


def test_readings_follow_the_statements(monkeypatch):
    import inspect
    import linecache

    mod = _module()
    linecache.cache[mod.__file__] = (len(SRC), None, SRC.splitlines(True), mod.__file__)
    monkeypatch.setattr(inspect, "getsourcefile", lambda obj: mod.__file__)
    LC.instrument_module_funcs([(mod, "f", "f")])
    LC.instrument_methods([(mod.Box, "g", "g")])
    LC.reset()
    assert mod.f([1, 2, 3], True) == 19 and mod.f([1], False) == 0
    assert mod.Box().g(4) == 10
    seen = [(lab, ln) for lab, ln, _ in LC.CKS]
    f_lines = [ln for lab, ln in seen if lab == "f"]
    # the first call: total, the loop (once), the if's branch then the if, the except body then the try
    assert f_lines[:6] == [2, 3, 6, 5, 12, 9]
    assert LC.line("f", 3) == "for x in xs:" and LC.line("f", 6) == "total *= SCALE"
    assert [ln for lab, ln in seen if lab == "g"] == [2]
    times = [t for _, _, t in LC.CKS]
    assert times == sorted(times)
    mod.SCALE = 5                                   # the module's own namespace: a later change is seen
    assert mod.f([1], True) == 6
