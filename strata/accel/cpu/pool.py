"""The CPU expert pool (SPEC §4, §8, §10): a fixed set of worker threads plus, optionally, the calling thread,
running batches of expert jobs (an expert blob and up to MAXT = 8 token rows) and dense row-split matmuls.

Each job is split by rows across the threads in phases — gate/up rows (with SwiGLU), the intermediate quantised
per (expert, token) to the down weight's vec_dot_type, down rows — with a barrier between phases, or, with the
pipeline (STRATA_POOL_PIPELINE, SPEC §10), per-expert readiness: the thread that finishes an expert's last
gate/up tile quantises its intermediate and so releases its down tiles. Row partitions never change arithmetic
(each output row is one kernel call's exact q8-path sum), so every worker count, host setting and mode gives the
same bits as the serial reference (strata/reference, docs/NUMERICS.md).

Threads: workers are Python threads that spend their life inside `nogil` Numba code (_sched.py). An idle worker
spins for `spin_us` (default 2 ms) waiting for the next batch, then dozes in 50 µs sleeps inside that code for
`doze_ms` (default 200 ms: a prompt's layers come every few ms, and waking from a Python park needs the GIL),
then parks on a condition variable, so an idle pool burns nothing. With more threads than cores the pool never spins: it parks at once and yields while waiting on a
dependency, because a spinning thread would steal the core of the thread it waits for.
Legend: J jobs, N tokens of a job, D n_embd, F n_ff.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np

from strata import quants
from strata.accel.cpu import _sched as S
from strata.accel.cpu._llvm import address, usleep_address
from strata.accel.cpu.act import act_row_bytes
from strata.accel.cpu import entry
from strata.accel.cpu.rows import MAXT

_CTL_ALIGN = 4096


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def default_workers() -> int:
    """Worker threads for this machine: one per core the process may use, less the calling thread."""
    return max(0, available_cores() - 1)


def _default_pipeline() -> bool:
    """STRATA_POOL_PIPELINE, read through the one typed config (strata.policy.env)."""
    from strata.policy import from_process

    return bool(from_process().pool_pipeline)


def _check_rows(name: str, a: np.ndarray, n: int, k: int):
    if a.dtype != np.float32 or a.ndim != 2 or a.shape != (n, k) or a.strides[1] != 4:
        raise ValueError(f"{name} must be float32 [{n}, {k}] with contiguous rows, got {a.dtype} {a.shape} "
                         f"strides {a.strides}")


@dataclass(frozen=True, slots=True)
class ExpertJob:
    """One expert on n <= MAXT token rows: out = down(silu(gate·x) * (up·x)), unweighted.

    blob: the expert's raw [gate | up | down] bytes (uint8, an arena slice, SPEC §1); types: ggml ids of
    (gate, up, down); x: float32 [n, D]; out: float32 [n, D], written (row stride free, rows contiguous).
    `parts` replaces `blob` where the three matrices live apart (a shared expert's tensors)."""

    blob: np.ndarray | None
    types: tuple[int, int, int]
    n_embd: int
    n_ff: int
    x: np.ndarray
    out: np.ndarray
    parts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __post_init__(self):
        d, f = self.n_embd, self.n_ff
        n = self.x.shape[0] if self.x.ndim == 2 else -1
        if not 1 <= n <= MAXT:
            raise ValueError(f"an expert job takes 1..{MAXT} token rows (MAXT, SPEC §4), got x of shape {self.x.shape}")
        _check_rows("x", self.x, n, d)
        _check_rows("out", self.out, n, d)
        sizes = (f * _row_bytes(self.types[0], d), f * _row_bytes(self.types[1], d), d * _row_bytes(self.types[2], f))
        if self.parts is None:
            b = self.blob
            if b is None or b.dtype != np.uint8 or b.ndim != 1 or not b.flags.c_contiguous:
                raise ValueError("blob must be a contiguous uint8 array of [gate | up | down] bytes")
            if b.size != sum(sizes):
                raise ValueError(f"blob of {b.size} bytes, but {quants.type_name(self.types[0])}/"
                                 f"{quants.type_name(self.types[1])}/{quants.type_name(self.types[2])} experts of "
                                 f"D={d}, F={f} take {sizes[0]} + {sizes[1]} + {sizes[2]} = {sum(sizes)}")
            object.__setattr__(self, "parts", (b[:sizes[0]], b[sizes[0]:sizes[0] + sizes[1]], b[sizes[0] + sizes[1]:]))
        else:
            for name, p, size in zip(("gate", "up", "down"), self.parts, sizes):
                if not p.flags.c_contiguous or p.nbytes != size:
                    raise ValueError(f"{name} must be {size} contiguous bytes, got {p.nbytes} ({p.shape})")

    @classmethod
    def from_parts(cls, gate, up, down, types, n_embd, n_ff, x, out) -> "ExpertJob":
        return cls(None, tuple(types), n_embd, n_ff, x, out, (gate, up, down))


@dataclass(frozen=True, slots=True)
class LinearJob:
    """out = x · Wᵀ on the q8 path, split by rows (and groups of MAXT tokens): w [N, row_bytes] (or typed
    F32/F16 [N, K]), x float32 [T, K], out float32 [T, N] (rows contiguous)."""

    w: np.ndarray
    qtype: int
    x: np.ndarray
    out: np.ndarray

    def __post_init__(self):
        t, k = self.x.shape
        n = self.w.shape[0]
        if not self.w.flags.c_contiguous or self.w.nbytes != n * _row_bytes(self.qtype, k):
            raise ValueError(f"{quants.type_name(self.qtype)} weight of shape {self.w.shape} does not hold "
                             f"{n} contiguous rows of {k}")
        _check_rows("x", self.x, t, k)
        _check_rows("out", self.out, t, n)


@dataclass(frozen=True, slots=True)
class AttentionJob:
    """Causal GQA attention of T queries over the first n_pos cached positions (strata.accel.cpu.dense):
    q float32 [T, H, hd] (C-contiguous), kt float32 [Hkv, hd, C] (the K cache transposed), v float32
    [Hkv, C, hd], pos int64 [T], out float32 [T, H·hd] (C-contiguous). Split by heads."""

    q: np.ndarray
    kt: np.ndarray
    v: np.ndarray
    pos: np.ndarray
    n_pos: int
    out: np.ndarray

    def __post_init__(self):
        t, h, hd = self.q.shape
        hkv, _, cap = self.kt.shape
        ok = (self.q.dtype == self.kt.dtype == self.v.dtype == self.out.dtype == np.float32
              and self.pos.dtype == np.int64 and self.pos.shape == (t,) and self.kt.shape == (hkv, hd, cap)
              and self.v.shape == (hkv, cap, hd) and self.out.shape == (t, h * hd) and h % hkv == 0
              and 0 < self.n_pos <= cap and all(a.flags.c_contiguous for a in (self.q, self.kt, self.v, self.pos,
                                                                               self.out)))
        if not ok:
            raise ValueError(f"attention job: bad shapes/dtypes q {self.q.shape} kt {self.kt.shape} v {self.v.shape} "
                             f"pos {self.pos.shape} out {self.out.shape} n_pos {self.n_pos}")


_RB: dict[tuple[int, int], int] = {}


def _row_bytes(qtype: int, k: int) -> int:
    key = (qtype, k)
    if key not in _RB:
        cls = quants.get(qtype)
        if not cls.weight:
            raise quants.UnsupportedQuantType(f"{cls.name} is not a weight type")
        _RB[key] = cls.row_bytes(k)
    return _RB[key]


_TICKS_PER_US: float | None = None


def ticks_per_us() -> float:
    """The cycle counter's rate, measured once (0 where the CPU has no usable counter)."""
    global _TICKS_PER_US
    if _TICKS_PER_US is None:
        c0, t0 = S.tick_count(), time.perf_counter()
        time.sleep(0.02)
        c1, t1 = S.tick_count(), time.perf_counter()
        _TICKS_PER_US = max(0.0, (c1 - c0) / ((t1 - t0) * 1e6))
    return _TICKS_PER_US


class ExpertPool:
    """`workers` threads (default: cores − 1) plus the calling thread when `host` is true.

    workers < 0 is an error, as is 0 without the host thread (nothing would run the jobs). workers = 0 with the
    host runs every batch serially in the caller. More threads than cores is allowed (the SPEC §10 parity grid
    does it) and warned about once: the pool then parks idle threads at once instead of spinning."""

    def __init__(self, workers: int | None = None, pipeline: bool | None = None, host: bool = True,
                 spin_us: float | None = None, doze_ms: float = 200.0):
        cores = available_cores()
        workers = default_workers() if workers is None else int(workers)
        if workers < 0:
            raise ValueError(f"pool workers must be >= 0, got {workers}")
        if workers == 0 and not host:
            raise ValueError("a pool with 0 workers needs the host thread to run its jobs (host=True)")
        self.workers, self.host = workers, bool(host)
        self.pipeline = _default_pipeline() if pipeline is None else bool(pipeline)
        self.threads_total = workers + int(self.host)
        self.oversubscribed = self.threads_total > cores
        if self.oversubscribed:
            warnings.warn(f"ExpertPool: {self.threads_total} threads on {cores} cores; threads park instead of "
                          f"spinning (slower, but never starves the thread it waits for)", stacklevel=2)
        spin = (0.0 if self.oversubscribed else 2000.0) if spin_us is None else float(spin_us)
        self.spin_ticks = int(spin * ticks_per_us())
        raw = np.zeros(S.CTL_WORDS + _CTL_ALIGN // 8, np.int64)
        off = (-address(raw) % _CTL_ALIGN) // 8
        self._ctl = raw[off:off + S.CTL_WORDS]   # control words on a page of their own (a device may map it)
        self._ctl[S.KFN] = entry.table_address()
        self._ctl[S.SLEEPFN] = usleep_address() if doze_ms > 0 else 0
        self._ctl[S.DOZE_US], self._ctl[S.DOZE_TICKS] = 50, int(doze_ms * 1e3 * ticks_per_us())
        self._epoch = 0
        self._scratch = np.empty(0, np.uint8)
        self._keep: tuple = ()
        self._submitted = False
        self._run_lock = threading.Lock()
        self._cv = threading.Condition()
        self._roused = 0                 # rouse() calls: a parked worker wakes on a new batch or a new rouse
        self._done = threading.Event()
        self._closed = False
        self._threads = [threading.Thread(target=self._worker, name=f"strata-pool-{i}", daemon=True)
                         for i in range(workers)]
        for th in self._threads:
            th.start()

    # --- worker side ------------------------------------------------------------------------------------------
    def _worker(self):
        ctl, last, i = self._ctl, 0, -1
        while True:
            st, last, i = S.step(ctl, last, i, self.spin_ticks, True)
            if st == S.ST_EXIT:
                return
            if st == S.ST_PARK:
                with self._cv:
                    roused = self._roused
                    while (S.ctl_load(ctl, S.EPOCH) == last and S.ctl_load(ctl, S.SHUTDOWN) == 0
                           and self._roused == roused):
                        self._cv.wait()
                S.ctl_add(ctl, S.NPARKED, -1)
            elif st == S.ST_BLOCKED:  # a dependency is slow (or its thread descheduled): give the core away
                os.sched_yield()
                continue
            elif st == S.ST_WAKE_HOST:
                self._done.set()
            i = -1

    # --- host side --------------------------------------------------------------------------------------------
    def run(self, jobs: list) -> None:
        """Run a batch of ExpertJob / LinearJob / AttentionJob; returns when every `out` is written."""
        if jobs:
            plan, owner, keep = self.plan(jobs)
            self.run_plan(plan, owner, keep)

    def run_plan(self, plan: np.ndarray, owner: np.ndarray, keep=None) -> None:
        """Run a batch given as plan rows (int64 [J, JF], see _sched.py; addresses of live buffers that `keep`
        holds) and owner[j] (the job whose quantised activations job j reuses). CpuOps builds these directly."""
        self._settle()
        with self._run_lock:
            self._publish(plan, owner, keep)
            self._finish(take_tiles=self.host)

    def submit(self, plan: np.ndarray, owner: np.ndarray, keep=None) -> None:
        """Publish a batch and return at once: the workers run it while the caller goes on (the prefill share:
        the engine thread keeps issuing GPU work, no Python thread in between); `wait` ends it."""
        if self.workers == 0:
            raise ValueError("submit needs worker threads: the caller takes no tiles of a submitted batch")
        self._settle()
        self._run_lock.acquire()
        try:
            self._publish(plan, owner, keep)
        except BaseException:
            self._run_lock.release()
            raise
        self._submitted = True

    def rouse(self) -> None:
        """Wake the parked workers ahead of a batch to come: they spin and doze again (spin_us, doze_ms) and take it
        at once. A parked worker needs the GIL to wake, which an engine thread issuing GPU work holds for up to
        Python's switch interval (5 ms) after it publishes (bench/pool_wake.py); roused before, the worker gets it
        while that thread waits in a blocking call (the routing sync)."""
        if S.ctl_load(self._ctl, S.NPARKED) > 0:
            with self._cv:
                self._roused += 1
                self._cv.notify_all()

    @property
    def control_words(self) -> np.ndarray:
        """The pool's control words (int64, a page of their own): a device maps them once to wait on `done_word`."""
        return self._ctl

    def done_word(self) -> tuple[int, int]:
        """The submitted batch is complete once control_words[index] >= value: (index, value). Its last tile
        writes that count after every output row, so a device stream that waits on it may read the rows."""
        if not self._submitted:
            raise RuntimeError("done_word() without a submitted batch")
        return S.DONE, int(self._keep[1].shape[0])

    def wait(self) -> float:
        """Wait for the submitted batch; returns its wall ms from publication to its last tile."""
        if not self._submitted:
            raise RuntimeError("wait() without a submitted batch")
        try:
            self._finish(take_tiles=False)
            tpu = ticks_per_us()
            return (int(self._ctl[S.DONE_AT]) - int(self._ctl[S.PUB_AT])) / (tpu * 1e3) if tpu else 0.0
        finally:
            self._submitted = False
            self._run_lock.release()

    def _settle(self) -> None:
        """A submitted batch nobody waited for (its caller raised before `wait`) ends before the next one starts,
        so an error in between cannot leave the pool locked."""
        if self._submitted:
            self.wait()

    def _publish(self, plan, owner, keep) -> None:
        if self._closed:
            raise RuntimeError("the pool is closed")
        ctl = self._ctl
        while True:
            short, tiles, groups, parked = S.launch(ctl, self._epoch + 1, plan, owner, self.threads_total,
                                                    self._scratch, self.pipeline)
            if short == 0:
                break
            self._scratch = np.empty(int(short * 1.25), np.uint8)
        self._epoch += 1
        self._keep = (plan, tiles, groups, keep)   # alive while threads may read them
        if parked > 0:
            with self._cv:
                self._cv.notify_all()

    def _finish(self, take_tiles: bool) -> None:
        """Take tiles (the host thread) or only wait, until every tile of the current batch is done."""
        ctl, nt = self._ctl, self._keep[1].shape[0]
        epoch = self._epoch if take_tiles else -1
        st, _, i = S.step(ctl, epoch, -1, self.spin_ticks, False)
        while st == S.ST_BLOCKED:
            os.sched_yield()
            st, _, i = S.step(ctl, epoch, i, self.spin_ticks, False)
        if st == S.ST_PARK:
            self._done.clear()
            if not S.park_host(ctl, nt):
                while S.ctl_load(ctl, S.DONE) < nt:
                    self._done.wait(0.01)
                    self._done.clear()

    def plan(self, jobs):
        """Plan rows from job objects: (plan [J, JF], owner [J], what to keep alive). The general path; CpuOps
        and the GPU engine's CPU block build rows themselves, from one such row per layer format."""
        nj = len(jobs)
        plan = np.zeros((nj, S.JF), np.int64)
        owner = np.arange(nj, dtype=np.int64)
        seen: dict[tuple, int] = {}
        keep = []
        for j, job in enumerate(jobs):
            p = plan[j]
            if isinstance(job, AttentionJob):
                t, h, hd = job.q.shape
                p[S.J_KIND], p[S.J_N], p[S.J_D], p[S.J_F] = S.JOB_ATTN, t, job.n_pos, h
                p[S.J_GT], p[S.J_GROW], p[S.J_UT] = job.kt.shape[0], hd, job.kt.shape[2]
                p[S.J_X], p[S.J_GW], p[S.J_UW] = address(job.q), address(job.kt), address(job.v)
                p[S.J_DW], p[S.J_OUT] = address(job.pos), address(job.out)
                keep.append(job)
                continue
            x, out = job.x, job.out
            n = x.shape[0]
            p[S.J_N], p[S.J_X], p[S.J_XS] = n, address(x), x.strides[0] // 4
            p[S.J_OUT], p[S.J_OS] = address(out), out.strides[0] // 4
            if isinstance(job, ExpertJob):
                d, f = job.n_embd, job.n_ff
                gt, ut, dt = job.types
                for t in job.types:
                    entry.ensure(t)
                gat, uat, dat = (quants.get(t).vec_dot_type for t in job.types)
                p[S.J_KIND], p[S.J_D], p[S.J_F] = S.JOB_EXPERT, d, f
                p[S.J_GW], p[S.J_UW], p[S.J_DW] = (address(m) for m in job.parts)
                p[S.J_GT], p[S.J_UT], p[S.J_DT] = gt, ut, dt
                p[S.J_GROW], p[S.J_UROW], p[S.J_DROW] = _row_bytes(gt, d), _row_bytes(ut, d), _row_bytes(dt, f)
                p[S.J_GAT], p[S.J_UAT], p[S.J_DAT] = gat, uat, dat
                p[S.J_QXGROW], p[S.J_QXUROW], p[S.J_QHROW] = act_row_bytes(gat, d), act_row_bytes(uat, d), \
                    act_row_bytes(dat, f)
                keep.append(job.parts)
            else:
                t, k = x.shape
                entry.ensure(job.qtype)
                gat = quants.get(job.qtype).vec_dot_type
                p[S.J_KIND], p[S.J_D], p[S.J_F] = S.JOB_LINEAR, k, job.w.shape[0]
                p[S.J_GW], p[S.J_GT], p[S.J_GROW] = address(job.w), job.qtype, _row_bytes(job.qtype, k)
                p[S.J_GAT], p[S.J_UAT] = gat, gat
                p[S.J_QXGROW] = p[S.J_QXUROW] = act_row_bytes(gat, k)
                keep.append(job.w)
            owner[j] = seen.setdefault((p[S.J_X], n, p[S.J_XS], p[S.J_D], p[S.J_GAT], p[S.J_UAT]), j)
        return plan, owner, (jobs, keep)

    # --- lifetime ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        S.ctl_store(self._ctl, S.SHUTDOWN, 1)
        with self._cv:
            self._cv.notify_all()
        for th in self._threads:
            th.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
