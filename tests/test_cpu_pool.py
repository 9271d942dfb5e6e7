"""The expert pool's contract: worker counts, job checks, dense and attention jobs against the reference, strided
outputs, use from a non-main thread, idle workers that park instead of burning cores, and close()."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

from strata import quants
from strata.accel.cpu import kernels as K
from strata.accel.cpu.pool import AttentionJob, ExpertJob, ExpertPool, LinearJob, available_cores
from strata.reference import linalg

D, F = 256, 256


def _pool(*a, **kw) -> ExpertPool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ExpertPool(*a, **kw)


def _expert(rng, types=(12, 12, 8)):
    parts = [quants.get(t).random_blocks(rng, n * k // quants.get(t).block_size, 0.05).reshape(-1)
             for t, (n, k) in zip(types, ((F, D), (F, D), (D, F)))]
    return np.concatenate(parts), types


def _ref_expert(blob, types, x):
    g, u = F * quants.get(types[0]).row_bytes(D), F * quants.get(types[1]).row_bytes(D)
    return linalg.swiglu_ffn(x, (blob[:g].reshape(F, -1), types[0]), (blob[g:g + u].reshape(F, -1), types[1]),
                             (blob[g + u:].reshape(D, -1), types[2]), linalg.Path.Q8)


def test_worker_counts():
    with pytest.raises(ValueError, match=">= 0"):
        ExpertPool(-1)
    with pytest.raises(ValueError, match="host thread"):
        ExpertPool(0, host=False)
    with pytest.warns(UserWarning, match="park instead of spinning"):
        p = ExpertPool(available_cores() + 1)
    assert p.oversubscribed and p.spin_ticks == 0
    p.close()
    serial = ExpertPool(0, host=True)   # the caller runs everything
    rng = np.random.default_rng(0)
    blob, types = _expert(rng)
    x = rng.standard_normal((3, D)).astype(np.float32)
    out = np.empty_like(x)
    serial.run([ExpertJob(blob, types, D, F, x, out)])
    assert np.array_equal(out, _ref_expert(blob, types, x))
    serial.close()


def test_job_checks():
    rng = np.random.default_rng(1)
    blob, types = _expert(rng)
    x = np.zeros((2, D), np.float32)
    with pytest.raises(ValueError, match="take .* = "):
        ExpertJob(blob[:-1], types, D, F, x, np.zeros_like(x))
    with pytest.raises(ValueError, match="MAXT"):
        ExpertJob(blob, types, D, F, np.zeros((9, D), np.float32), np.zeros((9, D), np.float32))
    with pytest.raises(ValueError, match="out must be float32"):
        ExpertJob(blob, types, D, F, x, np.zeros((2, D), np.float64))
    with pytest.raises(quants.UnsupportedQuantType):
        ExpertJob(blob, (15, 12, 8), D, F, x, np.zeros_like(x))
    with pytest.raises(ValueError, match="does not hold"):
        LinearJob(np.zeros((4, 10), np.uint8), 8, x, np.zeros((2, 4), np.float32))


def test_mixed_batch_strided_outputs_and_shared_x():
    """Different types per job, outputs as row views of one buffer (Dm-style), two jobs sharing one x (one
    quantisation), dense jobs of 13 tokens (two token groups) in the same batch."""
    rng = np.random.default_rng(2)
    experts = [_expert(rng, t) for t in ((12, 12, 14), (20, 20, 3), (8, 8, 8), (23, 23, 13))]
    x = rng.standard_normal((4, D)).astype(np.float32)
    dm = np.full((4, 8, D), np.nan, np.float32)           # [token, slot, D]: out rows have a stride of 8·D
    jobs = [ExpertJob(b, t, D, F, x, dm[:, j]) for j, (b, t) in enumerate(experts)]
    w = quants.get(10).random_blocks(rng, 96 * D // 256, 0.05).reshape(96, -1)
    xl = rng.standard_normal((13, D)).astype(np.float32)
    lin = np.empty((13, 96), np.float32)
    jobs.append(LinearJob(w, 10, xl, lin))
    with _pool(2) as pool:
        pool.run(jobs)
    for j, (b, t) in enumerate(experts):
        assert np.array_equal(dm[:, j], _ref_expert(b, t, x)), f"expert {j} differs"
    assert np.array_equal(lin, quants.q8_matmul(xl, w, 10))
    assert np.isnan(dm[:, 4:]).all(), "rows outside the jobs' views were written"


def test_attention_job_matches_reference():
    rng = np.random.default_rng(3)
    T, H, Hkv, hd, C, S = 3, 8, 2, 64, 32, 20
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k = rng.standard_normal((S, Hkv, hd)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, hd)).astype(np.float32)
    pos = np.array([17, 18, 19], np.int64)
    kt = np.zeros((Hkv, hd, C), np.float32)
    kt[:, :, :S] = k.transpose(1, 2, 0)
    vc = np.zeros((Hkv, C, hd), np.float32)
    vc[:, :S] = v.transpose(1, 0, 2)
    out = np.empty((T, H * hd), np.float32)
    with _pool(1) as pool:
        pool.run([AttentionJob(q, kt, vc, pos, S, out)])
    assert np.array_equal(out, linalg.attention(q, k, v, pos))


def test_run_from_a_worker_thread_next_to_numpy():
    """The GPU engine calls the pool from its CPU-share thread while other threads use numpy/BLAS."""
    rng = np.random.default_rng(4)
    blob, types = _expert(rng)
    xs = [rng.standard_normal((2, D)).astype(np.float32) for _ in range(6)]
    outs = [np.empty_like(x) for x in xs]
    stop = threading.Event()

    def busy():
        a = rng.standard_normal((256, 256))
        while not stop.is_set():
            a = np.tanh(a @ a.T / 256)

    bg = threading.Thread(target=busy)
    bg.start()
    errors = []

    def share():
        try:
            with _pool(1) as pool:
                for _ in range(5):
                    pool.run([ExpertJob(blob, types, D, F, x, o) for x, o in zip(xs, outs)])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    th = threading.Thread(target=share)
    th.start()
    th.join(120)
    stop.set()
    bg.join()
    assert not errors and not th.is_alive()
    for x, o in zip(xs, outs):
        assert np.array_equal(o, _ref_expert(blob, types, x))


def test_idle_workers_park():
    """After a batch and the spin window (here 1 ms), workers sleep: the process burns (almost) no CPU."""
    rng = np.random.default_rng(5)
    blob, types = _expert(rng)
    x = rng.standard_normal((1, D)).astype(np.float32)
    pool = _pool(2, spin_us=1000, doze_ms=20)
    pool.run([ExpertJob(blob, types, D, F, x, np.empty_like(x))])
    time.sleep(0.1)
    c0, t0 = time.process_time(), time.perf_counter()
    time.sleep(0.3)
    busy = (time.process_time() - c0) / (time.perf_counter() - t0)
    pool.close()
    assert busy < 0.2, f"idle pool used {busy:.0%} of a core"
    assert not any(th.is_alive() for th in pool._threads)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run([ExpertJob(blob, types, D, F, x, np.empty_like(x))])


def test_workers_doze_before_they_park():
    """Past the spin window workers doze inside nogil code (waking needs no GIL), and park only after doze_ms."""
    from strata.accel.cpu import _sched as S

    rng = np.random.default_rng(7)
    blob, types = _expert(rng)
    x = rng.standard_normal((1, D)).astype(np.float32)
    with _pool(2, spin_us=500, doze_ms=400) as pool:
        assert pool._ctl[S.SLEEPFN] != 0, "libc usleep not found"
        pool.run([ExpertJob(blob, types, D, F, x, np.empty_like(x))])
        time.sleep(0.1)                                   # past the spin, inside the doze
        assert S.ctl_load(pool._ctl, S.NPARKED) == 0
        out = np.empty_like(x)
        pool.run([ExpertJob(blob, types, D, F, x, out)])  # dozing workers take the batch
        assert np.array_equal(out, _ref_expert(blob, types, x))
        deadline = time.perf_counter() + 5.0
        while S.ctl_load(pool._ctl, S.NPARKED) < 2 and time.perf_counter() < deadline:
            time.sleep(0.05)
        assert S.ctl_load(pool._ctl, S.NPARKED) == 2      # the doze window ran out: parked in Python
    with _pool(2, spin_us=500, doze_ms=0) as pool:          # no doze: park right after the spin
        pool.run([ExpertJob(blob, types, D, F, x, np.empty_like(x))])
        time.sleep(0.1)
        assert S.ctl_load(pool._ctl, S.NPARKED) == 2


def test_rouse_wakes_parked_workers_ahead_of_a_batch():
    """rouse() brings parked workers back to spinning and dozing (no batch needed), so the next batch finds them
    awake; they park again once the doze window runs out, and a rouse with nobody parked does nothing."""
    from strata.accel.cpu import _sched as S

    rng = np.random.default_rng(9)
    blob, types = _expert(rng)
    x = rng.standard_normal((1, D)).astype(np.float32)

    def parked(pool, want, within=5.0):
        deadline = time.perf_counter() + within
        while S.ctl_load(pool._ctl, S.NPARKED) != want and time.perf_counter() < deadline:
            time.sleep(0.01)
        return S.ctl_load(pool._ctl, S.NPARKED) == want

    with _pool(2, spin_us=500, doze_ms=300) as pool:
        pool.run([ExpertJob(blob, types, D, F, x, np.empty_like(x))])
        assert parked(pool, 2)                             # past spin and doze: parked in Python
        time.sleep(0.05)
        assert S.ctl_load(pool._ctl, S.NPARKED) == 2       # and they stay parked without a rouse
        pool.rouse()
        assert parked(pool, 0, within=1.0)                 # awake again, dozing
        out = np.empty_like(x)
        pool.run([ExpertJob(blob, types, D, F, x, out)])
        assert np.array_equal(out, _ref_expert(blob, types, x))
        pool.rouse()                                       # nobody parked: nothing to do
        assert parked(pool, 2)                             # the doze window ran out again


def test_submit_then_wait():
    """submit publishes and returns; the workers alone compute; wait returns the batch's wall ms."""
    rng = np.random.default_rng(8)
    blob, types = _expert(rng)
    xs = [rng.standard_normal((n, D)).astype(np.float32) for n in (1, 3, 8)]
    outs = [np.full_like(x, np.nan) for x in xs]
    with _pool(2) as pool:
        pool.submit(*pool.plan([ExpertJob(blob, types, D, F, x, o) for x, o in zip(xs, outs)]))
        ms = pool.wait()
        assert 0.0 <= ms < 60e3
        with pytest.raises(RuntimeError, match="without a submitted batch"):
            pool.wait()
        pool.run([ExpertJob(blob, types, D, F, xs[0], np.empty_like(xs[0]))])   # the lock was released
        for x, o in zip(xs, outs):
            assert np.array_equal(o, _ref_expert(blob, types, x))
        late = np.full_like(xs[1], np.nan)
        pool.submit(*pool.plan([ExpertJob(blob, types, D, F, xs[1], late)]))   # never waited for (an error)
        again = np.empty_like(xs[2])
        pool.run([ExpertJob(blob, types, D, F, xs[2], again)])                  # ends it first, then runs
        assert np.array_equal(late, _ref_expert(blob, types, xs[1]))
        assert np.array_equal(again, _ref_expert(blob, types, xs[2]))
    with _pool(0) as serial, pytest.raises(ValueError, match="needs worker threads"):
        serial.submit(*serial.plan([ExpertJob(blob, types, D, F, xs[0], outs[0])]))


def test_linear_matches_kernels_any_token_count():
    rng = np.random.default_rng(6)
    for qt, n, k in ((12, 40, 512), (0, 9, 64), (30, 5, 96)):
        cls = quants.get(qt)
        w = cls.random_blocks(rng, n * k // cls.block_size, 0.05).reshape(n, -1)
        for t in (1, 8, 17):
            x = rng.standard_normal((t, k)).astype(np.float32)
            out = np.empty((t, n), np.float32)
            with _pool(1) as pool:
                pool.run([LinearJob(w, qt, x, out)])
            assert np.array_equal(out, K.q8_matmul(x, w, qt)), (cls.name, t)
