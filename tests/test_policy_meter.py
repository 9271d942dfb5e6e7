"""The share meter (SPEC §5): start 0.5, first sample initialises, alpha 0.25, clamp [0.05, 0.9]."""

import pytest

from strata.policy import ShareMeter


def test_running_means_and_clamp():
    m = ShareMeter()
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
    # c = 0.25, g = 1.5 / 30 = 0.05: share = 0.05 / 0.30
    assert p.folded == ("cpu meter: layer 3, 10 on the CPU 2.50 ms (0.2500 a expert), 30 streamed 1.50 ms "
                        "(0.0500 a expert) -> share 0.167")
    p.readings(None, None)
    assert p.folded is None
