"""The sampler's candidates (strata/sampling.py): the rule is a stable sort of all the logits (ties to the lower id),
then top-k, top-p, min-p, temperature and the draw. `ranked` selects the top k without sorting the vocabulary; it must
give the stable sort's first k exactly, ties and infinities included, and the sampler the same draws."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from strata import sampling
from strata.sampling import Sampler, SamplingParams, ranked


@st.composite
def logit_rows(draw):
    n = draw(st.integers(1, 300))
    levels = draw(st.integers(1, 12))           # few distinct values: many ties
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    x = rng.integers(0, levels, n).astype(np.float64) * 0.5
    if draw(st.booleans()):
        x[rng.random(n) < 0.2] = -np.inf
    if draw(st.booleans()):
        x += rng.standard_normal(n) * 1e-3
    return x, draw(st.integers(0, n + 3))


@settings(max_examples=400, deadline=None)
@given(logit_rows())
def test_ranked_is_the_stable_sorts_first_k(r):
    x, k = r
    want = np.argsort(-x, kind="stable")[:k if k > 0 else None]
    assert ranked(x, k).tolist() == want.tolist()


def test_ranked_with_a_nan_takes_the_full_sort():
    x = np.array([1.0, np.nan, 3.0, 3.0, 2.0])
    assert ranked(x, 2).tolist() == np.argsort(-x, kind="stable")[:2].tolist()


@pytest.mark.parametrize("kw", [{}, {"top_k": 0}, {"top_k": 1}, {"top_p": 1.0, "min_p": 0.0},
                                {"repeat_penalty": 1.3, "top_k": 5}, {"temperature": 1.7, "top_k": 400}])
def test_the_sampler_draws_what_a_full_sort_draws(kw, monkeypatch):
    """The chain with `ranked` against the same chain taking its candidates from a stable sort of all the logits
    (the rule): the same token every time, from the same seed."""
    params = SamplingParams(**kw)
    rng = np.random.default_rng(7)
    fast = Sampler(params)
    cases = []
    for _ in range(60):
        x = (rng.standard_normal(5000) * 3).astype(np.float32)
        x[rng.integers(0, 5000, 40)] = x.max()          # ties at the top
        cases.append((x, rng.integers(0, 5000, 30).tolist()))
    got = [fast(x, h) for x, h in cases]
    monkeypatch.setattr(sampling, "ranked", lambda x, k: np.argsort(-x, kind="stable")[:k if k > 0 else None])
    plain = Sampler(params)
    assert got == [plain(x, h) for x, h in cases]
