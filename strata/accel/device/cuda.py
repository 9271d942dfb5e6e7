"""The CUDA device through CuPy: a compute and a copy stream (non-blocking), events, pinned host memory, and a
memory-pool limit that emulates a smaller card (`--vram-budget`)."""

from __future__ import annotations

import numpy as np

from strata.accel.device.base import Device, DeviceError, Event, Graph, Stream

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14           # <sys/mman.h>; advice only: a kernel without transparent huge pages ignores it


def _madvise_huge(ptr: int, nbytes: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes - nbytes % HUGE_PAGE), MADV_HUGEPAGE)


def _unregister(rt, ptr: int) -> None:
    try:
        rt.hostUnregister(ptr)
    except Exception:          # the process is exiting and the context is gone: nothing left to unlock
        pass


_LINK_SRC = r"""
extern "C" __global__ void strata_link_stamp(unsigned long long* t) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    t[0] = now;
}
extern "C" __global__ void strata_link_hold(const unsigned long long* t, unsigned long long ns) {
    unsigned long long now, end = t[0] + ns;
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now < end);
}
"""
# wait_words: one thread polls a mapped host word (volatile: each read crosses PCIe) until it reaches v; a pool
# that never finishes would hold the stream for ever, so past `limit_ns` the kernel traps (the context fails)
_WAIT_SRC = r"""
extern "C" __global__ void strata_wait_ge(const volatile long long* w, long long v, unsigned long long limit_ns) {
    unsigned long long t0, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (*w < v) {
        __nanosleep(500);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - t0 > limit_ns) __trap();
    }
}
"""
WAIT_LIMIT_S = 120.0
D2H = 2                  # cudaMemcpyDeviceToHost


class CudaEvent(Event):
    def __init__(self, cp, timing: bool = True):
        self.cp = cp
        self.ev = cp.cuda.Event(disable_timing=not timing)

    def record(self, stream: "CudaStream") -> None:
        self.ev.record(stream.s)

    def synchronize(self) -> None:
        self.ev.synchronize()

    def query(self) -> bool:
        return bool(self.ev.done)

    def elapsed_ms(self, end: "CudaEvent") -> float:
        return float(self.cp.cuda.get_elapsed_time(self.ev, end.ev))


class CudaStream(Stream):
    def __init__(self, cp, name: str):
        self.name = name
        self.s = cp.cuda.Stream(non_blocking=True)

    def wait(self, event: CudaEvent) -> None:
        self.s.wait_event(event.ev)

    def synchronize(self) -> None:
        self.s.synchronize()


class CudaGraph(Graph):
    """A CUDA graph of the compute stream's work (cudaStreamBeginCapture, relaxed mode) and every block its
    capture allocated, held so that no later allocation can take memory a replay writes."""

    def __init__(self, dev: "CudaDevice", fn):
        super().__init__(fn)
        cp, s = dev.cp, dev.compute.s
        self.s, held = s, []

        def alloc(n):
            mem = dev.pool.malloc(n)
            held.append(mem)
            return mem

        with s:
            fn()                  # eagerly first: kernels compiled, the pool holds blocks of every size fn takes
        s.synchronize()
        relaxed = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", 2)
        with cp.cuda.using_allocator(alloc), s:
            s.begin_capture(mode=relaxed)
            try:
                fn()
            finally:
                self.graph = s.end_capture()
        self.held = held

    def launch(self) -> None:
        self.launches += 1
        self.graph.launch(stream=self.s)


class CudaSegmentGraph(Graph):
    """A segment captured between `begin_segment` and `end_segment`: its arrays are the region's, which the caller
    keeps (every graph of one region writes the same bytes)."""

    def __init__(self, graph, s):
        super().__init__(None)
        self.graph, self.s = graph, s

    def launch(self) -> None:
        self.launches += 1
        self.graph.launch(stream=self.s)


class CudaDevice(Device):
    kind = "cuda"

    def __init__(self, device_id: int = 0, budget_bytes: int | None = None, gemm: str = "mma", log=None):
        import cupy as cp

        try:
            n = cp.cuda.runtime.getDeviceCount()
        except Exception as e:  # noqa: BLE001 - no driver / no device
            raise DeviceError(f"CUDA is not available: {e}") from None
        if n <= device_id:
            raise DeviceError(f"no CUDA device {device_id} ({n} present)")
        self.cp = cp
        self.xp = cp
        self.id = device_id
        self._dev = cp.cuda.Device(device_id)
        self._dev.use()
        props = cp.cuda.runtime.getDeviceProperties(device_id)
        self.name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.compute = CudaStream(cp, "compute")
        self.side = CudaStream(cp, "side")
        self.copy = CudaStream(cp, "copy")
        self.pool = cp.get_default_memory_pool()
        free, total = cp.cuda.runtime.memGetInfo()
        self._total = total
        self.budget = budget_bytes
        self.OutOfMemory = cp.cuda.memory.OutOfMemoryError
        if budget_bytes:
            self.pool.set_limit(size=int(budget_bytes))   # allocations past the budget fail like a full card
        from strata.accel.gpu.cuda_kernels import CudaKernels

        self.k = CudaKernels(self, gemm, log)       # log: a line when its modules took a first run's compile
        self._link_k = None
        self._wait_k = None

    def capture(self, fn) -> CudaGraph:
        return CudaGraph(self, fn)

    def on(self, stream: CudaStream):
        return stream.s

    def begin_segment(self, region, capture: bool) -> None:
        super().begin_segment(region, capture)
        bump, pool = self._bump, self.pool

        def alloc(n):                 # CuPy's allocator hook: the kernels' own temporaries come here too
            off = bump.take(n)
            return pool.malloc(n) if off is None else region.data + off

        self._seg_alloc = self.cp.cuda.using_allocator(alloc)
        self._seg_alloc.__enter__()
        self._capturing = capture
        if capture:
            self.compute.s.begin_capture(mode=getattr(self.cp.cuda.runtime, "streamCaptureModeRelaxed", 2))

    def end_segment(self):
        graph = None
        try:
            if self._capturing:
                graph = CudaSegmentGraph(self.compute.s.end_capture(), self.compute.s)
        finally:
            self._capturing = False
            self._seg_alloc.__exit__(None, None, None)
        _, used, spilled = super().end_segment()
        return graph, used, spilled

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype)

    def zeros(self, shape, dtype):
        return self.cp.zeros(shape, dtype)

    def pinned(self, nbytes: int) -> np.ndarray:
        mem = self.cp.cuda.alloc_pinned_memory(max(int(nbytes), 1))
        return np.frombuffer(mem, np.uint8, int(nbytes))          # the array keeps `mem` alive

    def host_buffer(self, nbytes: int) -> np.ndarray:
        """Anonymous memory advised into 2 MiB pages before its first touch: `pin` then locks a 512th of the
        pages 4 KiB ones take (bench/arena_pin.py: cudaHostAlloc pinned the 48-layer qwen3's 15.19 GiB arena at
        1.2 GiB/s, 12.6 s of a 13.2-s load, and filling it took 1.0 s)."""
        raw = np.empty(int(nbytes) + HUGE_PAGE, np.uint8)
        start = -raw.ctypes.data % HUGE_PAGE
        buf = raw[start:start + int(nbytes)]                 # its base, `raw`, owns the memory
        _madvise_huge(buf.ctypes.data, buf.nbytes)
        return buf

    def pin(self, buf: np.ndarray) -> None:
        """cudaHostRegister, portable and mapped: the device reads it at its host address (the decode graph's
        moe_gemv reads missed experts from the arena); unregistered as the buffer's owner goes (numpy clears an
        array's weak references before it frees the memory)."""
        import weakref

        rt = self.cp.cuda.runtime
        owner = buf if buf.base is None else buf.base
        ptr = buf.ctypes.data
        try:
            rt.hostRegister(ptr, buf.nbytes, 3)               # cudaHostRegisterPortable | cudaHostRegisterMapped
        except self.cp.cuda.runtime.CUDARuntimeError as e:
            raise DeviceError(f"could not page-lock {buf.nbytes / 2**30:.2f} GiB of host memory for {self.name} "
                              f"({e}): the arena must stay in RAM; close other programs or take a smaller quant "
                              f"of the model") from e
        weakref.finalize(owner, _unregister, rt, ptr)
        dptr = rt.pointerGetAttributes(ptr).devicePointer
        if dptr != ptr:
            raise DeviceError(f"pinned host memory at {ptr:#x} is at {dptr:#x} on {self.name}: the engine needs "
                              f"unified addressing (a 64-bit system with a GPU of compute capability 2.0 or newer)")

    def h2d(self, dst, src: np.ndarray, stream: CudaStream) -> None:
        assert dst.nbytes == src.nbytes, f"h2d of {src.nbytes} bytes into {dst.nbytes}"
        assert dst.flags.c_contiguous and src.flags.c_contiguous, "async copies need contiguous buffers"
        if self.link_gbps:
            self._link_stamp(stream)
        dst.data.copy_from_host_async(src.ctypes.data, src.nbytes, stream.s)
        if self.link_gbps:
            self._link_hold(stream, src.nbytes / self.link_gbps)

    def h2d_rows(self, dst, row: int, src: np.ndarray, stream: CudaStream) -> None:
        """Device.h2d_rows by raw pointers: one cudaMemcpyAsync when the rows are whole (m x n contiguous bytes),
        else one cudaMemcpy2DAsync; no CuPy view of dst, whose slicing cost more host time than the copy's issue
        (a lent cache slot's refill, a ring run: the engine thread issues hundreds a prompt)."""
        if self.link_gbps:                      # the emulated link holds the stream per copy (Device.h2d)
            return super().h2d_rows(dst, row, src, stream)
        n = src.shape[-1] * src.itemsize
        m = src.size * src.itemsize // n if n else 0
        pitch = dst.strides[0]
        assert src.flags.c_contiguous, "async copies need a contiguous source"
        assert 0 <= row and row + m <= dst.shape[0] and n <= pitch and dst.flags.c_contiguous, \
            f"rows {row}..{row + m - 1} of {n} bytes do not fit {dst.shape} {dst.dtype}"
        rt = self.cp.cuda.runtime
        base = dst.data.ptr + row * pitch
        if n == pitch or m == 1:
            rt.memcpyAsync(base, src.ctypes.data, m * n, rt.memcpyHostToDevice, stream.s.ptr)
        else:
            rt.memcpy2DAsync(base, pitch, src.ctypes.data, n, n, m, rt.memcpyHostToDevice, stream.s.ptr)

    # --- the emulated link (Device.emulate_link): a one-thread kernel stamps %globaltimer on the stream before the
    # copy, another spins after it until the stamp + n / GB/s (one SM's single block, for that long)
    def emulate_link(self, gbps: float | None) -> None:
        super().emulate_link(gbps)
        if gbps and self._link_k is None:
            self._link_k = self._link_calibrated()

    def _link_calibrated(self):
        """Compile the pair (now, not inside the first timed copy) and read how many %globaltimer ticks one
        nanosecond of CUDA event time spans: PTX calls the timer nanoseconds, but nothing here relies on it."""
        cp, s = self.cp, self.copy.s
        mod = cp.RawModule(code=_LINK_SRC)
        stamp, hold = mod.get_function("strata_link_stamp"), mod.get_function("strata_link_hold")
        t = cp.zeros(2, cp.uint64)
        e0, e1, nominal = cp.cuda.Event(), cp.cuda.Event(), 20_000_000
        stamp((1,), (1,), (t[:1],), stream=s)
        hold((1,), (1,), (t[:1], np.uint64(0)), stream=s)
        e0.record(s)
        stamp((1,), (1,), (t[:1],), stream=s)
        hold((1,), (1,), (t[:1], np.uint64(nominal)), stream=s)
        e1.record(s)
        e1.synchronize()
        ms = float(cp.cuda.get_elapsed_time(e0, e1))
        if not 1.0 < ms < 1000.0:
            raise DeviceError(f"the emulated link's timer is unusable here: {nominal / 1e6:g} ms of %globaltimer "
                              f"took {ms:.3f} ms of event time")
        slots = {id(self.copy): t[0:1], id(self.compute): t[1:2]}   # one stamp per stream, views made once
        return stamp, hold, slots, nominal / (ms * 1e6)          # timer ticks per ns

    @property
    def link_ticks_per_ns(self) -> float | None:
        """%globaltimer ticks per nanosecond of event time, as calibrated (None before a link is emulated)."""
        return self._link_k[3] if self._link_k is not None else None

    def _link_stamp(self, stream: CudaStream) -> None:
        stamp, _, slots, _ = self._link_k
        stamp((1,), (1,), (slots[id(stream)],), stream=stream.s)

    def _link_hold(self, stream: CudaStream, ns: float) -> None:
        _, hold, slots, ticks = self._link_k
        hold((1,), (1,), (slots[id(stream)], np.uint64(int(ns * ticks))), stream=stream.s)

    def d2h(self, dst: np.ndarray, src, stream: CudaStream) -> None:
        assert dst.nbytes == src.nbytes, f"d2h of {src.nbytes} bytes into {dst.nbytes}"
        assert dst.flags.c_contiguous and src.flags.c_contiguous, "async copies need contiguous buffers"
        # the runtime's call, not MemoryPointer.copy_to_host_async: CuPy refuses that one while the stream captures,
        # and the decode graph's step downloads its logits inside the capture (into pinned memory, which CUDA allows)
        self.cp.cuda.runtime.memcpyAsync(dst.ctypes.data, src.data.ptr, src.nbytes, D2H, stream.s.ptr)

    def asarray(self, host: np.ndarray):
        with self.compute.s:
            out = self.cp.asarray(host)
        self.compute.synchronize()
        return out

    def tohost(self, arr) -> np.ndarray:
        self.synchronize()
        return self.cp.asnumpy(arr)

    def free_bytes(self) -> int:
        free, _ = self.cp.cuda.runtime.memGetInfo()
        free += self.pool.free_bytes()
        if self.budget:
            free = min(free, self.budget - self.pool.used_bytes())
        return int(free)

    def total_bytes(self) -> int:
        return int(self.budget or self._total)

    def map_words(self, words: np.ndarray) -> int:
        """cudaHostRegister (mapped) of the words' pages; the device address, which under unified addressing
        is the host address where the device says so (cudaDevAttrCanUseHostPointerForRegisteredMem)."""
        assert words.dtype == np.int64 and words.flags.c_contiguous
        rt = self.cp.cuda.runtime
        ptr = words.ctypes.data
        try:
            rt.hostRegister(ptr, words.nbytes, 2)                           # cudaHostRegisterMapped
        except rt.CUDARuntimeError as e:
            if e.status != 712:     # cudaErrorHostMemoryAlreadyRegistered: an earlier engine on this pool did it
                raise
        get = getattr(rt, "hostGetDevicePointer", None)
        if get is not None:
            return int(get(ptr, 0))
        if not rt.deviceGetAttribute(91, self.id):       # cudaDevAttrCanUseHostPointerForRegisteredMem
            raise DeviceError("this device cannot read registered host memory at its host address")
        return ptr

    def wait_words(self, handle: int, index: int, value: int, stream: CudaStream) -> None:
        if self._wait_k is None:
            self._wait_k = self.cp.RawModule(code=_WAIT_SRC).get_function("strata_wait_ge")
        self._wait_k((1,), (1,), (np.uint64(handle + 8 * index), np.int64(value), np.uint64(WAIT_LIMIT_S * 1e9)),
                     stream=stream.s)

    def event(self, timing: bool = True) -> CudaEvent:
        return CudaEvent(self.cp, timing)

    def synchronize(self) -> None:
        for s in (self.compute, self.side, self.copy):
            s.synchronize()

    def close(self) -> None:
        self.synchronize()
