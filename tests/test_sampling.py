"""The sampler's chain (strata/sampling.py) against the rule stated plainly: candidates from a stable sort of all the
logits (ties to the lower id), then top-k, top-p, min-p, temperature and the draw, all float64. `ranked` selects the
top k without sorting the vocabulary; it must give the stable sort's first k exactly, ties and infinities included."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from strata.mathfn import exp64
from strata.sampling import Sampler, SamplingParams, ranked


def _plain(params: SamplingParams, logits: np.ndarray, history: list[int], u: float) -> int:
    x = np.asarray(logits, np.float64).copy()
    if params.repeat_penalty != 1.0 and params.repeat_last_n > 0 and history:
        recent = np.unique(np.asarray(history[-params.repeat_last_n:], np.int64))
        v = x[recent]
        x[recent] = np.where(v > 0, v / params.repeat_penalty, v * params.repeat_penalty)
    ids = np.argsort(-x, kind="stable")
    if params.top_k > 0:
        ids = ids[:params.top_k]
    probs = exp64(x[ids] - x[ids[0]])
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        ids, probs = ids[:keep], probs[:keep]
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs[0]
        ids, probs = ids[keep], probs[keep]
    probs = exp64((x[ids] - x[ids[0]]) / params.temperature)
    probs /= probs.sum()
    return int(ids[min(int(np.searchsorted(np.cumsum(probs), u, side="right")), len(ids) - 1)])


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
def test_the_sampler_draws_what_the_plain_chain_draws(kw):
    params = SamplingParams(**kw)
    rng = np.random.default_rng(7)
    s = Sampler(params)
    draws = np.random.default_rng(params.seed)          # the sampler's own stream, replayed
    for i in range(60):
        x = (rng.standard_normal(5000) * 3).astype(np.float32)
        x[rng.integers(0, 5000, 40)] = x.max()          # ties at the top
        hist = rng.integers(0, 5000, 30).tolist()
        assert s(x, hist) == _plain(params, x, hist, draws.random()), i
