"""The share meter (SPEC §5): start 0.5, first sample initialises, alpha 0.25, clamp [0.05, 0.9]."""

import pytest

from strata.policy import ShareMeter


def test_running_means_and_clamp():
    m = ShareMeter(margin=0.0)                     # SPEC §5's meter: the share at the balance
    assert m.share == 0.5
    # c = 4 ms / 2 = 2, g = 6 ms / 3 = 2 -> 0.5
    assert m.sample(4.0, 2, 6.0, 3) == pytest.approx(0.5)
    # c = 1, g = 10: c_avg = 2 + 0.25 * (1 - 2) = 1.75, g_avg = 2 + 0.25 * 8 = 4 -> 4 / 5.75
    assert m.sample(1.0, 1, 10.0, 1) == pytest.approx(4 / 5.75)
    assert (m.c_avg, m.g_avg) == (1.75, 4.0)
    fast_cpu = ShareMeter()
    assert fast_cpu.sample(0.1, 1, 100.0, 1) == 0.9  # clamp high
    slow_cpu = ShareMeter()
    assert slow_cpu.sample(100.0, 1, 0.1, 1) == 0.05  # clamp low


def test_the_margin_aims_the_cpu_before_the_gpu():
    """Ours: the share is set as if each CPU expert cost MARGIN more than its running mean, so the CPU ends first."""
    from strata.policy.meter import MARGIN

    m = ShareMeter()
    assert m.margin == MARGIN == 0.25
    # c = 2, g = 2: balance 0.5, aim 2 / (2.5 + 2)
    assert m.sample(4.0, 2, 6.0, 3) == pytest.approx(2 / 4.5)
    assert m.balance == pytest.approx(0.5) and m.aim == m.share
    # the CPU's expected time at the aim's share leaves it 1 / 1.25 of the GPU's
    s = m.share
    assert (s * m.c_avg) / ((1 - s) * m.g_avg) == pytest.approx(1 / 1.25)
    # the veto reads the aim: a balance over the floor whose margin puts the CPU late is under it
    v = ShareMeter()
    v.sample(0.4, 1, 0.0225, 1)                    # c / g = 17.8: balance 0.0532, aim 0.0431
    assert v.balance > 0.05 and v.below_floor and v.share == 0.05
    assert not ShareMeter(margin=0.0).below_floor  # (no sample: no verdict)
    spec = ShareMeter(margin=0.0)
    spec.sample(0.4, 1, 0.0225, 1)
    assert not spec.below_floor and spec.aim == spec.balance
    w = v.copy()
    assert (w.c_avg, w.g_avg, w.margin, w.share) == (v.c_avg, v.g_avg, v.margin, v.share)


def test_wants_sample():
    assert ShareMeter.wants_sample(nstream=10, n_cpu=4)
    assert not ShareMeter.wants_sample(nstream=4, n_cpu=4)  # the GPU kept nothing
    assert not ShareMeter.wants_sample(nstream=10, n_cpu=0)  # the CPU took nothing


def test_the_debug_line_carries_both_sides_and_the_share():
    """STRATA_DBG_CPU_GATE's meter line (ours): auto's policy folds a layer's sample at the next routing sync."""
    from strata.policy import GatedShare, LayerEnd

    p = GatedShare()
    p.begin_layer(3)
    p.end_layer(LayerEnd(3, 40, 10, 2.5, False))
    p.readings(1.5, None)
    # c = 0.25, g = 1.5 / 30 = 0.05: share = 0.05 / (1.25 * 0.25 + 0.05) (the margin's)
    assert p.folded == ("cpu meter: layer 3, 10 on the CPU 2.50 ms (0.2500 a expert), 30 streamed 1.50 ms "
                        "(0.0500 a expert) -> share 0.138")
    p.readings(None, None)
    assert p.folded is None


def test_prime_starts_an_unsampled_meter_from_measured_costs():
    """Ours: the engine's load probe (CpuBlock.probe_prior) starts the meter, where SPEC §5 starts at 0.5; a sample
    since, or an earlier prime, keeps the meter as it is."""
    m = ShareMeter()
    assert m.prime(0.4, 0.04)
    assert (m.c_avg, m.g_avg) == (0.4, 0.04) and m.share == pytest.approx(0.04 / (1.25 * 0.4 + 0.04))
    assert not m.prime(1.0, 1.0) and m.c_avg == 0.4
    # the first sample folds in as the second: the prime is the running mean's start
    m.sample(0.2, 1, 0.04, 1)
    assert m.c_avg == pytest.approx(0.4 + 0.25 * (0.2 - 0.4))
    sampled = ShareMeter()
    sampled.sample(1.0, 1, 1.0, 1)
    assert not sampled.prime(0.4, 0.04) and sampled.c_avg == 1.0
    with pytest.raises(AssertionError):
        ShareMeter().prime(0.0, 0.04)
