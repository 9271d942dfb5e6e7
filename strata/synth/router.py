"""Shape a random router so expert popularity follows a Zipf law (SPEC §7: the cache and the CPU share feed on
skew). Real routing is skewed; uniform random routers are not.

How: the synthesiser keeps residual channel 0 constant (token_embd[:, 0] = c and every writer into the
residual — attn_output, expert and shared down projections — has a zero row 0), so after the FFN norm
h[0] ≈ c / rms(x) on every token. Router column 0 then acts as a per-expert bias b_e, and the rest of the router
adds token-dependent noise of unit scale. With b_e = -γ·ln(rank_e) the selection frequency falls with rank; γ is
calibrated here by Monte Carlo so that the fitted log-frequency/log-rank slope of top-K selection is -S.
"""

from __future__ import annotations

import numpy as np

NOISE_STD = 1.0           # std of the token-dependent part of a router logit
_MC_TOKENS = 3000


def _selection_freq(bias: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    E = bias.shape[0]
    logits = bias[None, :] + rng.standard_normal((_MC_TOKENS, E)) * NOISE_STD       # [N, E]
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k]                            # [N, K]
    return np.bincount(top.ravel(), minlength=E) / (_MC_TOKENS * k)


def zipf_slope(freq: np.ndarray) -> float:
    """-slope of log(frequency) against log(rank), over experts that were used (the fitted Zipf exponent)."""
    f = np.sort(freq)[::-1]
    f = f[f > 0]
    r = np.arange(1, f.size + 1)
    return float(-np.polyfit(np.log(r), np.log(f), 1)[0])


def calibrate_gamma(n_expert: int, k: int, skew: float, seed: int = 0) -> float:
    """γ such that top-k selection under bias -γ·ln(rank) + N(0, 1) has a Zipf exponent of about `skew`."""
    if skew <= 0:
        return 0.0
    ranks = np.log(np.arange(1, n_expert + 1, dtype=np.float64))
    lo, hi = 0.0, 8.0
    for _ in range(18):
        mid = (lo + hi) / 2
        s = zipf_slope(_selection_freq(-mid * ranks, k, np.random.default_rng(seed)))
        lo, hi = (mid, hi) if s < skew else (lo, mid)
    return (lo + hi) / 2


def expert_bias(n_expert: int, k: int, skew: float, rng: np.random.Generator, gamma: float) -> np.ndarray:
    """Per-expert logit bias [E]: a random permutation of -γ·ln(rank), so each layer has its own hot experts."""
    ranks = rng.permutation(n_expert) + 1
    return (-gamma * np.log(ranks)).astype(np.float64)
