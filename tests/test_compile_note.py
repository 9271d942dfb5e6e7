"""compile_notice: a line while Numba compiles past its threshold, the count and time after; nothing when the body
compiles nothing (a cached or already compiled kernel) or compiles faster than the threshold."""

import threading
import time

from numba import njit

from strata.accel.cpu.compile_note import compile_notice


def _fresh():
    """A function Numba has not compiled (a new dispatcher each call, not cached)."""
    return njit(cache=False)(lambda x: x * 2)


def test_a_long_compile_is_said_and_counted():
    lines = []
    with compile_notice(lines.append, after_s=0.05):
        _fresh()(1)
        time.sleep(0.3)                 # the body outlasts the threshold after its compile began
    assert len(lines) == 2, lines
    assert lines[0].startswith("compiling the CPU kernels (Numba")
    assert lines[1].startswith("compiled 1 Numba functions in ")


def test_a_compile_in_another_thread_counts():
    lines = []
    with compile_notice(lines.append, what="x", after_s=0.05):
        t = threading.Thread(target=lambda: _fresh()(2))
        t.start()
        t.join()
        time.sleep(0.3)
    assert [s.split(" ")[0] for s in lines] == ["compiling", "compiled"], lines


def test_nothing_compiled_says_nothing():
    f = _fresh()
    f(1)                                # compiled before the block
    lines = []
    with compile_notice(lines.append, after_s=0.0):
        f(3)
        time.sleep(0.1)
    assert lines == []


def test_a_quick_compile_says_nothing():
    lines = []
    with compile_notice(lines.append, after_s=30.0):
        _fresh()(1)
    assert lines == []
