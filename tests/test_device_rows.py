"""Device.h2d_rows: pinned blobs into rows of a 2-D device array (cache and ring slots), each row's leading bytes,
the rest of the row untouched; and the cache's refill of a lent region, whose slots turn resident in batches of
REFILL_EVENT_EVERY once their copies land. The host twin runs the base version (row by row through h2d), CUDA its
raw-pointer copies (one cudaMemcpyAsync for whole rows, one cudaMemcpy2DAsync for pitched ones)."""

import numpy as np
import pytest

from strata.accel.cache import REFILL_EVENT_EVERY, ExpertCache, by_layer


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
    assert [int(cache.resident(l).sum()) for l in range(L)] == [30, 0, 0]    # the last layers' residents went first
    dev.h2d_rows(cache.buf, slots - lent, dev.pinned(lent * 512).reshape(lent, 512), dev.copy)  # the prompt's use
    done = dev.event()
    done.record(dev.copy)
    copies = []
    rows = dev.h2d_rows
    dev.h2d_rows = lambda dst, row, src, stream: (copies.append((row, src.shape)), rows(dst, row, src, stream))
    cache.restore(arena, done)
    dev.h2d_rows = rows
    assert len({id(ev) for ev, *_ in cache._pending}) == -(-lent // REFILL_EVENT_EVERY)
    # the slots hold the residents by layer (layer 0's 34, then 33 each of layers 1 and 2): the loan took layer 0's
    # last 4 and every resident of layers 1 and 2. They hold their experts again, sorted by (layer, expert): layer
    # 0's 4 in one copy, layers 1 and 2 in two each, cut where an event's batch of 32 slots ends
    placed = by_layer(order[:slots])
    assert [l for l, _ in placed] == [0] * 34 + [1] * 33 + [2] * 33
    back = sorted(placed[slots - lent:])
    assert back[:5] == [(0, 30), (0, 31), (0, 32), (0, 33), (1, 0)]
    assert len(copies) == 5 and sum(s[0] if len(s) == 2 else 1 for _, s in copies) == lent
    asked = []                       # the poll asks each batch's event once, not once a slot
    for ev in {id(ev): ev for ev, *_ in cache._pending}.values():
        ev.query = lambda q=ev.query, ev=ev: (asked.append(id(ev)), q())[1]
    dev.synchronize()
    assert cache.poll() == 0 and cache.n_resident() == slots and cache.lent == 0
    assert len(asked) == len(set(asked)) == -(-lent // REFILL_EVENT_EVERY), asked
    got = _host(dev, cache.buf)
    for s, (l, e) in enumerate(placed[:slots - lent] + back):
        assert cache.slot_of[l, e] == s and (got[s] == (l * E + e) % 251).all(), f"slot {s}"
    assert region is not None
    dev.close()


@pytest.mark.parametrize("kind", KINDS)
def test_walks_share_a_ring_without_overwriting_a_held_slot(kind):
    """Ring and Walk (strata/accel/stream.py): a walk starts at the slot after the last walk's; an entry consumed
    before its copy was issued (stream-all's unrouted) leaves its slot free; and a copy into a slot whose blob still
    waits for its readers is refused, so two walks cannot overlap."""
    from strata.accel.stream import Ring, Walk

    dev = _device(kind)
    L, E, nbytes, R = 2, 12, 256, 4
    arena = _Arena(dev, L, E, nbytes)
    ring = Ring(dev, dev.zeros((R, nbytes), np.uint8))
    a = Walk(ring, arena, [(0, e) for e in range(6)])
    a.consume([2])                                       # unrouted, before its copy
    a.prefetch()                                         # entries 0-3 into slots 0-3 (the watermark is at 0)
    assert ring.held == [True, True, False, True]
    a.consume([0, 1])
    a.prefetch()                                         # entries 4, 5 into slots 0, 1
    assert ring.held == [True, True, False, True]
    b = Walk(ring, arena, [(1, 0)])                      # starts at slot 2 (the cursor), which is free
    assert b.base == 2 and ring.cursor == 3
    b.prefetch()
    c = Walk(ring, arena, [(1, 1)])                      # slot 3: entry 3 of a still waits for its readers
    with pytest.raises(RuntimeError, match="still held"):
        c.prefetch()
    dev.synchronize()
    got = _host(dev, ring.buf)
    assert (got[2] == E % 251).all() and (got[0] == 4).all() and (got[1] == 5).all() and (got[3] == 3).all()
    dev.close()
