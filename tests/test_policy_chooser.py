"""The CPU share chooser (SPEC §4): a hand example and hypothesis invariants."""

import math

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from strata.policy import CHOOSERS, MAXT, ChooserKind, FewestFirst, llround


@pytest.mark.parametrize(
    "x, n",
    [
        (0.0, 0),
        (0.49, 0),
        (0.5, 1),
        (1.5, 2),
        (2.5, 3),
        (3.5, 4),
        (2.4999, 2),
        (0.49999999999999994, 0),
        (-2.5, -3),
        (-0.5, -1),
        (7.0, 7),
    ],
)
def test_llround_halves_away_from_zero(x, n):
    assert llround(x) == n


def test_hand_example():
    #        e: 0  1  2  3  4  5  6  7  8  9
    cnt = [0, 2, 9, 1, 1, 4, 8, 3, 0, 1]
    resident = [False, True, False, False, False, False, False, False, True, False]
    in_ram = [True, True, True, True, False, True, True, True, True, True]
    # routed non-resident: 2, 3, 4, 5, 6, 7, 9 -> nstream 7
    # candidates (cnt <= 8, in RAM): 3 (1), 5 (4), 6 (8), 7 (3), 9 (1); 2 has 9 tokens, 4 is not in RAM
    # sorted by (cnt, id): 3, 9, 7, 5, 6; take = min(5, llround(0.5 * 7 = 3.5) = 4)
    ch = FewestFirst().choose(cnt, resident, in_ram, 0.5)
    assert (ch.cpu, ch.nstream, ch.n_cpu) == ((3, 9, 7, 5), 7, 4)
    assert FewestFirst().choose(cnt, resident, in_ram, 0.9).cpu == (3, 9, 7, 5, 6)  # capped by candidates
    assert FewestFirst().choose(cnt, resident, in_ram, 0.0).cpu == ()
    assert FewestFirst().choose(cnt, resident, in_ram, 1 / 14).cpu == (3,)  # 0.5 rounds up


def test_registry():
    assert isinstance(CHOOSERS.create(ChooserKind.FEWEST_FIRST), FewestFirst)


layers = st.integers(1, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 12), min_size=n, max_size=n),
        st.lists(st.booleans(), min_size=n, max_size=n),
        st.lists(st.booleans(), min_size=n, max_size=n),
        st.floats(0.0, 1.0),
    )
)


@settings(max_examples=300, deadline=None)
@given(layers)
def test_invariants(layer):
    cnt, resident, in_ram, share = layer
    ch = FewestFirst().choose(cnt, resident, in_ram, share)
    routed_nonres = [e for e in range(len(cnt)) if cnt[e] > 0 and not resident[e]]
    cands = sorted((cnt[e], e) for e in routed_nonres if cnt[e] <= MAXT and in_ram[e])
    assert ch.nstream == len(routed_nonres)
    assert ch.n_cpu == min(len(cands), math.floor(share * ch.nstream + 0.5))
    assert list(ch.cpu) == [e for _, e in cands[: ch.n_cpu]]  # a prefix of the (cnt, id) order
    assert all(cnt[e] <= MAXT and in_ram[e] and not resident[e] and cnt[e] > 0 for e in ch.cpu)
    more = FewestFirst().choose(cnt, resident, in_ram, min(1.0, share + 0.1))
    assert more.cpu[: ch.n_cpu] == ch.cpu  # monotone in the share
