"""The expert-major row layout (strata/accel/moe.py row_layout, SPEC §3) against a loop that states it: experts in
row order resident | streamed | CPU, each by id; an expert's rows hold its tokens in order; slot[t, k] is the row
of pair (t, k). The layout is a compiled counting sort (strata/accel/rows_host.py), for any number of experts. The
launch groups' tables (ExpertRunner.tables) against a loop too: per group, every member's blob, then the many-row
members'; few-row tiles of ROWS_TILE rows (g = member index), many-row tiles of GEMM_BM, or of the kernels'
larger tile where every many-row member of the group has more rows (g = index among those)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from strata.accel.moe import placement, row_layout


def _loop_layout(ids, cnt, parts):
    order = [int(e) for p in parts for e in p]
    rows, slot = [], np.empty(ids.shape, np.int64)
    for e in order:
        for t in range(ids.shape[0]):
            for k in np.flatnonzero(ids[t] == e):
                slot[t, k] = len(rows)
                rows.append(t)
    return order, np.asarray(rows, np.int64), slot


@st.composite
def routings(draw):
    n_expert = draw(st.integers(2, 40))
    K = draw(st.integers(1, min(4, n_expert)))
    T = draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(n_expert, K, replace=False) for _ in range(T)])    # top-k: distinct experts a token
    resident = rng.random(n_expert) < 0.4
    cpu = [e for e in range(n_expert) if not resident[e] and rng.random() < 0.3]
    return ids, resident, cpu


@settings(max_examples=200, deadline=None)
@given(routings())
def test_row_layout_is_the_loops(r):
    ids, resident, cpu = r
    cnt = np.bincount(ids.ravel(), minlength=resident.size)
    parts = placement(cnt, resident, cpu)
    lay = row_layout(ids, cnt, parts)
    order, src, slot = _loop_layout(ids, cnt, parts)
    assert lay.order.tolist() == order
    assert np.array_equal(lay.src, src) and np.array_equal(lay.slot, slot)
    assert [int(lay.off[e]) for e in order] == lay.starts.tolist() == np.cumsum([0] + [cnt[e] for e in order])[:-1].tolist()


def _device_layout(ids, cnt, parts):
    """row_order on the host, the pairs' rows by the host twin's route_hist and route_rows (the engine's device
    layout, moe_block.py): -> (the layout, src [P], slot [T, K], the counts from the downloaded hist, hist)."""
    from strata.accel.device.host import HostDevice
    from strata.accel.gpu.kernels import ROUTE_TILE
    from strata.accel.moe import row_order
    from strata.accel.rows_host import tile_sums

    T, K = ids.shape
    P, E = T * K, cnt.size
    dev = HostDevice()
    try:
        d_ids = np.ascontiguousarray(ids, np.int32)
        hist = np.full((-(-P // ROUTE_TILE), E), -7, np.int32)
        src, slot = np.full(P, -1, np.int32), np.full(P, -1, np.int32)
        dev.k.route_hist(hist, d_ids, P, dev.compute)
        lay = row_order(cnt, parts)
        dev.k.route_rows(slot, src, d_ids, lay.off.astype(np.int32), hist, P, K, dev.compute)
        dev.synchronize()
    finally:
        dev.close()
    return lay, src, slot.reshape(T, K), tile_sums(hist.reshape(-1), hist.shape[0], E), hist


@settings(max_examples=150, deadline=None)
@given(routings())
def test_the_device_layout_is_the_loops(r):
    """The host twin's device layout (counts by tile downloaded, the order on the host, the pairs' rows where the
    ids are) makes the loop's tables, and its counts are the routing's."""
    ids, resident, cpu = r
    cnt = np.bincount(ids.ravel(), minlength=resident.size)
    parts = placement(cnt, resident, cpu)
    lay, src, slot, counted, _ = _device_layout(ids, cnt, parts)
    order, want_src, want_slot = _loop_layout(ids, cnt, parts)
    assert np.array_equal(counted, cnt)
    assert lay.order.tolist() == order and lay.src is None and lay.slot is None
    assert np.array_equal(src, want_src) and np.array_equal(slot, want_slot)
    host = row_layout(ids, cnt, parts)
    assert np.array_equal(lay.off, host.off) and np.array_equal(lay.starts, host.starts)
    assert np.array_equal(lay.rank, host.rank)


def test_the_device_layout_spans_tiles():
    """Pairs past one ROUTE_TILE (a 900-token chunk of top-8 is 15 tiles): each tile's counts are its pairs', and
    the rows are the loop's (the twin's route_rows sorts all the pairs at once; CUDA's, which carries each expert's
    count over the tiles before, is held to it by test_gpu_kernels.test_route_tables)."""
    from strata.accel.gpu.kernels import ROUTE_TILE

    rng = np.random.default_rng(3)
    ids = np.stack([rng.choice(128, 8, replace=False, p=np.r_[np.full(8, 0.1), np.full(120, 0.2 / 120)])
                    for _ in range(900)])
    resident = rng.random(128) < 0.25
    cnt = np.bincount(ids.ravel(), minlength=128)
    parts = placement(cnt, resident, [])
    lay, src, slot, counted, hist = _device_layout(ids, cnt, parts)
    _, want_src, want_slot = _loop_layout(ids, cnt, parts)
    flat = ids.ravel()
    for t in range(hist.shape[0]):
        assert np.array_equal(hist[t], np.bincount(flat[t * ROUTE_TILE:(t + 1) * ROUTE_TILE], minlength=128)), t
    assert hist.shape[0] == 15 and np.array_equal(counted, cnt)
    assert np.array_equal(src, want_src) and np.array_equal(slot, want_slot)


@pytest.mark.parametrize("n_expert, T, K", [(512, 120, 10), (40_000, 50, 4)])
def test_models_of_many_experts_lay_out_alike(n_expert, T, K):
    """flash-shape's 512 experts, and past 16 bits of expert ids (the counting sort indexes ranks by id at any width)."""
    rng = np.random.default_rng(1)
    ids = np.stack([rng.choice(n_expert, K, replace=False) for _ in range(T)])
    resident = np.zeros(n_expert, bool)
    resident[rng.choice(n_expert, n_expert // 4, replace=False)] = True
    cnt = np.bincount(ids.ravel(), minlength=n_expert)
    parts = placement(cnt, resident, [])
    lay = row_layout(ids, cnt, parts)
    order, src, slot = _loop_layout(ids, cnt, parts)
    assert lay.order.tolist() == order and np.array_equal(lay.src, src) and np.array_equal(lay.slot, slot)


def test_the_host_layout_bench_runs_the_engines_window():
    """bench/host_layout.py times GpuEngine.moe's host work from the routing sync to the first launch group on the
    engine's own functions, step by step: its tables cover every routed expert once, in the engine's launch
    groups, and the steps make up the window."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    from host_layout import pack_only_runner, window

    rng = np.random.default_rng(0)
    ids = np.stack([rng.choice(64, 4, replace=False) for _ in range(100)])
    resident = rng.random(64) < 0.25
    runner = pack_only_runner(16)
    packed = []
    tables = runner.tables
    runner.tables = lambda layer, plan, lay, **kw: packed.append((plan, lay)) or tables(layer, plan, lay, **kw)
    ticks = iter(range(100))
    w = window(ids, resident, runner, ring=64, group=16, blob=1000, clock=lambda: next(ticks) * 1e-6)
    assert list(w) == ["counts", "placement", "row layout", "groups", "tables", "window"]
    assert [w[k] for k in list(w)[:-1]] == pytest.approx([1.0] * 5) and w["window"] == pytest.approx(5.0)
    (plan, lay), = packed
    members = [e for m, _, _ in plan for e in m]
    assert members == lay.resident + lay.streamed == sorted(lay.resident) + sorted(lay.streamed)
    assert sorted(members) == np.flatnonzero(np.bincount(ids.ravel(), minlength=64)).tolist()
    assert all(len(m) <= 16 for m, _, _ in plan[len(runner.resident_groups(lay.resident, lay)):])


def _loop_tiles(rows, bm, g):
    """bm-row tiles (g, start, end) of rows (start, count), never crossing the expert."""
    r0, n = rows
    return [(g, r, min(r + bm, r0 + n)) for r in range(r0, r0 + n, bm)]


@settings(max_examples=150, deadline=None)
@given(routings(), st.sampled_from([0, 1, 8, 16]), st.integers(1, 6), st.integers(0, 2**31 - 1),
       st.sampled_from([(64, 0), (64, 128), (3, 0), (3, 6)]))
def test_group_tables_are_the_loops(r, few_rows, max_group, seed, tiles):
    """tiles: (moe.GEMM_BM, the kernels' gemm_big_rows), small ones too, as these routings have at most 30 rows an
    expert: a group whose many-row members all have more than GEMM_BM rows is cut at the larger tile."""
    from types import SimpleNamespace
    from unittest import mock

    from strata.accel.gpu.kernels import Kernels
    from strata.accel.moe import ROWS_TILE, ExpertRunner

    ids, resident, cpu = r
    cnt = np.bincount(ids.ravel(), minlength=resident.size)
    lay = row_layout(ids, cnt, placement(cnt, resident, cpu))
    got = {}

    def expert_tables(sets, offs, tiles, stream, riders=()):
        got["sets"], got["tiles"] = [(b, np.asarray(i).tolist()) for b, i in sets], [np.asarray(t).tolist() for t in tiles]
        return [(n,) * 5 for n in range(len(sets))], list(riders)

    class K:       # Kernels.layer_tables on a kernel set whose expert_tables records what it is given
        layer_tables = Kernels.layer_tables

    gemm_bm, K.gemm_big_rows = tiles

    k = K()
    k.expert_tables = expert_tables
    runner = ExpertRunner.__new__(ExpertRunner)
    runner.k, runner.dev, runner.offsets, runner.few_rows = k, SimpleNamespace(compute=None), [(0, 1, 2)], few_rows
    rng = np.random.default_rng(seed)
    gpu = lay.resident + lay.streamed                  # the CPU's experts are in no group
    groups, i = [], 0
    while i < len(gpu):                                # runs in row order of 1..max_group experts
        n = int(rng.integers(1, max_group + 1))
        members = gpu[i:i + n]
        groups.append((members, "ring" if rng.random() < 0.5 else "cache", rng.integers(0, 99, len(members))))
        i += n
    if not groups:
        return
    with mock.patch("strata.accel.moe.GEMM_BM", gemm_bm):
        tabs, _ = runner.tables(0, groups, lay)
    want_sets, want_tiles = [], []
    for members, buf, idx in groups:
        many = [j for j, e in enumerate(members) if cnt[e] > few_rows]
        want_sets += [(buf, idx.tolist()), (buf, idx[many].tolist())]
        rows = [(int(lay.off[e]), int(cnt[e])) for e in members]
        want_tiles.append([t for j in range(len(members)) if j not in many
                           for t in _loop_tiles(rows[j], ROWS_TILE, j)])
        big = K.gemm_big_rows and all(rows[j][1] > gemm_bm for j in many)
        want_tiles.append([t for jj, j in enumerate(many)
                           for t in _loop_tiles(rows[j], K.gemm_big_rows if big else gemm_bm, jj)])
    assert got["sets"] == want_sets
    assert got["tiles"] == [[list(t) for t in w] for w in want_tiles]
    assert [t.n_many for t in tabs] == [sum(cnt[e] > few_rows for e in m) for m, _, _ in groups]


@settings(max_examples=100, deadline=None)
@given(routings(), st.sampled_from([0, 1, 8, 16]), st.integers(1, 6), st.integers(0, 2**31 - 1),
       st.sampled_from([(64, 0), (64, 128), (3, 6)]))
def test_the_compiled_packing_is_the_loops(r, few_rows, max_group, seed, tiles):
    """CudaKernels.layer_tables (one compiled pass, rows_host.pack_layer) against a loop that states its layout,
    over the sets and tiles Kernels.layer_tables forms (test_group_tables_are_the_loops holds those): one copy of
    [pointer tables, offset-major: for each offset, every set's blobs' addresses plus that offset | the tiles |
    slot | src, each 16-byte aligned], each set's tables named by (address, length), then its tile count."""
    from types import SimpleNamespace

    from strata.accel.gpu.cuda_kernels import CudaKernels
    from strata.accel.gpu.kernels import Kernels
    from strata.accel.moe import ROWS_TILE
    from strata.accel.rows_host import group_rows

    ids, resident, cpu = r
    cnt = np.bincount(ids.ravel(), minlength=resident.size)
    lay = row_layout(ids, cnt, placement(cnt, resident, cpu))
    order_cnt = lay.cnt[lay.order].astype(np.int64)
    rng = np.random.default_rng(seed)
    bufs = [SimpleNamespace(data=SimpleNamespace(ptr=(1 << 32) + 4096 * i), strides=(1000 + 16 * i, 1))
            for i in range(3)]
    gpu = lay.resident + lay.streamed
    groups, first, size, i = [], [], [], 0
    while i < len(gpu):
        n = int(rng.integers(1, max_group + 1))
        members = gpu[i:i + n]
        groups.append((bufs[int(rng.integers(0, 3))], rng.integers(0, 99, len(members))))
        first.append(int(lay.rank[members[0]]))
        size.append(len(members))
        i += n
    if not groups:                                     # every expert on the CPU: the engine packs no tables
        return
    pulled, formed = [], {}

    class K:
        staging = SimpleNamespace(dbase=1 << 40)

        def _st(self, stream):
            return self.staging

        def _room(self, nbytes, stream):   # the staging ring's room, written in place (stale bytes: not zeros)
            self.room = np.full(nbytes, 0xA5, np.uint8)
            return 256, self.room

        def _send(self, off, nbytes, stream):
            assert off == 256
            pulled.append(self.room[:nbytes].copy())

        def expert_tables(self, sets, offs, tiles, stream, riders=()):
            formed["sets"], formed["tiles"] = sets, tiles
            return [()] * len(sets), []

    k, args = K(), (order_cnt, lay.starts, np.asarray(first, np.int64), np.asarray(size, np.int64))
    bm = group_rows(args[0], args[2], args[3], few_rows, *tiles)      # each group's GEMM row tile
    offs, tiling = (0, 4000, 9000), (few_rows, ROWS_TILE, bm)
    slot, src = lay.slot.astype(np.int32), lay.src.astype(np.int32)
    _, want_many, _ = Kernels.layer_tables(k, groups, offs, *args, tiling, None)       # the sets, as formed
    tabs, n_many, riders = CudaKernels.layer_tables(k, groups, offs, *args, tiling, None, (slot, src))
    assert CudaKernels.layer_tables(k, groups, offs, *args, tiling, None) == (tabs, n_many, [])   # no riders
    raw = pulled[0]
    assert np.array_equal(pulled[1][:8 * len(offs) * sum(len(i) for _, i in formed["sets"])],
                          raw[:8 * len(offs) * sum(len(i) for _, i in formed["sets"])])
    dev = K.staging.dbase + 256
    up16 = lambda n: -(-n // 16) * 16
    n_ptr = sum(len(idx) for _, idx in formed["sets"])
    t0 = 8 * len(offs) * n_ptr
    s_at = up16(t0 + 12 * sum(len(t) for t in formed["tiles"]))
    r_at = s_at + up16(4 * slot.size)
    assert n_many == want_many and riders == [(dev + s_at, slot.size), (dev + r_at, src.size)]
    assert np.array_equal(raw[s_at:s_at + 4 * slot.size].view(np.int32), slot.ravel())
    assert np.array_equal(raw[r_at:r_at + 4 * src.size].view(np.int32), src.ravel())
    ptrs = raw[:t0].view(np.uint64).reshape(len(offs), n_ptr)
    tiles = raw[t0:t0 + 12 * sum(len(t) for t in formed["tiles"])].view(np.int32).reshape(-1, 3)
    p = t = 0
    for (buf, idx), tl, tab in zip(formed["sets"], formed["tiles"], tabs):
        for w, off in enumerate(offs):
            assert tab[w] == (dev + 8 * (w * n_ptr + p), len(idx))
            assert ptrs[w, p:p + len(idx)].tolist() == [buf.data.ptr + int(e) * buf.strides[0] + off for e in idx]
        assert tab[len(offs)] == (dev + t0 + 12 * t, len(tl)) and tab[-1] == len(tl)
        assert np.array_equal(tiles[t:t + len(tl)], tl)
        p, t = p + len(idx), t + len(tl)


def test_row_tables_ride_in_the_expert_tables_upload():
    """The layer's row tables (slot, src) go up with the expert tables (one upload): the host twin hands them back
    as taken at the call (later host writes do not reach them), beside one table set per group, and a layer whose
    experts all went to the CPU has no groups but still its row tables."""
    from strata.accel.device.host import HostDevice

    dev = HostDevice()
    try:
        buf = dev.zeros((4, 64), np.uint8)
        slot = np.arange(12, dtype=np.int32).reshape(4, 3)
        src = np.arange(12, dtype=np.int32)[::-1].copy()
        tiles = [np.array([[0, 0, 3]], np.int32), np.array([[0, 3, 5], [1, 5, 6]], np.int32)]
        tabs, (s_dev, r_dev) = dev.k.expert_tables([(buf, np.array([0, 1])), (buf, np.array([2]))], (0, 8, 16),
                                                   tiles, dev.compute, riders=(slot, src))
        slot[:] = -1
        src[:] = -1
        assert len(tabs) == 2 and [t[-1] for t in tabs] == [1, 2]
        np.testing.assert_array_equal(s_dev, np.arange(12).reshape(4, 3))
        np.testing.assert_array_equal(r_dev, np.arange(12)[::-1])
        none, (s2, r2) = dev.k.expert_tables([], (0, 8, 16), [], dev.compute, riders=(slot, src))
        assert none == [] and (s2 == -1).all() and (r2 == -1).all()
    finally:
        dev.close()


def test_a_group_takes_gemm_q_where_its_tiles_are_about_one_a_member():
    """gemm_q dequantises W again in every row tile, so a group takes it only cut at the small tile with at most
    GEMM_Q_TILES tiles a many-row member (moe.takes_gemm_q); else the scratch path, whose bits are the same."""
    from strata.accel.moe import GEMM_BM, GEMM_Q_TILES, takes_gemm_q

    n = 16
    most = int(GEMM_Q_TILES * n)
    assert takes_gemm_q(GEMM_BM, n, n) and takes_gemm_q(GEMM_BM, most, n)
    assert not takes_gemm_q(GEMM_BM, most + 1, n)
    assert not takes_gemm_q(2 * GEMM_BM, n, n)          # the larger tile: experts of many rows
    assert not takes_gemm_q(GEMM_BM, 0, 0)              # no many-row member


def test_a_pre_sync_group_takes_gemm_q_where_its_experts_are_expected_to_have_few_rows():
    from strata.accel.moe import GEMM_BM, PRE_Q_ROWS, pre_takes_gemm_q

    assert pre_takes_gemm_q(GEMM_BM, None) and pre_takes_gemm_q(GEMM_BM, PRE_Q_ROWS)
    assert not pre_takes_gemm_q(GEMM_BM, PRE_Q_ROWS + 1) and not pre_takes_gemm_q(2 * GEMM_BM, None)
