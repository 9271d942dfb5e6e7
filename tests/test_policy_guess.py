"""policy.guess.RouteMemory: which experts a routed-only chunk streams before a layer's routing sync. Oracle: the
probability a chunk of T independent tokens routes an expert, 1 - (1 - q)^T, worked by hand."""

import numpy as np
import pytest

from strata.policy.guess import GUESS_KEEP, RouteMemory

E = 16


def test_nothing_before_a_layer_is_noted():
    mem = RouteMemory(2, E)
    assert mem.guess(0, 1000, np.zeros(E, bool), 8) == []
    mem.note(1, np.full(E, 4), 8)
    assert mem.guess(0, 1000, np.zeros(E, bool), 8) == []      # layer 0 still unknown
    assert mem.guess(1, 1000, np.zeros(E, bool), 0) == []      # no room


def test_a_broad_layer_guesses_a_rings_worth_of_non_resident_experts_in_id_order():
    mem = RouteMemory(1, E)
    cnt = np.full(E, 10)
    cnt[3] = 20                                          # the likeliest: first when there are more than n
    mem.note(0, cnt, 80)                                 # q = 1/8 (2/8 for expert 3)
    resident = np.zeros(E, bool)
    resident[[0, 1]] = True
    got = mem.guess(0, 250, resident, 5)
    assert got == [2, 3, 4, 5, 6], got                   # expert 3 first by chance, the rest by id; returned sorted
    assert mem.guess(0, 250, resident, 100) == list(range(2, E))


def test_a_narrow_layer_guesses_only_its_hot_experts_and_fewer_tokens_guess_less():
    mem = RouteMemory(1, E)
    cnt = np.zeros(E, int)
    cnt[[5, 9]] = 100                                    # every token picks 5 and 9 (K = 2)
    cnt[12] = 1                                          # one token in 100 picks 12 (and not 9)
    cnt[9] -= 1
    mem.note(0, cnt, 100)
    res = np.zeros(E, bool)
    # p(12) = 1 - 0.99^T: 0.80 needs T >= 161
    assert mem.guess(0, 160, res, 8) == [5, 9]
    assert mem.guess(0, 161, res, 8) == [5, 9, 12]
    res[9] = True
    assert mem.guess(0, 161, res, 8) == [5, 12]          # resident experts are not streamed


def test_notes_decay_by_keep():
    mem = RouteMemory(1, E)
    a, b = np.zeros(E), np.zeros(E)
    a[0], b[1] = 10, 10
    mem.note(0, a, 10)
    mem.note(0, b, 10)
    assert mem.q[0, 0] == pytest.approx(GUESS_KEEP) and mem.q[0, 1] == pytest.approx(1 - GUESS_KEEP)
    p = mem.routed_p(0, 3)
    assert p[0] == pytest.approx(1 - (1 - GUESS_KEEP) ** 3) and p[2] == 0.0


def test_the_expected_routed_count_and_rows_of_a_chunk():
    """expected: the sum of 1 - (1 - q)^T over the experts asked about; mean_rows: the chunk's T·K pairs over the
    experts it is expected to route. Both None before the layer's first note (the pre-sync groups' sizing)."""
    mem = RouteMemory(1, E)
    assert mem.expected(0, 100, np.ones(E, bool)) is None and mem.mean_rows(0, 100) is None
    cnt = np.zeros(E, int)
    cnt[[5, 9]] = 100                                    # K = 2: every token picks 5 and 9
    cnt[12], cnt[9] = 1, 99                              # one token in 100 picks 12 instead of 9
    mem.note(0, cnt, 100)
    among = np.zeros(E, bool)
    among[[5, 12]] = True
    assert mem.expected(0, 50, among) == pytest.approx(1.0 + (1 - 0.99 ** 50))
    p = 1 + (1 - 0.01 ** 50) + (1 - 0.99 ** 50)         # experts 5, 9 and 12
    assert mem.mean_rows(0, 50) == pytest.approx(50 * 2 / p)


def test_routed_p_is_kept_until_the_layers_next_note():
    """RouteMemory.routed_p answers a (layer, tokens) question once until that layer's next note: read-only, the
    formula's values, and a note of one layer leaves the other layers' answers."""
    mem = RouteMemory(2, 4)
    mem.note(0, [4, 0, 0, 0], 4)
    mem.note(1, [0, 4, 0, 0], 4)
    p, p1 = mem.routed_p(0, 10), mem.routed_p(1, 10)
    assert mem.routed_p(0, 10) is p and not p.flags.writeable
    assert mem.routed_p(0, 11) is not p
    mem.note(0, [0, 0, 4, 0], 4)
    p2 = mem.routed_p(0, 10)
    assert p2 is not p and np.array_equal(p2, 1.0 - (1.0 - np.minimum(mem.q[0], 1.0)) ** 10) and p2[2] > 0
    assert mem.routed_p(1, 10) is p1
