"""A prompt layer's cache hits launched before its routing sync (strata/accel/presync.py). The rule (plan_host)
against the host's layout and tables (moe.row_order, rows_host.group_tiles at the rule's GEMM row tile); CUDA's
plan_groups against the rule;
and the engine with the pre-sync groups against the engine without them: the same bits, at every residency, group
size and few-row threshold, with and without guessed walks, on the host twin and on CUDA."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from strata import models
from strata.accel.moe import placement, row_order
from strata.accel.presync import PreShape, fills, plan_host
from strata.accel.rows_host import group_tiles
from strata.reference import golden
from strata.tokenizer import Tokenizer

KINDS = ["host", pytest.param("cuda", marks=pytest.mark.gpu)]


@st.composite
def layers(draw):
    E = draw(st.integers(2, 60))
    K = draw(st.integers(1, min(4, E)))
    T = draw(st.integers(1, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    ids = np.stack([rng.choice(E, K, replace=False, p=None) for _ in range(T)])
    resident = rng.random(E) < draw(st.floats(0.0, 1.0))
    free = np.flatnonzero(~resident)
    guessed = rng.permutation(free)[:draw(st.integers(0, free.size))]          # a guessed walk's order
    J, G = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    few = draw(st.sampled_from([0, 2, 8]))
    return ids, resident, guessed, J, G, few, draw(st.sampled_from([4, 8]))


def _host_side(ids, resident, guessed):
    """The host's layout of a layer after its sync, as moe_block makes it (residents by id, then the guessed walk's
    routed experts in its order, then the missed ones by id)."""
    cnt = np.bincount(ids.ravel(), minlength=resident.size)
    res, strm, cpu = placement(cnt, resident, ())
    missed = [e for e in strm.tolist() if e not in set(guessed.tolist())]
    walk = guessed.tolist() + missed
    routed = set(strm.tolist())
    strm = np.asarray([e for e in walk if e in routed], np.int64)
    return cnt, row_order(cnt, (res, strm, cpu))


@settings(max_examples=300, deadline=None)
@given(layers())
def test_the_rule_gives_the_hosts_rows_and_tiles(layer):
    ids, resident, guessed, J, G, few, bm = layer
    rt = 2
    cnt, lay = _host_side(ids, resident, guessed)
    res_ids = np.flatnonzero(resident)
    order = np.concatenate([res_ids, guessed]).astype(np.int64)
    J2 = J // 2                                  # groups of the guessed experts after J - J2 of the residents'
    off, members, tiles, spans = plan_host(cnt, order, res_ids.size, order.size, J - J2, J, G, few, rt, bm)
    routed = np.flatnonzero(cnt)
    assert np.array_equal(off[routed], lay.off[routed])
    assert not off[cnt == 0].any()
    covered = lay.resident[:(J - J2) * G]
    g_routed = [e for e in guessed.tolist() if cnt[e] > 0]
    assert lay.streamed[:len(g_routed)] == g_routed
    T, K = ids.shape
    f = fills(T, K, G, few, rt, bm)
    for j, m in enumerate(members):
        mem = [int(order[i]) for i in m]
        want = covered[j * G:(j + 1) * G] if j < J - J2 else g_routed[(j - J + J2) * G:(j - J + J2 + 1) * G]
        assert mem == want
        if not mem:
            assert spans[j] == (0, 0) and tiles[j] == ([], [])
            continue
        c = lay.cnt[mem].astype(np.int64)
        s = lay.off[mem].astype(np.int64)
        tl, cut, many, _ = group_tiles(c, s, np.zeros(1, np.int64), np.array([len(mem)]), few, rt, np.array([bm]))
        # the host's many-row tiles index the many-row members; the rule's every table indexes the members
        want_few = [tuple(t) for t in tl[cut[0]:cut[1]].tolist()]
        want_gemm = [(int(many[g]), r0, r1) for g, r0, r1 in tl[cut[1]:cut[2]].tolist()]
        assert tiles[j] == (want_few, want_gemm)
        assert len(want_few) <= f[0] and len(want_gemm) <= f[1]
        assert spans[j] == (int(s[0]), int(s[-1] + c[-1]))


def test_shapes_hold_every_fill():
    """The carved strides (buffers.carve: presync.carve_shape) hold any chunk's fills up to its capacity."""
    from strata.accel.presync import CARVE_FEW_ROWS, carve_shape

    for cap, K, G in ((1, 1, 1), (64, 8, 16), (1280, 8, 16), (900, 6, 4)):
        s = carve_shape(128, cap, K, G)
        for T in (1, cap // 2 + 1, cap):
            for few in (0, 8, CARVE_FEW_ROWS):
                for bm in (64, 128):
                    nf, ng = fills(T, K, G, few, 8, bm)
                    assert nf <= s.sf and ng <= s.sg


@pytest.mark.gpu
def test_cuda_tables_are_the_rules():
    """plan_groups on CUDA against plan_host: the offsets, every group's pointers (set 0 every member, set 1 the
    many-row members, 0 elsewhere), its tiles padded with empty ones to the fills, its span."""
    pytest.importorskip("cupy")
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.gpu.kernels import ROUTE_TILE
    from strata.accel.presync import pre_bytes

    dev = CudaDevice()
    k, s = dev.k, dev.compute
    try:
        rng = np.random.default_rng(7)
        # the last two: an order not by id (its residents shuffled), the most experts route_rows takes
        for E, K, T, J, G, few, frac in ((128, 8, 900, 2, 16, 8, 0.25), (60, 4, 37, 4, 3, 8, 0.6),
                                         (512, 10, 1300, 2, 16, 8, 0.3), (8, 2, 5, 1, 8, 0, 1.0),
                                         (96, 6, 400, 4, 4, 8, 0.7), (k.route_max_experts, 8, 600, 4, 16, 8, 0.5)):
            ids = np.stack([rng.choice(E, K, replace=False, p=_skew(rng, E)) for _ in range(T)]).astype(np.int32)
            P, nt = T * K, -(-T * K // ROUTE_TILE)
            hist = dev.zeros((nt, E), np.int32)
            k.route_hist(hist, dev.asarray(ids.reshape(-1)), P, s)
            resident = rng.random(E) < frac
            res_ids = np.flatnonzero(resident)
            if E == 96:
                res_ids = rng.permutation(res_ids)
            guessed = rng.permutation(np.flatnonzero(~resident))[:5]
            order = np.concatenate([res_ids, guessed]).astype(np.int64)
            bm = 128 if E == 128 else 64
            shape = PreShape.of(J, G, 3, E, T, K, few, 8, 64)
            buf = dev.zeros((pre_bytes(shape),), np.uint8)
            pt = k.pre_tables(buf, shape)
            cache, ring = dev.zeros((E + 3, 4096), np.uint8), dev.zeros((18, 4096), np.uint8)
            where = [(cache, i) for i in rng.permutation(E + 3)[:res_ids.size]] + [(ring, i) for i in range(guessed.size)]
            blobs = [(cache, np.asarray([i for _, i in where[:res_ids.size]])), (ring, np.arange(guessed.size))]
            offs = (0, 1000, 2500)
            tiling = (few, 8, bm)
            fill = fills(T, K, G, *tiling)
            J1 = max(1, J // 2)
            k.plan_groups(pt, hist, nt, order, res_ids.size, blobs, offs, J1, J, tiling, fill, s)
            dev.synchronize()
            raw = dev.tohost(buf)
            cnt = np.bincount(ids.ravel(), minlength=E)
            off, members, tiles, spans = plan_host(cnt, order, res_ids.size, order.size, J1, J, G, *tiling)
            got_off = raw[pt.off - buf.data.ptr:][:4 * E].view(np.int32)
            assert np.array_equal(got_off, off), (E, T)
            ptrs = raw[pt.ptrs - buf.data.ptr:][:8 * J * 2 * 3 * G].view(np.uint64).reshape(J, 2, 3, G)
            tl = raw[pt.tiles - buf.data.ptr:][:12 * J * shape.ts].view(np.int32).reshape(J, shape.ts, 3)
            sp = raw[pt.spans - buf.data.ptr:][:8 * J].view(np.int32).reshape(J, 2)
            for j in range(J):
                want = np.zeros((2, 3, G), np.uint64)
                for p, i in enumerate(members[j]):
                    b, row = where[i]
                    a = np.uint64(b.data.ptr) + np.uint64(row) * np.uint64(4096)
                    for w, o in enumerate(offs):
                        want[0, w, p] = a + np.uint64(o)
                        if cnt[order[i]] > few:
                            want[1, w, p] = a + np.uint64(o)
                assert np.array_equal(ptrs[j], want), (E, T, j)
                fw, gm = tiles[j]
                want_t = np.zeros((shape.ts, 3), np.int32)
                want_t[:len(fw)] = np.asarray(fw, np.int32).reshape(-1, 3)
                want_t[shape.sf:shape.sf + len(gm)] = np.asarray(gm, np.int32).reshape(-1, 3)
                # what the launches read: each table up to its fill
                for lo, n in ((0, fill[0]), (shape.sf, fill[1])):
                    assert np.array_equal(tl[j, lo:lo + n], want_t[lo:lo + n]), (E, T, j, lo)
                assert tuple(sp[j]) == spans[j], (E, T, j)
    finally:
        dev.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_captured_plan_plans_from_the_input_written_since(kind):
    """Kernels.plan_write + plan_groups_at under presync.PreGraphs, one key for three layers' inputs (other counts,
    residents, guessed experts, group counts): run eagerly, captured, then replayed, each leaves the tables
    plan_groups makes from that input. A replay that planned from the input of its capture fails it."""
    from strata.accel.gpu.kernels import ROUTE_TILE
    from strata.accel.presync import PlanLayout, PreGraphs, pre_bytes

    dev = _device(kind)
    k, s = dev.k, dev.compute
    try:
        rng = np.random.default_rng(3)
        E, K, T, J, G = 40, 4, 30, 3, 4
        P, nt = T * K, -(-T * K // ROUTE_TILE)
        shape = PreShape.of(J, G, 3, E, T, K, 8, 8, 64)
        tiling, offs = (8, 8, 64), (0, 1000, 2500)
        fill = fills(T, K, G, *tiling)
        bufs = [dev.zeros((pre_bytes(shape),), np.uint8) for _ in range(2)]
        pts = [k.pre_tables(b, shape) for b in bufs]
        hist = dev.zeros((nt, E), np.int32)
        lay = PlanLayout(E, 3)
        blk, dblk = dev.pinned(lay.nbytes), dev.empty((lay.nbytes,), np.uint8)
        cache, ring = dev.zeros((E, 64), np.uint8), dev.zeros((8, 64), np.uint8)
        graphs = PreGraphs(dev)
        for step in range(3):
            ids = np.stack([rng.choice(E, K, replace=False, p=_skew(rng, E)) for _ in range(T)]).astype(np.int32)
            k.route_hist(hist, dev.asarray(ids.reshape(-1)), P, s)
            res = rng.permutation(np.flatnonzero(rng.random(E) < 0.5))
            guessed = rng.permutation(np.setdiff1d(np.arange(E), res))[:5]
            order = np.concatenate([res, guessed]).astype(np.int64)
            blobs = [(cache, rng.permutation(E)[:res.size]), (ring, np.arange(guessed.size))]
            J1 = 1 + step % 2
            k.plan_groups(pts[0], hist, nt, order, res.size, blobs, offs, J1, J, tiling, fill, s)
            k.plan_write(blk, shape, nt, order, res.size, blobs, offs, J1, J, tiling, fill)
            graphs.run("plan", lambda: k.plan_groups_at(pts[1], hist, blk, dblk, J, s))
            dev.synchronize()
            assert _tables(dev, pts[0], bufs[0]) == _tables(dev, pts[1], bufs[1]), (kind, step)
        assert (graphs.eager, graphs.captures, graphs.replays) == (1, 1, 1)
    finally:
        dev.close()


def _tables(dev, pt, buf):
    """What a pre-sync table buffer holds, comparable: CUDA's bytes; the twin's arrays (a blob by its buffer's id)."""
    if dev.kind == "cuda":
        return dev.tohost(buf).tobytes()
    ptrs = [None if x is None else (id(x[0]), x[1], x[2]) for x in pt.ptrs.ravel()]
    return pt.off.tolist(), ptrs, pt.tiles.tolist(), pt.spans.tolist()


def _skew(rng, E):
    p = rng.random(E) ** 4
    return p / p.sum()


def _device(kind):
    if kind == "host":
        from strata.accel.device.host import HostDevice

        return HostDevice(delay_s=0.0005)
    pytest.importorskip("cupy")
    from strata.accel.device.cuda import CudaDevice

    return CudaDevice()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-olmoe", "tiny-mixtral"])
def test_pre_sync_groups_keep_the_bits(kind, name):
    """Three prompts (the later ones guess their layers' experts from the earlier ones' routing) and a decode step,
    with 0, 2 and 4 pre-sync groups, the cache holding all, half or a quarter of the experts, groups of 16 or 2
    experts, few-row thresholds 8 and 0: the logits of every arm have the bits of the arm without pre-sync groups,
    and the arms with them issue them, of the residents and of the guessed experts."""
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(name))
    tok = Tokenizer.from_metadata(m.metadata)
    prompts = [tok.encode(t) for t in golden.load_prompts()[0][:3]]
    n_pairs = m.cfg.n_layer * m.cfg.n_expert
    for few in (8, 0):
        outs, issued = {}, {}
        for pre in (0, 2, 4):
            for cached in (n_pairs, n_pairs // 2, n_pairs // 4):
                for group in (16, 2):
                    dev = _device(kind)
                    try:
                        e = GpuEngine(m, dev, n_ctx=max(map(len, prompts)) + 4, expert_cache=cached,
                                      prompt_groups=(group,), few_rows=few)
                        e.pre_groups, e.pre_guessed = pre, pre // 2
                        e.pre_min_tokens = e.pre_wide_tokens = 0
                        n, plan = [0, 0], dev.k.plan_write

                        def spy(blk, shape, nt, order, nc1, blobs, offs, J1, J, *a, _n=n, _f=plan):
                            _n[0] += 1
                            _n[1] += J - J1                   # groups of guessed experts
                            return _f(blk, shape, nt, order, nc1, blobs, offs, J1, J, *a)
                        dev.k.plan_write = spy
                        got = []
                        for p in prompts:
                            e.reset()
                            got.append(e.prefill(p, all_logits=True))
                            # every entry of the chunk's walks consumed: the pre-sync groups' too
                            assert not any(e._ring.held), (name, pre, cached, group)
                        got.append(e.decode([5]))
                        outs[pre, cached, group] = np.concatenate(got)
                        issued[pre, cached, group] = n[0], n[1]
                    finally:
                        dev.close()
        base = outs[0, n_pairs, 16]
        for key, got in outs.items():
            assert np.array_equal(got.view(np.uint32), base.view(np.uint32)), f"{name} few={few} {key}"
        assert all(n == 3 * m.cfg.n_layer for (pre, _, _), (n, _) in issued.items() if pre), issued
        assert not any(n for (pre, _, _), (n, _) in issued.items() if not pre)
        assert any(g for (pre, c, _), (_, g) in issued.items() if pre and c < n_pairs), "no guessed groups"


def test_takes_pre_rule():
    """presync.takes_pre: every layer whose experts are all cached; else none below min_tokens, every one from
    wide_tokens, and between them the layers expected to stream no more than the ring holds (not before a note)."""
    from strata.accel.presync import takes_pre

    def never():
        raise AssertionError("the route memory asked where the rule needs no answer")

    assert takes_pre(10, True, never, 8, 768, 1024)
    assert not takes_pre(767, False, never, 8, 768, 1024)
    assert takes_pre(1024, False, never, 8, 768, 1024)
    assert takes_pre(768, False, lambda: 8.0, 8, 768, 1024) and not takes_pre(768, False, lambda: 8.5, 8, 768, 1024)
    assert not takes_pre(900, False, lambda: None, 8, 768, 1024)


def test_short_chunks_take_pre_sync_groups_where_every_expert_is_cached_or_few_stream():
    """The default gate (MoeBlock.pre_min_tokens, pre_wide_tokens): a short chunk takes pre-sync groups in a layer
    whose cache holds all its experts, and, its groups replayed as graphs (presync.PreGraphs), in a layer the route
    memory expects to stream no more than the ring holds (here the even layers). Launched one by one
    (STRATA_PROMPT_GRAPH=0), a chunk shorter than PRE_MIN_TOKENS_EAGER takes none where some stream. From
    pre_min_tokens every layer below pre_wide_tokens that streams no more than the ring holds, from pre_wide_tokens
    every layer."""
    import dataclasses

    from strata import policy
    from strata.accel.device.host import HostDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.presync import PRE_MIN_TOKENS_EAGER

    m = models.load(golden.model_path("tiny-qwen3moe"))
    ids = Tokenizer.from_metadata(m.metadata).encode(golden.load_prompts()[0][0])
    assert len(ids) < PRE_MIN_TOKENS_EAGER
    L, n_pairs, T = m.cfg.n_layer, m.cfg.n_layer * m.cfg.n_expert, len(ids)
    assert L > 1
    narrow = (L + 1) // 2
    cases = [(n_pairs, True, None, L), (n_pairs, False, None, L), (n_pairs // 2, True, None, narrow),
             (n_pairs // 2, False, None, 0), (n_pairs // 2, True, (T, T), L), (n_pairs // 2, True, (T, T + 1), narrow),
             (n_pairs // 2, True, (T + 1, T + 1), 0)]
    calls = {}
    for cached, graphs, gate, _ in cases:
        dev = HostDevice()
        try:
            cfg = dataclasses.replace(policy.from_process(), prompt_graph=graphs)
            e = GpuEngine(m, dev, n_ctx=T + 4, expert_cache=cached, config=cfg)
            assert (e.pre_graphs is not None) == graphs
            if gate is not None:
                e.pre_min_tokens, e.pre_wide_tokens = gate
            expected = e.routes.expected

            def narrow_even(layer, tokens, among, _f=expected, _e=e):
                streaming = np.array_equal(np.asarray(among, bool), ~_e.cache.resident(layer))
                return (0.0 if layer % 2 == 0 else 1e9) if streaming else _f(layer, tokens, among)
            e.routes.expected = narrow_even
            n, plan = [0], dev.k.plan_write
            dev.k.plan_write = lambda *a, **kw: (n.__setitem__(0, n[0] + 1), plan(*a, **kw))[1]
            e.prefill(ids)
            calls[cached, graphs, gate] = n[0]
        finally:
            dev.close()
    assert calls == {(c, g, gate): want for c, g, gate, want in cases}, calls


@pytest.mark.parametrize("kind", KINDS)
def test_pre_sync_group_graphs_replay_the_launches(kind):
    """presync.PreGraphs: a prompt met three times runs its layers' pre-sync groups eagerly, then captures them,
    then replays them. With up to four groups a layer of two experts each (two groups of guessed experts), the cache
    holding all or a quarter of the experts, prompts of another length between them (other keys), and a prompt of
    the first one's length but other tokens (the same keys, other routing: the replays plan from its counts and
    residents), the logits have the bits of the engine that launches the groups one by one, with the plan, rows,
    gather and residents' groups as one graph (MoeBlock.pre_head) and each launched alone."""
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path("tiny-qwen3moe"))
    tok = Tokenizer.from_metadata(m.metadata)
    a, b = (tok.encode(t) for t in golden.load_prompts()[0][:2])
    c = a[::-1]
    assert len(a) != len(b) and c != a
    seq = [a, a, b, a, b, c, a, b, c]
    n_pairs = m.cfg.n_layer * m.cfg.n_expert
    for cached in (n_pairs, n_pairs // 4):
        outs, counts = {}, None
        for graphs, head in ((False, True), (True, False), (True, True)):
            dev = _device(kind)
            try:
                e = GpuEngine(m, dev, n_ctx=max(len(a), len(b)) + 4, expert_cache=cached, prompt_groups=(2,))
                e.pre_groups, e.pre_guessed, e.pre_head = 2, 2, head
                e.pre_min_tokens = e.pre_wide_tokens = 0
                if not graphs:
                    e.pre_graphs = None
                got = []
                for p in seq:
                    e.reset()
                    got.append(e.prefill(p, all_logits=True))
                outs[graphs, head] = got
                if graphs and head:
                    pg = e.pre_graphs
                    counts = pg.eager, pg.captures, pg.replays
            finally:
                dev.close()
        for arm in ((True, False), (True, True)):
            for i, (x, y) in enumerate(zip(outs[False, True], outs[arm])):
                assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), (cached, arm, i)
        eager, captures, replays = counts
        assert eager and captures and replays > captures, (cached, counts)


def test_pre_graphs_capture_replay_and_keep_an_allocating_key_eager():
    """presync.PreGraphs on the twin: a key runs eagerly, then is captured (the capture runs nothing, its graph's
    launch runs the work once), then replays; a key whose work allocates fails its capture (the 1-byte region) and
    runs eagerly then and from then on. Each run's work runs exactly once."""
    from strata.accel.device.host import HostDevice
    from strata.accel.presync import PreGraphs

    dev = HostDevice()
    try:
        g, done = PreGraphs(dev), []

        def work(tag, allocate=False):
            def fn():
                if allocate:
                    dev.empty((64,), np.float32)
                dev.compute._put(lambda: done.append(tag))
            return fn
        for _ in range(3):
            g.run(("a",), work("a"))
            g.run(("b",), work("b", allocate=True))
        dev.synchronize()
        assert done.count("a") == 3 and done.count("b") == 3, done
        assert (g.eager, g.captures, g.replays) == (1 + 3, 1, 1), (g.eager, g.captures, g.replays)
        assert len(g.graphs) == 1 and g.seen == {(("a",), id(dev.compute)): True, (("b",), id(dev.compute)): False}
    finally:
        dev.close()
