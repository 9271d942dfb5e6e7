"""The Device interface: what the GPU engine needs from a device, implemented by CUDA (cuda.py, CuPy) and by a
host twin (host.py, numpy + one thread per stream) so the engine's orchestration runs in CI without a GPU.

Semantics follow CUDA's: work enqueued on a stream runs in order; an event recorded on a stream completes when
everything enqueued before it has run; `stream.wait(event)` makes later work on that stream wait for the event
as recorded at the time of the call. Host-side calls never block unless they say so (synchronize).
"""

from __future__ import annotations

import abc

import numpy as np


class DeviceError(RuntimeError):
    pass


class OutOfDeviceMemory(DeviceError):
    pass


class Event(abc.ABC):
    @abc.abstractmethod
    def record(self, stream: "Stream") -> None: ...

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the host until the event completes."""

    @abc.abstractmethod
    def query(self) -> bool:
        """True once the event has completed (never blocks)."""

    @abc.abstractmethod
    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end` (both completed)."""


class Stream(abc.ABC):
    name: str

    @abc.abstractmethod
    def wait(self, event: Event) -> None:
        """Later work on this stream waits for `event` (as last recorded)."""

    @abc.abstractmethod
    def synchronize(self) -> None: ...


class Device(abc.ABC):
    """Arrays live in `xp` (numpy or cupy). Kernels are in `self.k` (an object with the same methods on both
    devices, see strata/accel/gpu/kernels.py for the list); each takes `stream=` and is asynchronous."""

    kind: str            # "cuda" | "host"
    name: str
    xp: object           # the array module of device arrays
    compute: Stream
    copy: Stream
    side: Stream         # a second compute stream: a layer-major prompt's deferred MoE blocks (moe_block.py)
    link_gbps: float | None = None   # an emulated host->device link (emulate_link); None = the real one
    _bump: "Bump | None" = None      # the open segment's allocator (begin_segment)

    def emulate_link(self, gbps: float | None) -> None:
        """From now on every h2d copy of n bytes occupies its stream for at least n / gbps (STRATA_DBG_LINK_GBPS:
        a slower PCIe than this machine's, for "what if" runs). The real copy still runs at full speed inside
        that time, so host-memory contention is the real link's; only the stream's time is stretched."""
        if gbps is not None and not gbps > 0:
            raise ValueError(f"an emulated link needs a bandwidth above 0 GB/s, got {gbps!r}")
        self.link_gbps = gbps

    @property
    def link_ticks_per_ns(self) -> float | None:
        """The emulated link's timer calibration, where it has one (CUDA); None elsewhere."""
        return None

    # --- memory -----------------------------------------------------------------------------------------
    OutOfMemory: type = MemoryError      # what an allocation past the device's memory (or its budget) raises

    @abc.abstractmethod
    def empty(self, shape, dtype) -> object: ...

    def zeros(self, shape, dtype) -> object:
        a = self.empty(shape, dtype)
        a[...] = 0
        return a

    @abc.abstractmethod
    def pinned(self, nbytes: int) -> np.ndarray:
        """A page-locked host buffer of `nbytes` (uint8), the only kind async copies may use."""

    def host_buffer(self, nbytes: int) -> np.ndarray:
        """A host buffer of `nbytes` (uint8) to fill, then page-lock with `pin` (the arena: filling pageable memory
        and locking it after is faster than filling page-locked memory allocated as such, on CUDA)."""
        return np.empty(nbytes, np.uint8)

    def pin(self, buf: np.ndarray) -> None:
        """Page-lock a `host_buffer` for async copies and the device's reads, for as long as it lives."""

    @abc.abstractmethod
    def h2d(self, dst, src: np.ndarray, stream: Stream) -> None:
        """Asynchronous host -> device copy of `src` (pinned) into device array `dst` (same nbytes); with an
        emulated link, the stream is held until n / link_gbps after the copy started."""

    def h2d_ms(self, dst, src: np.ndarray, reps: int = 1) -> float:
        """Mean milliseconds of `reps` copies of pinned `src` into `dst` on the copy stream, timed by events on it
        (from when the stream reaches the first: what it already holds is not counted)."""
        e0, e1 = self.event(), self.event()
        e0.record(self.copy)
        for _ in range(reps):
            self.h2d(dst, src, self.copy)
        e1.record(self.copy)
        e1.synchronize()
        return e0.elapsed_ms(e1) / reps

    def h2d_rows(self, dst, row: int, src: np.ndarray, stream: Stream) -> None:
        """Asynchronous copy of pinned `src` ([m, n] bytes, or [n]: one row) into rows row .. row+m-1 of the 2-D
        device array `dst`, each row's first n bytes (expert blobs into cache or ring slots). This base version
        copies row by row through `h2d`; a device may issue it without per-row device views (CudaDevice)."""
        src = src.reshape(-1, src.shape[-1]).view(np.uint8)
        m, n = src.shape
        assert 0 <= row and row + m <= dst.shape[0] and n <= dst.shape[1] * dst.itemsize, \
            f"rows {row}..{row + m - 1} of {n} bytes do not fit {dst.shape} {dst.dtype}"
        for i in range(m):
            self.h2d(dst[row + i].view(np.uint8)[:n], src[i], stream)

    @abc.abstractmethod
    def d2h(self, dst: np.ndarray, src, stream: Stream) -> None:
        """Asynchronous device -> host copy into pinned `dst`."""

    @abc.abstractmethod
    def asarray(self, host: np.ndarray) -> object:
        """A synchronous upload (setup time only, never in a loop)."""

    @abc.abstractmethod
    def tohost(self, arr) -> np.ndarray:
        """A synchronous download (setup, tests)."""

    @abc.abstractmethod
    def free_bytes(self) -> int: ...

    @abc.abstractmethod
    def total_bytes(self) -> int: ...

    # --- sync -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def event(self, timing: bool = True) -> Event:
        """A new event. timing=False: for ordering and waiting only, never `elapsed_ms` (CUDA:
        cudaEventDisableTiming, the kind the runtime records and waits on most cheaply)."""

    @abc.abstractmethod
    def map_words(self, words: np.ndarray) -> object:
        """Make host words (int64, contiguous, alive as long as the device) readable by `wait_words`; returns
        the handle to pass there. Once per buffer."""

    @abc.abstractmethod
    def wait_words(self, handle, index: int, value: int, stream: Stream) -> None:
        """Later work on `stream` waits until host word `index` of a mapped buffer reaches `value` (another
        host thread writes it: the CPU pool's count of finished tiles), without blocking the caller."""

    def synchronize(self) -> None:
        for s in (self.compute, self.side, self.copy):
            s.synchronize()

    @abc.abstractmethod
    def on(self, stream: Stream):
        """Context manager: array arithmetic written as Python operators runs on `stream` inside it."""

    def capture(self, fn) -> "Graph":
        """Record the work `fn()` enqueues on the compute stream once; `Graph.launch()` replays it on that stream.
        fn must enqueue nothing elsewhere and must read whatever changes between launches from device memory.
        The arrays fn allocates stay allocated while the graph lives (a replay writes them again)."""
        return Graph(fn)

    def begin_segment(self, region, capture: bool) -> None:
        """Until `end_segment`, every allocation (`empty`, and on CUDA the kernels' own temporaries) is carved from
        `region` (a flat uint8 device array) from its start and never freed; with `capture`, the compute stream's
        work is recorded, not run, into the graph `end_segment` returns. An eager segment that outgrows `region`
        goes on in the memory pool (`spilled`); a capture may not (prompt_graph.py captures only what ran within
        its region eagerly)."""
        self._bump = Bump(region, spill=not capture)

    def end_segment(self) -> tuple["Graph | None", int, bool]:
        """(the captured graph or None, bytes carved, spilled)."""
        b, self._bump = self._bump, None
        return None, b.used, b.spilled

    def close(self) -> None:
        pass


class Bump:
    """Offsets into a flat uint8 region, ALIGN-aligned, none reused: `begin_segment`'s allocator and the step
    buffers' (buffers.Carver). region None counts without a bound (a dry run). Past the region's end: None where
    `spill` (the caller takes the bytes elsewhere), else MemoryError."""

    ALIGN = 256

    def __init__(self, region=None, spill: bool = False):
        self.region, self.spill, self.used, self.spilled = region, spill, 0, False

    def take(self, nbytes: int) -> int | None:
        """The offset of `nbytes` new bytes, or None when they do not fit and may spill."""
        start = -(-self.used // self.ALIGN) * self.ALIGN
        if self.region is not None and start + nbytes > self.region.nbytes:
            if not self.spill:
                raise MemoryError(f"{start + nbytes} bytes carved, the region has {self.region.nbytes}")
            self.spilled = True
            return None
        self.used = start + nbytes
        return start

    def view(self, shape, dtype):
        """A new [shape] dtype array in the region, or None (spilled)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        off = self.take(n)
        return None if off is None else self.region[off:off + n].view(dt).reshape(shape)


class Graph:
    """A captured piece of compute-stream work. This base class (the host twin's) replays by calling fn again."""

    def __init__(self, fn):
        self.fn = fn
        self.launches = 0

    def launch(self) -> None:
        self.launches += 1
        self.fn()


def get_device(kind: str = "auto", log=None, budget_bytes: int | None = None, gemm: str = "mma") -> Device:
    """`cuda`, `host` or `auto` (CUDA if CuPy sees a GPU; else None, with a one-line note: use the CPU)."""
    if kind in ("cuda", "auto"):
        try:
            from strata.accel.device.cuda import CudaDevice

            return CudaDevice(budget_bytes=budget_bytes, gemm=gemm, log=log)
        except Exception as e:  # noqa: BLE001 - any failure to reach CUDA means "no GPU here"
            if kind == "cuda":
                raise DeviceError(f"--device cuda: no usable CUDA device ({e})") from None
            if log:
                log(f"no CUDA device ({str(e).splitlines()[0][:100]}); running on the CPU")
            return None
    if kind == "host":
        from strata.accel.device.host import HostDevice

        return HostDevice()
    raise DeviceError(f"unknown device {kind!r} (auto, cuda, cpu, host)")
