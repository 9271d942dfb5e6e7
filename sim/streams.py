"""SimPy processes of the hardware: in-order device streams, the copy engine's link, the CPU pool.

A ``Stream`` behaves as a CUDA stream: op k starts when op k-1 ended and every event it waits on fired, and
its completion is an event (a recorded CUDA event). Durations may be callables, evaluated when the op starts
(contention: a copy issued while the CPU pool reads DRAM runs slower). Times are µs; a ``Timeline`` logs
(name, start_us) pairs, in the order the ops end, for tests that compare whole timelines (STYLE 14).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable

import simpy

Duration = float | Callable[[], float]


class Timeline:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.events: list[tuple[str, float]] = []
        self.busy_us: dict[str, float] = defaultdict(float)  # per-op breakdown by category

    def log(self, name: str, t_us: float) -> None:
        if self.enabled:
            self.events.append((name, round(t_us, 3)))

    def add(self, category: str, dur_us: float) -> None:
        self.busy_us[category] += dur_us


class Stream:
    def __init__(self, env: simpy.Environment, name: str, timeline: Timeline):
        self.env, self.name, self.timeline = env, name, timeline
        self.tail: simpy.Event | None = None

    def op(
        self, name: str, dur: Duration, waits: Iterable[simpy.Event | None] = (), category: str = ""
    ) -> simpy.Event:
        done = self.env.event()
        deps = [w for w in (self.tail, *waits) if w is not None and not w.processed]
        self.env.process(self._run(name, dur, deps, done, category or name))
        self.tail = done
        return done

    def mark(self) -> simpy.Event:
        """An event recorded on the stream now: fires when the stream reaches it (value: that time)."""
        return self.op("", 0.0)

    def _run(self, name, dur, deps, done, category):
        for d in deps:
            if not d.processed:
                yield d
        start = self.env.now
        t = dur() if callable(dur) else dur
        if t > 0:
            yield self.env.timeout(t)
        if name:
            self.timeline.log(f"{self.name}:{name}", start)
            self.timeline.add(category, t)
        done.succeed(self.env.now)


class CpuPool:
    """The CPU expert pool: one job (a layer's CPU experts) at a time; ``busy`` while it runs."""

    def __init__(self, env: simpy.Environment, timeline: Timeline):
        self.env, self.timeline = env, timeline
        self.busy = False

    def run(self, name: str, dur_us: float) -> simpy.Event:
        assert not self.busy, "the pool runs one layer's experts at a time"
        done = self.env.event()
        self.busy = True
        self.env.process(self._run(name, dur_us, done))
        return done

    def _run(self, name, dur_us, done):
        start = self.env.now
        yield self.env.timeout(dur_us)
        self.timeline.log(f"cpu:{name}", start)
        self.busy = False
        self.timeline.add("cpu experts", dur_us)
        done.succeed(self.env.now)


class Link:
    """The host-to-device copy engine: a stream whose ops cost what the link says (SimPy's ``Cable``
    pattern: the link owns its delay). Copies issued while the CPU pool is busy get less bandwidth."""

    def __init__(
        self,
        env: simpy.Environment,
        copy_us: Callable[[float, bool], float],
        pool: CpuPool,
        timeline: Timeline,
        run_us: Callable[[float, int, bool], float] | None = None,
    ):
        self.stream = Stream(env, "h2d", timeline)
        self.copy_us, self.pool, self.run_us = copy_us, pool, run_us

    def h2d(
        self, name: str, nbytes: float, waits: Iterable[simpy.Event | None] = (), count: int = 1
    ) -> simpy.Event:
        """``count`` copies of ``nbytes`` each, back to back (one op: a stream-all group)."""
        return self.stream.op(name, lambda: count * self.copy_us(nbytes, self.pool.busy), waits, "h2d copies")

    def h2d_run(self, name: str, nbytes: float, count: int, waits: Iterable[simpy.Event | None] = ()) -> simpy.Event:
        """One copy of ``count`` neighbouring blobs of ``nbytes`` (run_us: the cost of a queued copy that size)."""
        return self.stream.op(name, lambda: self.run_us(nbytes, count, self.pool.busy), waits, "h2d copies")
