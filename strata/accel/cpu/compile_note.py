"""A line while Numba compiles: a machine's first run of the CPU backend compiles its kernels (21.5 s of a 22.9 s
`generate` on this 2-core dev box with the default model's families only, entry.py; 51.7 s of 52.9 when every
type's kernels compiled; ~1 s from Numba's cache after), and a load that says nothing for half a minute looks
hung. Numba signals each compile (not a load from its cache) as a `numba:compile` event, in whatever thread it
happens: the pool's workers compile kernels too.

    with compile_notice(note):       # note("compiling ...") once a compile has run 1 s, note("compiled ...") after
        ...
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from numba.core import event

SAY_AFTER_S = 1.0      # compiles done sooner pass without a word


class _Compiles(event.Listener):
    """Counts compile starts; the first one calls `first` (from the compiling thread)."""

    def __init__(self, first):
        self.n, self._first, self._lock = 0, first, threading.Lock()

    def on_start(self, ev) -> None:
        with self._lock:
            self.n += 1
            if self.n > 1:
                return
        self._first()

    def on_end(self, ev) -> None:
        pass


@contextmanager
def compile_notice(note, what: str = "the CPU kernels", after_s: float = SAY_AFTER_S, clock=time.perf_counter):
    """While the body runs: once Numba has been compiling for `after_s`, note one line that it is (a first run on
    this machine); at the end, when that line was said, one line with the count and the time."""
    lock, done = threading.Lock(), threading.Event()
    said, t0, timer = [False], [0.0], [None]

    def say() -> None:
        with lock:
            if not done.is_set():
                said[0] = True
                note(f"compiling {what} (Numba: a first run on this machine; they are cached for the next) ...")

    def first() -> None:
        t0[0] = clock()
        with lock:
            if done.is_set():
                return
            timer[0] = threading.Timer(after_s, say)
            timer[0].daemon = True
            timer[0].start()

    compiles = _Compiles(first)
    with event.install_listener("numba:compile", compiles):
        try:
            yield
        finally:
            with lock:
                done.set()
                if timer[0] is not None:
                    timer[0].cancel()
            if said[0]:
                note(f"compiled {compiles.n} Numba functions in {clock() - t0[0]:.1f} s")
