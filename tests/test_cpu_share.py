"""The prefill CPU share in the GPU engine (SPEC §4-§6): `0` changes nothing, and a fixed share computes exactly
what the reference computes for the same placement (the CPU's experts on the q8 path), within the GPU path's
tolerance. On the host twin in CI; on CUDA with the `gpu` marker."""

import os

import numpy as np
import pytest

from strata import models, policy
from strata.reference import golden
from strata.reference.engine import RefEngine
from strata.reference.linalg import Path
from strata.tokenizer import Tokenizer

from test_accel_engine import KL_MAX, kl, make_device, top1_agreement

NAMES = golden.golden_models()


@pytest.fixture(scope="module")
def pool():
    from strata.accel.cpu.pool import ExpertPool

    p = ExpertPool(workers=1)
    yield p
    p.close()


def _engine(m, dev, pool, share, cache, decode_graph=True):
    from strata.accel.engine import GpuEngine

    return GpuEngine(m, dev, n_ctx=96, expert_cache=cache, pool=pool,
                     config=policy.Config(cpu_share=share, decode_graph=decode_graph))


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", NAMES)
def test_share_zero_is_the_engine_without_the_feature(kind, name, pool):
    m = models.load(golden.model_path(name))
    ids = Tokenizer.from_metadata(m.metadata).encode(golden.load_prompts()[0][1])
    cache = m.cfg.n_layer * m.cfg.n_expert // 4
    outs = []
    for p, share in ((None, None), (pool, 0.0)):
        dev = make_device(kind)
        try:
            e = _engine(m, dev, p, share, cache)
            outs.append(e.prefill(ids, all_logits=True))
            if p is not None:
                assert e.cpu_block.stats["cpu_experts"] == 0
        finally:
            dev.close()
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", NAMES)
def test_fixed_share_matches_the_reference_placement(kind, name, pool):
    m = models.load(golden.model_path(name))
    tok = Tokenizer.from_metadata(m.metadata)
    refs, gots, kls, took = [], [], [], 0
    for text in golden.load_prompts()[0]:
        ids = tok.encode(text)
        dev = make_device(kind)
        try:
            e = _engine(m, dev, pool, 0.6, 0)                        # nothing cached: every routed expert streams
            got = e.prefill(ids, all_logits=True)
            taken = dict(e.cpu_block.taken)
        finally:
            dev.close()
        took += sum(len(v) for v in taken.values())
        place = lambda l, x, taken=taken: Path.Q8 if x in taken.get(l, ()) else Path.FLOAT   # noqa: E731
        ref = RefEngine(m, Path.FLOAT, placement=place, n_ctx=len(ids)).prefill(ids)
        refs.append(ref)
        gots.append(got)
        kls.append(kl(ref[-1], got[-1]))
    assert took > 0, "the share took no expert: the test would prove nothing"
    agree, excluded = top1_agreement(np.concatenate(refs), np.concatenate(gots))
    print(f"{kind} {name}: CPU took {took} experts; first-token KL max {max(kls):.2e}; top-1 {agree:.4f} "
          f"({excluded} near-ties excluded)")
    assert max(kls) <= 0.01 and agree >= 0.99


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", NAMES)
def test_decode_misses_on_the_cpu_match_the_reference_placement(kind, name, pool):
    """Decode with nothing cached, on the per-layer path (the decode graph reads every miss over PCIe): the pool
    computes its share of the misses (SPEC §8) on the q8 path, the rest stream; the reference, given the same
    placement for that step, computes the same logits within tolerance."""
    m = models.load(golden.model_path(name))
    ids = Tokenizer.from_metadata(m.metadata).encode(golden.load_prompts()[0][1])
    dev = make_device(kind)
    try:
        e = _engine(m, dev, pool, 0.0, 0, decode_graph=False)
        nxt = int(np.argmax(e.prefill(ids)))
        got = e.decode([nxt])[-1]
        taken = dict(e.cpu_block.last_cpu)
    finally:
        dev.close()
    assert sum(map(len, taken.values())) > 0, "the CPU took no decode miss: the test would prove nothing"
    state = {"taken": {}}
    place = lambda l, x: Path.Q8 if x in state["taken"].get(l, ()) else Path.FLOAT   # noqa: E731
    ref = RefEngine(m, Path.FLOAT, placement=place, n_ctx=len(ids) + 2)
    ref.prefill(ids)
    state["taken"] = taken                                      # the decode step's placement
    want = ref.decode(nxt)
    want = want[-1] if want.ndim == 2 else want
    agree, _ = top1_agreement(want[None, :], got[None, :])          # a near-tie is not held to top-1
    print(f"{kind} {name}: CPU took {sum(map(len, taken.values()))} decode misses; KL {kl(want, got):.2e}")
    assert kl(want, got) <= KL_MAX and agree == 1.0


def test_share_through_submit_or_a_host_thread_is_the_same():
    """A pool with workers takes the share by submit/wait (no Python thread); a pool of the host thread alone
    runs it on a thread of its own. Row partitions never change arithmetic: the logits are bit-identical."""
    from strata.accel.cpu.pool import ExpertPool

    name = NAMES[0]
    m = models.load(golden.model_path(name))
    ids = Tokenizer.from_metadata(m.metadata).encode(golden.load_prompts()[0][1])
    outs, took = [], []
    for workers in (2, 0):
        with ExpertPool(workers=workers) as p:
            dev = make_device("host")
            try:
                e = _engine(m, dev, p, 0.6, 0)
                outs.append(e.prefill(ids, all_logits=True))
                took.append(e.cpu_block.stats["cpu_experts"])
            finally:
                dev.close()
    assert took[0] == took[1] > 0
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_stream_waited_share_ends_each_layer_for_the_policy_in_order(kind, pool):
    """With the pool's workers the stream, not the engine thread, waits for a shared layer's rows; the layer ends
    for the policy later (CpuBlock.settle), yet the policy still sees begin(l), end(l), begin(l+1), ... with each
    end's CPU time measured, and the chunk's last layer ends before prefill returns."""
    name = NAMES[0]
    m = models.load(golden.model_path(name))
    ids = Tokenizer.from_metadata(m.metadata).encode(golden.load_prompts()[0][1])
    dev = make_device(kind)
    try:
        e = _engine(m, dev, pool, 0.6, 0)
        pol, calls = e.cpu_block.policy, []
        begin, end = pol.begin_layer, pol.end_layer
        pol.begin_layer = lambda layer: calls.append(("begin", layer)) or begin(layer)
        pol.end_layer = lambda le: calls.append(("end", le.layer, le.n_cpu, le.cpu_ms)) or end(le)
        e.prefill(ids)
        assert e.cpu_block._open is None, "the chunk's last shared layer was left open"
    finally:
        dev.close()
    n = m.cfg.n_layer
    assert [c[:2] for c in calls] == [x for layer in range(n) for x in (("begin", layer), ("end", layer))]
    shared = [c for c in calls if c[0] == "end" and c[2] > 0]
    assert shared and all(c[3] > 0 for c in shared), "a shared layer ended without its CPU time"


def test_a_chunk_kept_off_stream_all_does_not_share(pool):
    """policy.StreamWaste may send a chunk that SPEC §3 gives the stream-all walk down the routed-only walk; the CPU
    share still takes only the chunks SPEC §4 gives it (those below stream_all_min). stream_min=0: every chunk is a
    stream-all chunk by SPEC §3, so a fixed share takes nothing, though most chunks walk routed-only."""
    from strata.accel.device.host import HostDevice
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path("tiny-qwen3moe"))
    dev = HostDevice()
    try:
        e = GpuEngine(m, dev, n_ctx=64, expert_cache=0, chunk=2, pool=pool,
                      config=policy.Config(cpu_share=0.6, stream_min=0))
        e.prefill(list(range(5, 25)))
        walks = [w for _, w, _ in e.stats.chunks]
    finally:
        dev.close()
    assert "routed-only" in walks and e.cpu_block.stats["cpu_experts"] == 0, (walks, e.cpu_block.stats)


@pytest.mark.parametrize("share", [0.3, 0.0])
def test_a_prompt_that_shares_rouses_the_pool_a_layer_ahead(share, pool, monkeypatch):
    """A fixed share arms every eligible layer: the pool's parked workers are woken (ExpertPool.rouse) once before
    each, the first at the chunk's start; with the share off they are left parked."""
    m = models.load(golden.model_path(NAMES[0]))
    ids = Tokenizer.from_metadata(m.metadata).encode(golden.load_prompts()[0][1])
    log = []
    monkeypatch.setattr(pool, "rouse", lambda: log.append("rouse"))
    dev = make_device("host")
    try:
        e = _engine(m, dev, pool, share, m.cfg.n_layer * m.cfg.n_expert // 4)
        begin = e.cpu_block.begin_layer
        monkeypatch.setattr(e.cpu_block, "begin_layer", lambda *a: (log.append("begin"), begin(*a))[1])
        e.prefill(ids)
    finally:
        dev.close()
    if share:
        assert log.count("begin") > 1 and " ".join(log) == " ".join(["rouse begin"] * log.count("begin")), log
    else:
        assert "rouse" not in log and "begin" not in log, log


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_auto_starts_from_the_load_probe(kind, pool, monkeypatch):
    """Ours: an engine whose share is auto times its pool at load and starts auto's meter from that and a blob's
    copy at the probed H2D rate (SPEC §5 starts at 0.5); policies swapped in later start from the same costs,
    fixed shares take none."""
    from strata.policy import Share, ShareMode, share_policy

    m = models.load(golden.model_path(NAMES[0]))
    dev = make_device(kind)
    try:
        lines = []
        from strata.accel.engine import GpuEngine

        e = GpuEngine(m, dev, n_ctx=96, expert_cache=m.cfg.n_layer * m.cfg.n_expert // 4, pool=pool,
                      config=policy.Config(cpu_share="auto"), log=lines.append)
        c_ms, g_ms = e.cpu_block.prior
        assert c_ms > 0 and g_ms == pytest.approx(e.arena.blob(0, 0).nbytes / (e.h2d_gbps * 1e6))
        meter = e.cpu_block.policy.meter
        assert (meter.c_avg, meter.g_avg) == (c_ms, g_ms) and meter.share != 0.5
        assert any(s.startswith("prefill CPU share: auto's meter starts from a probe: CPU ") for s in lines)
        fresh = share_policy(Share(ShareMode.AUTO))
        e.use_share(Share(ShareMode.AUTO), fresh)
        assert fresh.meter.c_avg == c_ms
        fixed = GpuEngine(m, dev, n_ctx=96, pool=pool, config=policy.Config(cpu_share=0.3))
        assert fixed.cpu_block.prior is None
        # the probe runs as a share does (submitted to the workers, waited for: no tile on this thread), drops its
        # first run and takes the median of the rest: batches of 1, 5, 6 and 7 ms read 6 ms / n an expert
        submitted = []
        monkeypatch.setattr(pool, "submit", lambda *plan, f=pool.submit: (submitted.append(len(plan[0])), f(*plan)))
        monkeypatch.setattr(pool, "run_plan", lambda *a, **k: pytest.fail("the probe took tiles on the host"))
        ticks = iter([0.0, 1.0, 10.0, 15.0, 20.0, 26.0, 30.0, 37.0])
        c2, _, n, tokens = e.cpu_block.probe_prior(e.h2d_gbps, clock=lambda: next(ticks) / 1e3)
        assert (n, tokens) == (min(32, m.cfg.n_expert), 2) and submitted == [n] * 4
        assert c2 == pytest.approx(6.0 / n)
    finally:
        dev.close()


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", NAMES)
def test_auto_against_off_over_8_prompts(kind, name, pool):
    """#8 item 3: first-token KL of auto against off over 8 prompts, one engine and one auto policy throughout (its
    state persists across requests, SPEC §6); the seeds measured mean ~0.004, max 0.025 on their models. A tiny
    model's experts cost the CPU far more than their copies, so auto would veto every share: its meter starts from
    costs that favour the CPU (c = g), and the first prompts share until its samples say otherwise. Each shared
    placement is held to the reference by test_fixed_share_matches_the_reference_placement; here the two settings
    are held to the parity tolerance against each other."""
    from strata.policy import Share, ShareMode, share_policy

    m = models.load(golden.model_path(name))
    tok = Tokenizer.from_metadata(m.metadata)
    texts = golden.load_prompts()[0]
    texts = (texts + [a + " " + b for a, b in zip(texts, texts[1:])])[:8]
    assert len(texts) == 8
    dev = make_device(kind)
    try:
        e = _engine(m, dev, pool, "auto", m.cfg.n_layer * m.cfg.n_expert // 4)
        auto, off = Share(ShareMode.AUTO), Share(ShareMode.OFF)
        pol = share_policy(auto)
        pol.prime(1.0, 1.0)
        offs, autos, took = [], [], []
        for text in texts:
            ids = tok.encode(text)
            e.use_share(off)
            e.reset()
            offs.append(e.prefill(ids))
            e.use_share(auto, pol)
            e.reset()
            n0 = e.cpu_block.stats["cpu_experts"]
            autos.append(e.prefill(ids))
            took.append(e.cpu_block.stats["cpu_experts"] - n0)
    finally:
        dev.close()
    kls = [float(kl(o, a)) for o, a in zip(offs, autos)]
    shared = [k for k, t in zip(kls, took) if t]
    agree, excluded = top1_agreement(np.stack(offs), np.stack(autos))
    print(f"{kind} {name}: first-token KL of auto against off over 8 prompts: mean {np.mean(kls):.2e}, max "
          f"{max(kls):.2e}; the CPU took {sum(took)} experts in {len(shared)} prompts (there KL max "
          f"{max(shared, default=0.0):.2e}); top-1 {agree:.3f} ({excluded} near-ties excluded)")
    assert shared, "auto took no expert: the comparison would prove nothing"
    assert all(k == 0.0 for k, t in zip(kls, took) if not t), "a prompt auto did not share differs from off"
    assert max(kls) <= KL_MAX and agree >= 0.99
