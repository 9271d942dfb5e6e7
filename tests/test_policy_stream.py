"""The stream plan (SPEC §3): stream_all_min, the walk, ring slots, streaming order."""

import numpy as np
import pytest

from strata.policy.stream import ROUTED_ONLY_GROUP, ROUTED_ONLY_SLOTS

from strata.policy import (
    Config,
    routed_group,
    ShareMode,
    StreamWaste,
    Walk,
    ring_budget_slots,
    ring_slots,
    routed_only_order,
    stream_all_min,
    stream_all_queue,
    walk_for,
)
from strata.policy.env import Share

OFF, AUTO_DEFAULT, AUTO = Share(ShareMode.OFF), Share(ShareMode.AUTO, by_default=True), Share(ShareMode.AUTO)


def test_stream_all_min():
    assert stream_all_min(Config(), OFF) == 1024
    assert stream_all_min(Config(), AUTO_DEFAULT) == 1024
    assert stream_all_min(Config(), AUTO) == 3072
    assert stream_all_min(Config(cpu_share_max=2048), AUTO) == 2048
    assert stream_all_min(Config(stream_min=4096), AUTO) == 4096  # the override wins
    assert stream_all_min(Config(stream_min=0), OFF) == 0


def test_ring_budget():
    assert ring_budget_slots(1_382_400) == 384  # the Q2_0 blob the budget is written in
    assert ring_budget_slots(2_329_600) == 227  # IQ3_S pack: the "2,304 / 227" prompt plan
    assert ring_budget_slots(4_000_000) == 132
    assert ring_budget_slots(100_000) == 512  # clamp high
    assert ring_budget_slots(50_000_000) == 16  # clamp low


def test_ring_slots_and_walk():
    c = Config()
    assert ring_slots(c, OFF, 1023, 1_382_400) == ROUTED_ONLY_SLOTS  # a group in flight beside one computing
    assert ring_slots(c, OFF, 1024, 1_382_400) == 384
    assert ring_slots(c, AUTO, 2048, 1_382_400) == ROUTED_ONLY_SLOTS  # explicit auto: chunks below 3072 share
    assert ring_slots(c, OFF, 4096, 1_382_400, planned=200) == 200
    assert ring_slots(Config(ring=8), OFF, 8192, 1_382_400) == ROUTED_ONLY_SLOTS  # <= 8 = routed-only always
    assert walk_for(Config(ring=8), OFF, 8192, 16) is Walk.ROUTED_ONLY
    assert ring_slots(Config(ring=12), OFF, 8192, 1_382_400) == 16
    assert ring_slots(Config(ring=9999), OFF, 8192, 1_382_400) == 512
    assert walk_for(c, OFF, 1024, 384) is Walk.STREAM_ALL
    assert walk_for(c, OFF, 1000, 384) is Walk.ROUTED_ONLY  # the last, shorter chunk of a big layout
    assert walk_for(c, OFF, 4096, 8) is Walk.ROUTED_ONLY


def test_routed_only_groups():
    """ours: routed-only launch groups of up to ROUTED_ONLY_GROUP, half the ring, at most the weight scratch; the
    routed-only ring holds four of them."""
    assert ROUTED_ONLY_SLOTS == 4 * ROUTED_ONLY_GROUP
    assert routed_group(ROUTED_ONLY_SLOTS, 16) == ROUTED_ONLY_GROUP == 16
    assert routed_group(ROUTED_ONLY_SLOTS, 8) == 8          # a small weight scratch
    assert routed_group(8, 16) == 4                         # decode's 8-slot ring
    assert routed_group(18, 8) == 8 and routed_group(1, 8) == 1


def test_orders():
    cnt = [0, 3, 1, 0, 9, 2]
    res = [False, True, False, False, False, False]
    assert routed_only_order(cnt, res) == [2, 4, 5]
    assert routed_only_order(cnt, res, on_cpu=[5, 2]) == [4]
    assert stream_all_queue([[True, False, False], [False, True, True]]) == [(0, 1), (0, 2), (1, 0)]


def test_stream_waste_keeps_chunks_off_a_wasteful_stream_all():
    """ours: a chunk takes the stream-all walk while the last such chunk's queue was at most 25% unrouted; a refused
    chunk counts the waste from its routing (note), so routing that turns dense is seen at the next chunk, and no
    chunk is admitted to re-measure."""
    from strata.policy.stream import STREAM_ALL_WASTE_MAX

    w = StreamWaste()
    assert w.counted and w.admit()                       # nothing measured: SPEC §3's walk
    w.note(100, 60)
    assert not any(w.admit() for _ in range(200))        # no probes
    w.note(100, int(100 * STREAM_ALL_WASTE_MAX))          # a refused chunk counted its routing dense enough
    assert w.admit()
    w.note(0, 0)                                         # an empty queue says nothing
    assert w.admit()


def test_unrouted_waste_counts_what_the_stream_all_queue_would_leave_unrouted():
    """A layer's entries in stream-all's queue are its non-resident experts; the unrouted ones have no token."""
    from strata.policy import unrouted_waste

    cnt = np.array([0, 3, 0, 1, 0, 0])
    resident = np.array([True, False, False, False, True, False])
    assert unrouted_waste(cnt, resident) == (4, 2)                       # 1, 2, 3, 5 queued; 2 and 5 unrouted
    queue = stream_all_queue([resident])
    assert unrouted_waste(cnt, resident) == (len(queue), sum(cnt[e] == 0 for _, e in queue))


def test_stream_waste_without_counting_probes():
    """Stops 23-33's rule (StreamWaste(counted=False), the simulator's stored engines): refused, one chunk in 8 takes
    stream-all again to re-measure, and each probe that finds it still wasteful doubles the wait (up to 64)."""
    from strata.policy.stream import STREAM_ALL_PROBE, STREAM_ALL_PROBE_MAX, STREAM_ALL_WASTE_MAX

    w = StreamWaste(counted=False)
    assert w.admit() and w.admit()                       # nothing measured: SPEC §3's walk
    w.note(100, int(100 * STREAM_ALL_WASTE_MAX))          # at the limit: still admitted
    assert w.admit()
    w.note(100, 60)
    got = [w.admit() for _ in range(2 * STREAM_ALL_PROBE)]
    assert got == ([False] * (STREAM_ALL_PROBE - 1) + [True]) * 2     # no probe's result yet: the wait holds
    waits = []
    for _ in range(6):
        w.note(100, 60)                                  # each probe still wasteful
        n = 1
        while not w.admit():
            n += 1
        waits.append(n)
    assert waits == [16, 32, 64, 64, 64, 64] and STREAM_ALL_PROBE_MAX == 64
    w.note(100, 5)                                       # the probe found the routing dense again
    assert all(w.admit() for _ in range(3))
    w.note(100, 60)                                      # wasteful again: the wait starts over at 8
    assert [w.admit() for _ in range(STREAM_ALL_PROBE)] == [False] * (STREAM_ALL_PROBE - 1) + [True]
    w.note(0, 0)                                         # an empty queue says nothing
    assert w.waste == 0.6 and w.every == STREAM_ALL_PROBE


def test_issue_order_runs_and_watermark():
    """policy.IssueOrder (the engine's Walk and the simulator's HostIssue): runs of one layer's neighbouring experts
    end at a gap, a layer change, the ring's wrap and the watermark's reach; entries consumed out of order move
    the watermark only once every entry below is done."""
    from strata.policy import IssueOrder

    entries = [(0, 1), (0, 2), (0, 3), (0, 5), (0, 6), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
    o = IssueOrder(entries, ring=4)
    assert list(o.prefetch()) == [(0, 3), (3, 4)]          # the gap after e3; the watermark's reach (0 + 4)
    assert list(o.prefetch()) == []                        # nothing consumed: no slot free
    o.consume([1, 2])                                      # out of order: entry 0 still holds the watermark
    assert o.consumed == 0 and list(o.prefetch()) == []
    o.consume([0])
    assert o.consumed == 3
    assert list(o.prefetch()) == [(4, 5), (5, 7)]          # a layer change at 5; 7 = 3 + 4
    o.consume([3, 4, 5, 6])
    assert list(o.up_to(8)) == [(7, 8), (8, 10)]           # the wrap at 8 (slot 0 again) ends 7's run
    with pytest.raises(AssertionError, match="consumed twice"):
        o.consume([4])
    o2 = IssueOrder(entries, ring=2)
    with pytest.raises(AssertionError, match="beyond the ring's reach"):
        list(o2.up_to(5))


def test_routed_groups_split_a_layers_queue():
    """policy.routed_groups (the stream-all walk's layer split): the groups are walk_runs of the routed entries in
    queue order; every unrouted entry is released once, with the first group whose last entry lies past it, or
    after the last group (None)."""
    import numpy as np

    from strata.policy.stream import routed_groups, walk_runs

    rng = np.random.default_rng(0)
    for case in range(300):
        n, ring = int(rng.integers(0, 40)), int(rng.integers(4, 20))
        limit = int(rng.integers(1, ring // 2 + 1))
        start = int(rng.integers(0, 5))
        entries = [(0, int(e)) for e in rng.integers(0, 64, start + n)]
        ks = range(start, start + n)
        routed = {e for _, e in entries[start:] if rng.random() < 0.6}
        groups, unrouted = routed_groups(entries, ks, routed, limit, ring)
        kept = [k for k in ks if entries[k][1] in routed]
        assert groups == walk_runs(kept, limit, ring), case
        released = sorted(k for v in unrouted.values() for k in v)
        assert released == [k for k in ks if entries[k][1] not in routed], case
        prev_end = start - 1
        for g in groups:
            for k in unrouted.get(g[0], []):
                assert prev_end < k < g[-1], (case, k, g)
            prev_end = g[-1]
        assert all(k > prev_end for k in unrouted.get(None, [])), case
