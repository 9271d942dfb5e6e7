"""Routing workloads: synthetic Zipf (deterministic, K per token on average) and --dump-routing traces."""

import numpy as np
import pytest

from sim.workload import TraceRouting, ZipfRouting, inclusion, residency


def test_inclusion():
    p = np.array([0.7, 0.1, 0.1, 0.05, 0.05])
    q = inclusion(p, 2)  # the hot expert is in every token's top-2; the rest share one slot: 1/0.3 each
    assert q.sum() == pytest.approx(2.0, abs=1e-9) and q.max() <= 1.0
    assert q.tolist() == pytest.approx([1.0, 1 / 3, 1 / 3, 1 / 6, 1 / 6], abs=1e-9)


def test_zipf_is_deterministic_and_routes_k_per_token():
    a, b = ZipfRouting(4, 64, 4, seed=7), ZipfRouting(4, 64, 4, seed=7)
    assert np.array_equal(a.counts(2, 512, 300), b.counts(2, 512, 300))
    assert not np.array_equal(a.counts(2, 512, 300), a.counts(2, 812, 300))  # another chunk
    total = np.mean([a.counts(l, s, 1000).sum() for l in range(4) for s in range(0, 10000, 1000)])
    assert total == pytest.approx(1000 * 4, rel=0.02)
    assert [len(p) for p in a.profile()] == [64] * 4 and a.profile()[0].sum() == pytest.approx(1.0)


def test_residency_hottest_first_ties_by_layer_then_id():
    prof = [np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.5, 0.25])]
    assert residency(prof, 3) == [[True, True, False], [False, True, False]]
    assert residency(prof, 0) == [[False] * 3, [False] * 3]
    assert residency(prof, 99) == [[True] * 3, [True] * 3]


def test_trace(tmp_path):
    ids = np.array([[[0, 1], [0, 2], [3, 0]], [[1, 2], [1, 3], [2, 1]]])  # [L=2, N=3, K=2]
    np.savez(tmp_path / "routing.npz", ids=ids)
    t = TraceRouting.load(tmp_path / "routing.npz")
    assert (t.n_layer, t.n_expert) == (2, 4)
    assert t.counts(0, 0, 3).tolist() == [3, 1, 1, 1]
    assert t.counts(1, 1, 2).tolist() == [0, 2, 1, 1]
    assert t.profile()[1].tolist() == [0.0, 0.5, 1 / 3, 1 / 6]
    with pytest.raises(AssertionError, match="holds 3 tokens"):
        t.counts(0, 2, 2)


def test_run_residency_is_the_engines():
    """Run(residency=...) replaces the hottest-first fill: the walk streams exactly the routed experts that the
    given residency leaves out (an engine's own fill, e.g. the GPU engine's uniform order)."""
    import dataclasses

    from sim.engine import Run, prefill
    from sim.hardware import machine
    from sim.models import model
    from sim.whatif import setting_config

    sm = model("qwen3-30b-a3b:Q4_K_M")
    sm = dataclasses.replace(sm, shape=dataclasses.replace(sm.shape, n_layer=2))
    routing = ZipfRouting(2, sm.n_expert, sm.k, seed=3)
    res = np.zeros((2, sm.n_expert), bool)
    res[:, ::3] = True                                        # every third expert, not the hottest
    r = prefill(Run(machine("h200-host16"), sm, 64, cfg=setting_config("off"), routing=routing,
                    residency=tuple(map(tuple, res.tolist()))))
    want = sum(int(((routing.counts(l, 0, 64) > 0) & ~res[l]).sum()) for l in range(2))
    assert r.resident == int(res.sum()) and r.n_streamed == want


def test_a_prompt_waits_for_the_previous_loan_refill():
    """Prompts back to back (a benchmark's): the last prompt's lent slots refill over the link first (SPEC §9), and
    the next prompt starts only when they have landed, as the engine's lend waits for both streams."""
    import dataclasses

    from sim.engine import Run, prefill
    from sim.hardware import machine
    from sim.models import model
    from sim.whatif import setting_config

    sm = model("qwen3-30b-a3b:Q4_K_M")
    sm = dataclasses.replace(sm, shape=dataclasses.replace(sm.shape, n_layer=2))
    mach = machine("h200-host16")
    run = Run(mach, sm, 64, cfg=setting_config("off"), routing=ZipfRouting(2, sm.n_expert, sm.k, seed=3))
    base = prefill(run).prompt_ms
    after = prefill(dataclasses.replace(run, restore=100)).prompt_ms
    assert after - base == pytest.approx(100 * mach.link.h2d_us(sm.max_blob) / 1e3, rel=1e-6)
