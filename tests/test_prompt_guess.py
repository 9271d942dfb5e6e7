"""Guessed walks (policy.guess): a routed-only prompt chunk streams each layer's likely experts before its routing
sync, from the routing of the engine's earlier prompts. Oracle: the same prompts on an engine that does not guess
(STRATA_PROMPT_GUESS=0's path): the logits keep their bits whether the guesses are right or wrong, and a wrong
guess costs only its copy."""

import numpy as np
import pytest

from strata import models, policy
from strata.reference import golden
from tests.test_accel_engine import _devices, device_of, make_device, prefill_each

CHUNK = 16


def _prompts(n_vocab):
    return [[(7 * i + 3 + 11 * j) % n_vocab for i in range(2 * CHUNK + 5)] for j in range(3)]


def _run(m, kind, guess: bool, seed=None):
    from strata.accel.engine import GpuEngine

    c = m.cfg
    with device_of(kind) as dev:
        e = GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=c.n_layer * c.n_expert // 4, chunk=CHUNK,
                      config=policy.Config(prompt_guess=guess, cpu_share=0.0, prompt_layer_major=False))
        if seed is not None:
            seed(e)
        outs = prefill_each(e, _prompts(c.n_vocab))
    return outs, e


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_guessed_walks_keep_the_bits(kind, name):
    """Three prompts of three chunks each on a quarter cache: the guesses (from the chunks and prompts before) are
    streamed and mostly routed, and every prompt's logits are the non-guessing engine's bits."""
    m = models.load(golden.model_path(name))
    want, e0 = _run(m, kind, False)
    got, e = _run(m, kind, True)
    assert e0.stats.guessed == 0
    assert e.stats.guessed > 0 and e.stats.guessed_unrouted < e.stats.guessed, (e.stats.guessed,
                                                                                e.stats.guessed_unrouted)
    assert all(w == "routed-only" for _, w, _ in e.stats.chunks)
    # the routed experts the guesses missed streamed after their syncs, with the routed guesses no more than what the
    # non-guessing engine streamed (the layers with no guess stream the rest)
    s = e.stats
    assert 0 < s.guessed_missed and s.guessed - s.guessed_unrouted + s.guessed_missed <= e0.stats.streamed_experts
    for i, (a, b) in enumerate(zip(want, got)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"prompt {i}"


@pytest.mark.parametrize("kind", _devices())
def test_wrong_guesses_cost_their_copies_and_keep_the_bits(kind):
    """A memory that expects every non-resident expert in every layer: most guesses are unrouted, each one's copy
    is streamed for nothing, and the logits keep their bits."""
    m = models.load(golden.model_path(golden.golden_models()[0]))

    def everything(e):
        e.routes.q[:] = 1.0
        e.routes.noted[:] = True

    want, e0 = _run(m, kind, False)
    got, e = _run(m, kind, True, seed=everything)
    assert e.stats.guessed_unrouted > 0
    assert e.stats.streamed_experts == e0.stats.streamed_experts + e.stats.guessed_unrouted
    for i, (a, b) in enumerate(zip(want, got)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"prompt {i}"


def test_no_guesses_with_the_switch_off():
    """STRATA_PROMPT_GUESS=0 (Config.prompt_guess) turns guessing off: no copy goes before a routing sync."""
    assert not policy.Config.from_env({"STRATA_PROMPT_GUESS": "0"}).prompt_guess
    assert policy.Config.from_env({}).prompt_guess
    m = models.load(golden.model_path(golden.golden_models()[0]))
    _, e = _run(m, "host", False)
    assert e.stats.guessed == 0 and not e.guess


def test_no_guesses_while_the_cpu_share_takes_the_chunk():
    """A chunk the CPU share may take guesses nothing (MoeBlock._guess): on the H200 guesses beside auto's share were
    0.94-1.01x on qwen3's quarter cache and 0.83-0.89x on flash-shape's (ab_guess_share_*_stop35.log). The memory is
    still noted, for the chunks the share does not take."""
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg
    with ExpertPool(workers=1) as pool:
        dev = make_device("host")
        try:
            e = GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=c.n_layer * c.n_expert // 4, chunk=CHUNK, pool=pool,
                          config=policy.Config(cpu_share=0.6))
            for p in _prompts(c.n_vocab):
                e.reset()
                e.prefill(p)
        finally:
            dev.close()
    assert e.cpu_block.stats["cpu_experts"] > 0, "the share took nothing: the test would prove nothing"
    assert e.stats.guessed == 0 and e.routes.noted.all()


def test_a_prompt_that_failed_leaves_no_guess_to_the_next_decode_step(monkeypatch):
    """A prompt that raises after a layer's guess went out (here the guess itself raises once it is issued) leaves no
    guessed walk behind: the next decode step, per layer, gives a fresh engine's bits (at position 0 it attends to
    itself alone)."""
    import strata.accel.moe_block as mb
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg

    def engine(dev):
        return GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=c.n_layer * c.n_expert // 4, chunk=CHUNK,
                         config=policy.Config(cpu_share=0.0, decode_graph=False))

    first, second = _prompts(c.n_vocab)[:2]
    dev = make_device("host")
    try:
        want = engine(dev).decode([5])
        e = engine(dev)
        e.prefill(first)
        guess = mb.MoeBlock._guess

        def guess_then_fail(self, layer, T):
            guess(self, layer, T)
            if self._pre is not None:
                raise KeyboardInterrupt
        monkeypatch.setattr(mb.MoeBlock, "_guess", guess_then_fail)
        e.reset()
        with pytest.raises(KeyboardInterrupt):
            e.prefill(second)
        monkeypatch.setattr(mb.MoeBlock, "_guess", guess)
        e.reset()
        got = e.decode([5])
    finally:
        dev.close()
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


def test_a_decode_step_that_failed_leaves_the_decode_ring_usable(monkeypatch):
    """A per-layer decode step that raises after its walk issued copies leaves entries unconsumed in the decode ring,
    which outlives its steps (Ring.held): the next steps forget them and give a fresh engine's bits."""
    from strata.accel import moe as moe_mod
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(golden.golden_models()[0]))

    def engine(dev):
        return GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=0, chunk=CHUNK,
                         config=policy.Config(cpu_share=0.0, decode_graph=False))

    dev = make_device("host")
    try:
        fresh = engine(dev)
        want = [fresh.decode([t]) for t in (5, 6, 7, 8)]
        e = engine(dev)
        group = moe_mod.ExpertRunner.group
        monkeypatch.setattr(moe_mod.ExpertRunner, "group", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            e.decode([5])
        assert any(e.dring.held), "the failed step left nothing held: the test would prove nothing"
        monkeypatch.setattr(moe_mod.ExpertRunner, "group", group)
        e.reset()
        got = [e.decode([t]) for t in (5, 6, 7, 8)]     # enough steps to wrap the ring onto the held slots
    finally:
        dev.close()
    for i, (w, g) in enumerate(zip(want, got)):
        assert np.array_equal(w.view(np.uint32), g.view(np.uint32)), f"step {i}"


class _Arms:
    """A share policy whose i-th eligible layer's arm is pattern[i % len], a fixed share of 0.5 on an arm; `log`
    gets each guesses() asked and begin_layer."""

    def __init__(self, pattern, log):
        from strata.policy.share import FixedShare
        self.inner, self.pattern, self.i, self.log = FixedShare(0.5), pattern, 0, log
        self.kind, self.folded = self.inner.kind, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def guesses(self, layer):
        arm = self.pattern[self.i % len(self.pattern)]
        self.log.append(("asked", layer, arm))
        return not arm

    def begin_layer(self, layer):
        arm = self.pattern[self.i % len(self.pattern)]
        self.i += 1
        self.log.append(("begin", layer, arm))
        return arm

    def peek_arm(self, layer):
        return self.pattern[self.i % len(self.pattern)]


@pytest.mark.parametrize("pattern", [(False,), (False, True)])
def test_layers_the_share_leaves_unshared_guess(monkeypatch, pattern):
    """With the CPU share on a chunk, a layer its policy lets guess (SharePolicy.guesses: auto's gate settled on "do
    not share") streams its guesses before its sync as a chunk without the share does; an armed layer guesses
    nothing (the CPU picks after the sync). Oracle: the same engine and arms with guessing off (the same CPU picks:
    the bits do not move)."""
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.engine import GpuEngine
    import strata.accel.moe_block as mb

    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg
    log, guess = [], mb.MoeBlock._guess

    def logged(self, layer, T):
        before = self.stats.guessed
        guess(self, layer, T)
        if self.stats.guessed > before:
            log.append(("guess", layer, None))
    monkeypatch.setattr(mb.MoeBlock, "_guess", logged)
    outs, engines, hists = [], [], []
    with ExpertPool(workers=1) as pool:
        for on, rows_on_device in ((False, True), (True, False), (True, True)):
            dev = make_device("host")
            try:
                e = GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=c.n_layer * c.n_expert // 4, chunk=CHUNK,
                              pool=pool, config=policy.Config(cpu_share=0.5, prompt_guess=on,
                                                              prompt_layer_major=False))
                e.rows_on_device = rows_on_device
                n, hist = [0], dev.k.route_hist
                dev.k.route_hist = lambda *a, _h=hist, **kw: (n.__setitem__(0, n[0] + 1), _h(*a, **kw))[1]
                log.clear()
                e.cpu_block.swap(_Arms(pattern, log))
                outs.append(prefill_each(e, _prompts(c.n_vocab)))
                engines.append(e)
                hists.append(n[0])
            finally:
                dev.close()
    # an unarmed layer lays its rows out on the device (the share-off path), an armed one on the host; the host's
    # layout (rows_on_device off) gives the same bits
    unarmed = sum(1 for what, _, arm in log if what == "begin" and not arm)
    assert hists[1] == 0 and hists[2] == unarmed > 0, (hists, unarmed)
    e0, e = engines[0], engines[2]
    for i, (a, h, b) in enumerate(zip(*outs)):     # guessing off, host rows, the tree's path
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"prompt {i}"
        assert np.array_equal(h.view(np.uint32), b.view(np.uint32)), f"prompt {i}, host rows"
    assert e0.stats.guessed == 0 and e.stats.guessed > 0
    for j, (what, layer, arm) in enumerate(log):
        if what == "guess":               # right after its layer's guesses(), asked while it was to be unarmed
            assert log[j - 1] == ("asked", layer, False), log[j - 1:j + 1]
        elif what == "asked":             # the arm the layer's begin_layer then gives
            assert next(x for x in log[j + 1:] if x[0] == "begin") == ("begin", layer, arm), log[j:j + 4]
    asked = [arm for what, _, arm in log if what == "asked"]
    assert False in asked and (True in asked) == (True in pattern), asked
    if True in pattern:
        assert e.cpu_block.stats["cpu_experts"] > 0, "no layer shared: the armed layers proved nothing"


@pytest.mark.parametrize("pattern", [(False,), (False, False, True)])
def test_the_pool_wakes_only_ahead_of_a_layer_that_shares(monkeypatch, pattern):
    """The share's parked workers are roused (ExpertPool.rouse) in the span before a layer its policy will arm
    (peek_arm: a layer ahead, or at the chunk's start), never before one it leaves unshared: awake workers spin and
    doze beside the engine thread, which issued 5-8% slower on the H200 (bench/results/h200/doze_q8_stop52.log)."""
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg
    log = []
    with ExpertPool(workers=1) as pool:
        monkeypatch.setattr(pool, "rouse", lambda: log.append(("rouse", None, None)))
        dev = make_device("host")
        try:
            e = GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=c.n_layer * c.n_expert // 4, chunk=CHUNK, pool=pool,
                          config=policy.Config(cpu_share=0.5, prompt_layer_major=False))
            e.cpu_block.swap(_Arms(pattern, log))
            prefill_each(e, _prompts(c.n_vocab))
        finally:
            dev.close()
    spans, roused = [], False          # (arm, roused since the begin before it) for each begin_layer
    for what, _, arm in log:
        if what == "rouse":
            roused = True
        elif what == "begin":
            spans.append((arm, roused))
            roused = False
    assert len(spans) > 3 and (True in pattern) == any(arm for arm, _ in spans), spans
    assert all(arm == r for arm, r in spans), spans
    if True in pattern:
        assert e.cpu_block.stats["cpu_experts"] > 0, "no layer shared: the armed layers proved nothing"


def test_an_unshared_layer_counts_its_streamed_experts_without_the_chooser(monkeypatch):
    """An unarmed layer's share is 0 under every policy, so the engine asks the chooser only on armed layers (on the
    H200's host it was 44 us of a settled "do not share" layer's ~120 us in the CPU block's calls:
    bench/results/h200/gap_calls_q8_stop53.log); every eligible layer's LayerEnd still carries its nstream, the
    routed non-resident experts (SPEC §6's divisor), counted here from the routing the engine reports."""
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg
    log, chosen, want = [], [], []
    with ExpertPool(workers=1) as pool:
        dev = make_device("host")
        try:
            e = GpuEngine(m, dev, n_ctx=3 * CHUNK, expert_cache=c.n_layer * c.n_expert // 4, chunk=CHUNK, pool=pool,
                          config=policy.Config(cpu_share=0.5, prompt_layer_major=False))
            arms = _Arms((False, False, True), log)
            arms.end_layer = lambda end: log.append(("end", end.layer, end.nstream)) or arms.inner.end_layer(end)
            e.cpu_block.swap(arms)
            choose = e.cpu_block.chooser.choose
            monkeypatch.setattr(e.cpu_block.chooser, "choose", lambda *a: chosen.append(a[-1]) or choose(*a))
            e.on_routing = lambda layer, ids: want.append(int(np.count_nonzero(
                (np.bincount(ids.ravel(), minlength=c.n_expert) > 0) & ~e.cache.resident(layer))))
            prefill_each(e, _prompts(c.n_vocab))
        finally:
            dev.close()
    begun = [arm for what, _, arm in log if what == "begin"]
    ends = [n for what, _, n in log if what == "end"]
    assert len(begun) > 3 and False in begun and True in begun, begun
    assert len(chosen) == sum(begun) and all(s == 0.5 for s in chosen), (chosen, begun)
    assert ends == want, (ends, want)
    assert sum(ends) > 0, "no layer streamed: the counts proved nothing"
