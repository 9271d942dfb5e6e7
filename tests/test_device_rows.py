"""Device.h2d_rows: pinned blobs into rows of a 2-D device array (cache and ring slots), each row's leading bytes,
the rest of the row untouched; and the cache's refill of a lent region, whose slots turn resident in batches of
REFILL_EVENT_EVERY once their copies land. The host twin runs the base version (row by row through h2d), CUDA its
raw-pointer copies (one cudaMemcpyAsync for whole rows, one cudaMemcpy2DAsync for pitched ones)."""

import numpy as np
import pytest

from strata.accel.cache import REFILL_EVENT_EVERY, ExpertCache


def _device(kind):
    if kind == "host":
        from strata.accel.device.host import HostDevice

        return HostDevice()
    pytest.importorskip("cupy")
    from strata.accel.device.cuda import CudaDevice

    return CudaDevice()


KINDS = ["host", pytest.param("cuda", marks=pytest.mark.gpu)]


def _host(dev, arr):
    return dev.tohost(arr) if hasattr(arr, "device") else np.array(arr)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m, n, pitch", [(1, 1000, 1024), (3, 1024, 1024), (5, 1000, 1024), (4, 256, 4096)])
def test_rows_land_in_place_and_leave_the_rest_of_each_row(kind, m, n, pitch):
    dev = _device(kind)
    rng = np.random.default_rng(m * n)
    dst = dev.asarray(np.full((8, pitch), 7, np.uint8))
    src = dev.pinned(m * n).reshape(m, n)
    src[:] = rng.integers(0, 256, (m, n), dtype=np.uint8)
    dev.h2d_rows(dst, 2, src if m > 1 else src[0], dev.copy)
    dev.synchronize()
    got = _host(dev, dst)
    want = np.full((8, pitch), 7, np.uint8)
    want[2:2 + m, :n] = src
    assert (got == want).all()
    dev.close()


@pytest.mark.parametrize("kind", KINDS)
def test_rows_that_do_not_fit_are_refused(kind):
    dev = _device(kind)
    dst = dev.zeros((4, 256), np.uint8)
    with pytest.raises(AssertionError, match="do not fit"):
        dev.h2d_rows(dst, 3, dev.pinned(2 * 256).reshape(2, 256), dev.copy)
    with pytest.raises(AssertionError, match="do not fit"):
        dev.h2d_rows(dst, 0, dev.pinned(300), dev.copy)
    dev.close()


class _Arena:   # the cache reads blob(l, e) only: L layers x E experts of `nbytes`, each filled with its own id
    def __init__(self, dev, L, E, nbytes):
        self.blobs = dev.pinned(L * E * nbytes).reshape(L, E, nbytes)
        for l in range(L):
            for e in range(E):
                self.blobs[l, e] = (l * E + e) % 251

    def blob(self, l, e):
        return self.blobs[l, e]

    def run(self, l, e0, e1):
        return self.blobs[l, e0:e1]


@pytest.mark.parametrize("kind", KINDS)
def test_a_lent_region_refills_in_event_batches(kind):
    dev = _device(kind)
    L, E, nbytes, slots = 3, 40, 512, 100
    arena = _Arena(dev, L, E, nbytes)
    cache = ExpertCache(dev, slots, 512, L, E)
    order = [(l, e) for e in range(E) for l in range(L)]      # the uniform fill: layers alternate slot by slot
    assert cache.fill(order, arena) == slots
    lent = 70                              # 70 slots: batches of 32, 32 and 6
    region = cache.lend(lent)
    assert cache.n_resident() == slots - lent
    dev.h2d_rows(cache.buf, slots - lent, dev.pinned(lent * 512).reshape(lent, 512), dev.copy)  # the prompt's use
    done = dev.event()
    done.record(dev.copy)
    copies = []
    rows = dev.h2d_rows
    dev.h2d_rows = lambda dst, row, src, stream: (copies.append((row, src.shape)), rows(dst, row, src, stream))
    cache.restore(arena, done)
    dev.h2d_rows = rows
    assert len({id(ev) for ev, *_ in cache._pending}) == -(-lent // REFILL_EVENT_EVERY)
    # the lent slots hold their experts again, sorted by (layer, expert): layer 0's 24 in one copy, layers 1 and 2
    # (23 each) in two each, cut where an event's batch of 32 slots ends
    back = sorted(order[slots - lent:slots])
    assert len(copies) == 5 and sum(s[0] if len(s) == 2 else 1 for _, s in copies) == lent
    dev.synchronize()
    assert cache.poll() == 0 and cache.n_resident() == slots and cache.lent == 0
    got = _host(dev, cache.buf)
    for s, (l, e) in enumerate(order[:slots - lent] + back):
        assert cache.slot_of[l, e] == s and (got[s] == (l * E + e) % 251).all(), f"slot {s}"
    assert region is not None
    dev.close()
