"""The host twin of a CUDA device: numpy arrays, one worker thread per stream, events completed in stream order.

It exists so the GPU engine's orchestration (ring reuse, event ordering, row layout, combine) runs in CI: a
missing `wait` or a slot reused before its `used` event shows up here as a wrong result, because copies and
kernels really run concurrently on separate threads. `delay_s` (per copy) widens those races in tests.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from strata.accel.device.base import Device, Event, Graph, Stream

_STOP = object()


class HostEvent(Event):
    def __init__(self, timing: bool = True):
        self._done = threading.Event()
        self._done.set()          # an event never recorded counts as complete (CUDA does the same)
        self._t = 0.0
        self.timing = timing      # CUDA refuses elapsed_ms on an event without timing: so does the twin

    def record(self, stream: "HostStream") -> None:
        done = threading.Event()
        self._done = done

        def fire():
            self._t = time.perf_counter()
            done.set()

        stream._put(fire)

    def synchronize(self) -> None:
        self._done.wait()

    def query(self) -> bool:
        return self._done.is_set()

    def elapsed_ms(self, end: "HostEvent") -> float:
        assert self.timing and end.timing, "elapsed_ms between events made with timing=False"
        self.synchronize()
        end.synchronize()
        return (end._t - self._t) * 1e3


class HostStream(Stream):
    """A stream with its own worker thread, or (inline=True) one that runs work on the calling thread at once:
    the twin's compute stream is inline, so array arithmetic the model code does on the engine thread stays in
    stream order; the copy stream has a thread, so copies really race with compute."""

    def __init__(self, name: str, inline: bool = False):
        self.name = name
        self.inline = inline
        self.tape: list | None = None     # capturing (begin_segment): work is recorded here, not run
        self._q: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = None
        if not inline:
            self._thread = threading.Thread(target=self._run, name=f"stream-{name}", daemon=True)
            self._thread.start()

    def _run(self):
        while True:
            fn = self._q.get()
            if fn is _STOP:
                return
            try:
                if self._error is None:
                    fn()
            except BaseException as e:  # noqa: BLE001 - surfaced at the next synchronize
                self._error = e
            finally:
                self._q.task_done()

    def _put(self, fn) -> None:
        if self.tape is not None:
            self.tape.append(fn)
        elif self.inline:
            fn()
        else:
            self._q.put(fn)

    def wait(self, event: HostEvent) -> None:
        done = event._done          # the record in force now, as CUDA's cudaStreamWaitEvent
        self._put(done.wait)

    def synchronize(self) -> None:
        if self.inline:
            return
        self._q.join()
        if self._error is not None:
            e, self._error = self._error, None
            raise RuntimeError(f"stream {self.name}: enqueued work failed: {e!r}") from e

    def close(self):
        if not self.inline:
            self._q.put(_STOP)


class HostDevice(Device):
    kind = "host"
    xp = np

    def __init__(self, total_bytes: int = 64 << 30, delay_s: float = 0.0):
        from strata.accel.gpu.host_kernels import HostKernels

        self.name = "host twin"
        self._total = total_bytes
        self.delay_s = delay_s
        self.compute = HostStream("compute", inline=True)
        self.side = HostStream("side")        # a thread of its own: a wait missing between it and compute shows
        self.copy = HostStream("copy")
        self.k = HostKernels(self)

    def empty(self, shape, dtype):
        got = None if self._bump is None else self._bump.view(shape, dtype)     # an open segment's region
        return np.empty(shape, dtype) if got is None else got

    def begin_segment(self, region, capture: bool) -> None:
        super().begin_segment(region, capture)
        if capture:
            self.compute.tape = []

    def end_segment(self):
        tape, self.compute.tape = self.compute.tape, None
        _, used, spilled = super().end_segment()
        return (None if tape is None else TapeGraph(self.compute, tape)), used, spilled

    def pinned(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def h2d(self, dst, src, stream):
        assert dst.nbytes == src.nbytes, f"h2d of {src.nbytes} bytes into {dst.nbytes}"
        delay = self.delay_s
        hold = src.nbytes / (self.link_gbps * 1e9) if self.link_gbps else 0.0

        def run():
            t0 = time.perf_counter()
            if delay:
                time.sleep(delay)
            dst.reshape(-1).view(np.uint8)[:] = src.reshape(-1).view(np.uint8)
            if hold:
                time.sleep(max(0.0, t0 + hold - time.perf_counter()))

        stream._put(run)

    def d2h(self, dst, src, stream):
        assert dst.nbytes == src.nbytes, f"d2h of {src.nbytes} bytes into {dst.nbytes}"
        stream._put(lambda: dst.reshape(-1).view(np.uint8).__setitem__(slice(None), src.reshape(-1).view(np.uint8)))

    def asarray(self, host):
        return np.array(host, copy=True)

    def tohost(self, arr):
        self.synchronize()
        return np.array(arr, copy=True)

    def free_bytes(self) -> int:
        return self._total

    def total_bytes(self) -> int:
        return self._total

    def event(self, timing: bool = True) -> HostEvent:
        return HostEvent(timing)

    def map_words(self, words):
        assert words.dtype == np.int64 and words.flags.c_contiguous
        return words

    def wait_words(self, handle, index, value, stream):
        def spin():
            while handle[index] < value:
                time.sleep(0)

        stream._put(spin)

    def on(self, stream):
        import contextlib

        return contextlib.nullcontext()

    def synchronize(self):
        for s in (self.compute, self.side, self.copy):
            s.synchronize()

    def close(self):
        for s in (self.compute, self.side, self.copy):
            s.close()


class TapeGraph(Graph):
    """A captured segment on the twin: the work its kernels enqueued (closures over their arrays), enqueued again
    on every launch, as a CUDA graph replays its kernels on the same addresses."""

    def __init__(self, stream: HostStream, tape: list):
        super().__init__(None)
        self.stream, self.tape = stream, tape

    def launch(self) -> None:
        self.launches += 1
        for fn in self.tape:
            self.stream._put(fn)
