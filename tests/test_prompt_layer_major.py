"""A prompt of several chunks run layer by layer (policy.layer_major): each layer's routed experts admitted into the
cache once for all its chunks. Oracle: the same prompts on the chunk-by-chunk engine (STRATA_PROMPT_LAYER_MAJOR=0's
path), both with the dense parts op by op (prompt graphs pad a chunk's rows to 64, another GEMM shape with other
bits, and the layer-major loop takes none): the logits keep their bits, every token's too, and the cache holds its
decode residents again once the prompt's refill has landed."""

import numpy as np
import pytest

from strata import models, policy
from strata.reference import golden
from tests.test_accel_engine import _devices, device_of, make_device, prefill_each

CHUNK = 16


def _prompts(n_vocab):
    # three chunks' worth: the layer-major chunks (equal ones, policy.layer_major) are the chunk-by-chunk engine's
    return [[(7 * i + 3 + 11 * j) % n_vocab for i in range(3 * CHUNK)] for j in range(3)]


def _engine(m, dev, major: bool):
    from strata.accel.engine import GpuEngine

    c = m.cfg
    # a cache of one layer's worth: the smallest that a layer-major prompt takes (kept slots >= E)
    return GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=c.n_expert, chunk=CHUNK,
                     config=policy.Config(cpu_share=0.0, prompt_graph=False, prompt_layer_major=major))


def _run(m, kind, major: bool, all_logits=False):
    with device_of(kind) as dev:
        e = _engine(m, dev, major)
        home = e.cache.slot_of.copy()
        outs = prefill_each(e, _prompts(m.cfg.n_vocab), all_logits=all_logits)
        dev.synchronize()
        e.cache.poll()
        assert np.array_equal(e.cache.slot_of >= 0, home >= 0), "the decode residents are not back"
        assert not e.cache._pending
    return outs, e


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_layer_major_prompts_keep_the_bits(kind, name):
    """Three prompts of three chunks each: every prompt runs layer-major, streams fewer experts than chunk by chunk
    (each routed expert once a layer, not once a chunk), and gives the chunk-by-chunk engine's bits."""
    m = models.load(golden.model_path(name))
    want, e0 = _run(m, kind, False)
    got, e = _run(m, kind, True)
    assert {w for _, w, _ in e0.stats.chunks} == {"routed-only"}
    assert [w for _, w, _ in e.stats.chunks] == ["layer-major"] * 9, e.stats.chunks
    assert e.stats.streamed_experts < e0.stats.streamed_experts, (e.stats.streamed_experts,
                                                                 e0.stats.streamed_experts)
    for i, (a, b) in enumerate(zip(want, got)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"prompt {i}"


@pytest.mark.parametrize("kind", _devices())
def test_every_tokens_logits_keep_the_bits(kind):
    m = models.load(golden.model_path(golden.golden_models()[0]))
    want, _ = _run(m, kind, False, all_logits=True)
    got, _ = _run(m, kind, True, all_logits=True)
    for i, (a, b) in enumerate(zip(want, got)):
        assert a.shape == b.shape == (3 * CHUNK, m.cfg.n_vocab)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"prompt {i}"


def test_a_routing_trace_names_each_records_chunk():
    """--dump-routing's records come layer by layer, each with its own chunk's index and first position."""
    m = models.load(golden.model_path(golden.golden_models()[0]))
    dev = make_device("host")
    try:
        e = _engine(m, dev, True)
        seen = []
        e.on_routing = lambda layer, ids: seen.append((layer, e.n_chunks, e.pos, ids.shape[0]))
        e.prefill(_prompts(m.cfg.n_vocab)[0])
    finally:
        dev.close()
    want = [(l, j, j * CHUNK, CHUNK) for l in range(m.cfg.n_layer) for j in range(3)]
    assert seen == want
    assert (e.pos, e.n_chunks) == (3 * CHUNK, 3)


def test_a_prompt_that_raises_gives_the_cache_back():
    """An error in the middle of a layer-major prompt: every slot gets its decode resident back and the next prompt
    gives the bits it gives on a fresh engine."""
    m = models.load(golden.model_path(golden.golden_models()[0]))
    p = _prompts(m.cfg.n_vocab)[1]
    dev = make_device("host")
    try:
        e = _engine(m, dev, True)
        home = list(e.cache.owner)
        block = e.model.forward_block

        def failing(ops, x, layer, pos):
            if layer == 1 and e.n_chunks == 1:
                raise RuntimeError("injected")
            return block(ops, x, layer, pos)

        e.model.forward_block = failing
        with pytest.raises(RuntimeError, match="injected"):
            e.prefill(p)
        e.model.forward_block = block
        dev.synchronize()
        e.cache.poll()
        assert e.cache.owner == home and e.pos == 0
        assert sorted(map(tuple, np.argwhere(e.cache.slot_of >= 0))) == sorted(o for o in home if o is not None)
        got = e.prefill(p)
        fresh = _engine(m, dev, True).prefill(p)
    finally:
        dev.close()
    assert np.array_equal(got.view(np.uint32), fresh.view(np.uint32))


def test_the_switch_and_the_one_chunk_prompt():
    """STRATA_PROMPT_LAYER_MAJOR=0 runs chunk by chunk; a prompt of one chunk never runs layer-major."""
    assert not policy.Config.from_env({"STRATA_PROMPT_LAYER_MAJOR": "0"}).prompt_layer_major
    assert policy.Config.from_env({}).prompt_layer_major
    m = models.load(golden.model_path(golden.golden_models()[0]))
    dev = make_device("host")
    try:
        e = _engine(m, dev, True)
        e.prefill(_prompts(m.cfg.n_vocab)[0][:CHUNK])
        assert [w for _, w, _ in e.stats.chunks] == ["routed-only"]
        assert _engine(m, dev, False)._layer_major(3 * CHUNK) is None
        assert e._layer_major(3 * CHUNK) == (CHUNK, 0, False)
    finally:
        dev.close()


def test_a_copy_into_a_slot_waits_for_the_layer_that_read_it():
    """Admissions: a victim of a layer already run is overwritten only after that layer's compute (its `done`
    event): on the host twin, an event whose work has not completed holds the copy thread."""
    import threading
    import time

    from strata.accel.device.host import HostEvent
    from strata.accel.layer_major import Admissions

    m = models.load(golden.model_path(golden.golden_models()[0]))
    dev = make_device("host")
    running = HostEvent()
    running._done = threading.Event()                    # layer 0's compute, still running
    try:
        e = _engine(m, dev, True)
        cache = e.cache
        adm = Admissions(dev, cache, e.arena, e.routes, 3 * CHUNK)
        adm.done[0] = (1, running)
        e1 = int(np.flatnonzero(~cache.resident(1))[0])
        assert adm.admit(1, [e1], (1,)) == 1
        slot = int(cache.slot_of[1, e1])
        assert adm.home[slot][0] == 0                    # the victim: a slot of layer 0
        want = np.asarray(e.arena.blob(1, e1))
        time.sleep(0.05)
        assert not np.array_equal(cache.buf[slot][:want.size], want), "copied before layer 0 was done"
        running._done.set()
        dev.synchronize()
        assert np.array_equal(cache.buf[slot][:want.size], want)
    finally:
        running._done.set()
        dev.close()


def test_stream_all_keeps_its_chunks_while_its_queue_is_routed():
    """Chunks SPEC §3 sends down stream-all stay chunk by chunk while its queue is mostly routed (broad routing:
    its copies overlap every layer's compute); once it is found wasteful, the prompt runs layer-major and counts
    the waste itself, as a refused chunk does."""
    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg
    dev = make_device("host")
    try:
        from strata.accel.engine import GpuEngine

        e = GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=c.n_expert, chunk=CHUNK,
                      config=policy.Config(cpu_share=0.0, prompt_graph=False, stream_min=0))
        p = _prompts(c.n_vocab)[0]
        e.stream_waste.waste = 0.0
        e.prefill(p)
        walks = [w for _, w, _ in e.stats.chunks]
        assert walks[0] == "stream-all" and "layer-major" not in walks, walks
        e.reset()
        e.stream_waste.waste = 0.9
        e.prefill(p)
        assert [w for _, w, _ in e.stats.chunks[3:]] == ["layer-major"] * 3
        assert e.stream_waste.waste != 0.9          # counted from the prompt's routing
    finally:
        dev.close()


def test_a_layers_last_chunk_frees_its_slots_group_by_group():
    """The last chunk of a layer marks the slots it does not read free at its routing sync, and each launch group's
    slots free after that group (its on_released): the next layer's victims come in that order."""
    from strata.accel.layer_major import Admissions

    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg
    dev = make_device("host")
    try:
        e = _engine(m, dev, True)
        adm = Admissions(dev, e.cache, e.arena, e.routes, CHUNK)
        adm.last = True
        cnt = np.zeros(c.n_expert, np.int64)
        mine = np.flatnonzero(e.cache.resident(0))
        cnt[mine[:2]] = 5                                  # the chunk routes two of layer 0's residents
        adm.routed(0, cnt)
        adm.released(0, [int(mine[1])])
        adm.released(0, [int(mine[0])])
        adm.layer_done(0)
        slot = {int(x): int(e.cache.slot_of[0, x]) for x in mine}
        got = {x: adm._freed(s, 0)[0] for x, s in slot.items()}
        assert got[int(mine[1])] < got[int(mine[0])]
        assert all(got[int(x)] < got[int(mine[1])] for x in mine[2:])
        order = [s for s in adm._ready(adm._owners()).argsort(kind="stable").tolist() if s in slot.values()]
        owners = adm._owners()
        from strata.policy.layer_major import victims

        picked = [s for s in victims(owners, 1, (1,), adm._ready(owners)).tolist() if s in slot.values()]
        assert picked[-2:] == [slot[int(mine[1])], slot[int(mine[0])]], (picked, order)
    finally:
        dev.close()


def test_chunks_the_cpu_shares_stay_chunk_by_chunk():
    """Routed-only chunks with the prefill CPU share on (SPEC §4) keep their walk and their share."""
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg
    dev = make_device("host")
    pool = ExpertPool(workers=1)
    try:
        kw = dict(n_ctx=3 * CHUNK, expert_cache=c.n_expert, chunk=CHUNK, pool=pool)
        shared = GpuEngine(m, dev, config=policy.Config(cpu_share=0.5, prompt_graph=False), **kw)
        assert shared.share.on and shared._layer_major(3 * CHUNK) is None
        shared.prefill(_prompts(c.n_vocab)[0])
        assert {w for _, w, _ in shared.stats.chunks} == {"routed-only"}
        alone = GpuEngine(m, dev, config=policy.Config(cpu_share=0.0, prompt_graph=False), **kw)
        assert alone._layer_major(3 * CHUNK) is not None
    finally:
        pool.close()
        dev.close()


def counting(obj, attr: str) -> list:
    """Replace obj.<attr> by a wrapper that counts its calls; returns the counter, a one-element list."""
    fn, n = getattr(obj, attr), [0]

    def counted(*a, **kw):
        n[0] += 1
        return fn(*a, **kw)

    setattr(obj, attr, counted)
    return n


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_deferred_blocks_keep_the_bits(kind, name, monkeypatch):
    """Each chunk's MoE block issued after the next chunk's dense part, a layer's last after the next layer's first
    chunk's (accel/deferred.py): the same bits as each block in place, every token's, and every block but the
    prompt's last deferred."""
    from strata.accel.layer_major import Admissions

    m = models.load(golden.model_path(name))
    outs, deferred = {}, {}
    for defer in (False, True):
        with device_of(kind) as dev:
            e = _engine(m, dev, True)
            e.defer_blocks = defer
            n = counting(e, "_defer_block")
            # each chunk's routing sync sees its own chunk's state: the admissions' `last` (a layer's last chunk
            # frees the layer's slots for the next one) true for the third chunk of each layer only
            lasts, order = [], []
            routed, done, issue = Admissions.routed, Admissions.layer_done, e._block
            monkeypatch.setattr(Admissions, "routed", lambda self, layer, cnt: (lasts.append(self.last),
                                                                               routed(self, layer, cnt))[1])
            # a layer's end (its slots free for the next layer's copies) only once its last block is issued
            monkeypatch.setattr(Admissions, "layer_done", lambda self, layer: (order.append(("end", layer)),
                                                                               done(self, layer))[1])
            e._block = lambda h, layer, *a: (order.append(("block", layer)), issue(h, layer, *a))[1]
            outs[defer] = prefill_each(e, _prompts(m.cfg.n_vocab), all_logits=True)
            monkeypatch.undo()
            deferred[defer] = n[0]
            assert e._deferred is None and not e._defer
            assert lasts == [False, False, True] * (3 * m.cfg.n_layer)
            L = m.cfg.n_layer
            assert order == [("block", l) if i < 3 else ("end", l) for _ in range(3) for l in range(L)
                             for i in range(4)]
    assert deferred == {False: 0, True: 3 * (m.cfg.n_layer * 3 - 1)}      # three prompts: all but the last block
    for i, (a, b) in enumerate(zip(outs[False], outs[True])):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"prompt {i}"
