"""Adaptive-tier admission (SPEC §7) on a 2-layer, 6-expert cache."""

import pytest

from strata.policy import TIERS, AdaptiveTier, Move, Registry, TierKind
from strata.policy.chooser import ChooserKind


def test_adapt_every_fourth_round_with_decay():
    t = TIERS.create(TierKind.ADAPTIVE, n_layer=2, n_expert=6)
    resident = [[True, True, False, False, False, False], [True, False, False, False, False, False]]
    t.note(0, [2] * 5 + [3] * 2 + [0] * 3 + [1])  # layer 0 usage: e0 3, e1 1, e2 5, e3 2
    t.note(1, [4] * 3 + [0] * 4 + [5])  # layer 1 usage: e0 4, e4 3, e5 1
    assert t.end_round(resident, free_slots=1) == []
    assert t.end_round(resident, free_slots=1) == []
    assert t.end_round(resident, free_slots=1) == []
    moves = t.end_round(resident, free_slots=1)
    # candidates (usage >= 2, not resident): layer 0: e2 (5), e3 (2); layer 1: e4 (3)
    # free slot -> the hottest, L0 e2 (gain 5); then L0 e3 vs least-used resident e1 (1): 2 >= 2.5? no;
    # L1 e4 vs e0 (4): 3 >= 5.5? no
    assert moves == [Move(0, 2, None, 5.0)]
    assert t.usage[0][2] == pytest.approx(3.5) and t.usage[1][0] == pytest.approx(2.8)  # decayed by 0.7


def test_swaps_sorted_by_gain_and_capped():
    t = AdaptiveTier(n_layer=2, n_expert=4, every=1, max_moves=2)
    resident = [[True, True, False, False], [True, False, False, False]]
    t.note(0, [2] * 6 + [3] * 4 + [1])  # L0: e1 1 (resident), e0 0 (resident), e2 6, e3 4
    t.note(1, [1] * 3 + [2] * 9)  # L1: e0 0 (resident), e1 3, e2 9
    moves = t.end_round(resident, free_slots=0)
    # L0: e2 vs e0 (0): gain 6; e3 vs e1 (1): gain 3. L1: e2 vs e0 (0): gain 9. Cut to 2 by gain.
    assert moves == [Move(1, 2, 0, 9.0), Move(0, 2, 0, 6.0)]


def test_registry_fails_loudly():
    reg = Registry("test", TierKind)
    reg.register(TierKind.ADAPTIVE)(AdaptiveTier)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(TierKind.ADAPTIVE)(AdaptiveTier)
    with pytest.raises(TypeError, match="is not a TierKind"):
        reg.register(ChooserKind.FEWEST_FIRST)
    with pytest.raises(KeyError, match="no policy registered"):
        Registry("empty", TierKind).get(TierKind.ADAPTIVE)
