"""The expert-major row layout (strata/accel/moe.py row_layout, SPEC §3) against a loop that states it: experts in
row order resident | streamed | CPU, each by id; an expert's rows hold its tokens in order; slot[t, k] is the row
of pair (t, k). The fast path sorts 16-bit expert ranks (a radix sort); a model of more experts takes 64-bit keys."""

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


@pytest.mark.parametrize("n_expert, T, K", [(512, 120, 10), (40_000, 50, 4)])
def test_models_of_many_experts_lay_out_alike(n_expert, T, K):
    """flash-shape's 512 experts (ranks past 8 bits), and past 16 bits (64-bit keys, no radix sort)."""
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
    runner.tables = lambda layer, plan, lay: packed.append((plan, lay)) or tables(layer, plan, lay)
    ticks = iter(range(100))
    w = window(ids, resident, runner, ring=64, group=16, blob=1000, clock=lambda: next(ticks) * 1e-6)
    assert list(w) == ["counts", "placement", "row layout", "groups", "tables", "window"]
    assert [w[k] for k in list(w)[:-1]] == pytest.approx([1.0] * 5) and w["window"] == pytest.approx(5.0)
    (plan, lay), = packed
    members = [e for m, _, _ in plan for e in m]
    assert members == lay.resident + lay.streamed == sorted(lay.resident) + sorted(lay.streamed)
    assert sorted(members) == np.flatnonzero(np.bincount(ids.ravel(), minlength=64)).tolist()
    assert all(len(m) <= 16 for m, _, _ in plan[len(runner.resident_groups(lay.resident, lay)):])
