"""The simulator against the seeds' measurements (SPEC §12): sign and size, each band next to its figure.

What was fitted (``python -m sim calibrate``, sim/calibrate.py) and what is predicted is said per row; a
fitted row's band is its fit quality, a predicted row's band is the check. Percentages are of time unless the
seed quoted tok/s (then tok/s, as the seed did). Runs are deterministic (RANDOM_SEED 0, no reading noise).
"""

from functools import lru_cache

import pytest

from sim import scenarios as S


@lru_cache(maxsize=None)
def r5090(prompt, share, gated=True):
    return S.R5090.run(prompt, share, gated=gated)


@lru_cache(maxsize=None)
def gre(share, gated=True):
    return S.GRE.run(S.GRE_PROMPT, share, gated=gated)


@lru_cache(maxsize=None)
def r6800(prompt, share, gated=True):
    return S.R6800.run(prompt, share, gated=gated)


def pct(a, b):
    return 100.0 * (a / b - 1.0)


# --- RTX 5090 + Ryzen 9 9950X3D (seed 002 DMA table), IQ2_XS, 12,000 cached experts, one chunk -----------
# off ms     250: 391   600: 507   900: 580      band +-5%      fitted (extra dense a + b·T per layer)
@pytest.mark.parametrize("t", [250, 600, 900])
def test_5090_off(t):
    assert r5090(t, 0.0).prompt_ms == pytest.approx(S.R5090_OFF_MS[t], rel=0.05)


# auto after the gate   -8.8 / -9.1 / -10.5%     band: negative, within 5 points    predicted
# auto before the gate  -9.8 / -9.9 / -10.4%    band: negative, within 5 points   600 fitted, others predicted
@pytest.mark.parametrize("t", [250, 600, 900])
@pytest.mark.parametrize("gated", [True, False])
def test_5090_auto_gain(t, gated):
    seed = pct((S.R5090_AUTO_MS if gated else S.R5090_UNGATED_MS)[t], S.R5090_OFF_MS[t])
    sim = pct(r5090(t, "auto", gated).prompt_ms, r5090(t, 0.0).prompt_ms)
    assert sim < 0 and abs(sim - seed) <= 5.0, f"{t} tokens: simulated {sim:+.1f}%, seed {seed:+.1f}%"


# shares 0.83-0.90 (auto before the gate)                                 band [0.75, 0.95]    600 fitted
# experts on the CPU over a run, before the gate: 2,574-2,748 / 3,757-3,762 / 4,091-4,095   band +-25%
@pytest.mark.parametrize("t", [250, 600, 900])
def test_5090_share_and_cpu_experts(t):
    r = r5090(t, "auto", False)
    assert 0.75 <= r.final_share <= 0.95
    lo, hi = S.R5090_CPU_UNGATED[t]
    assert 0.75 * lo <= r.n_cpu <= 1.25 * hi, f"{t} tokens: {r.n_cpu} CPU experts, seed {lo}-{hi}"


# the gate keeps ~90% (89-101%) of the gain where sharing wins            band [0.75, 1.10]    predicted
@pytest.mark.parametrize("t", [250, 600, 900])
def test_5090_gate_keeps_the_gain(t):
    off = r5090(t, 0.0).prompt_ms
    kept = (off - r5090(t, "auto").prompt_ms) / (off - r5090(t, "auto", False).prompt_ms)
    assert 0.75 <= kept <= 1.10, f"{t} tokens: the gate kept {kept:.0%} of the gain"


# --- RX 7900 GRE + Ryzen 7 5700X3D (seed 001), Coder pack, 849 tokens -------------------------------------
# off 320.1 tok/s                                 band +-3%      fitted (extra dense, fixed part)
# streamed experts (off) 7,789                    band +-10%     the cache was sized for it
# host per streamed expert 107 us off             exact: the machine's measured figure
def test_gre_off():
    r = gre(0.0)
    assert r.tok_s == pytest.approx(S.GRE_OFF_TOK_S, rel=0.03)
    assert r.n_streamed == pytest.approx(S.GRE_STREAMED_OFF, rel=0.10)
    assert r.host_us_per_streamed == S.GRE_HOST_US[0]


# tok/s against off: 0.10 -2.1%   0.20 -3.5%   auto before the gate (0.47) -4.5%
# bands:             [-0.5, -5]   [-1.5, -6.5]  [-2, -9]      fitted with the 5090 (stage 12 of calibrate.py)
# every share slower, monotonically in the share
def test_gre_every_share_loses():
    off = gre(0.0).tok_s
    f10, f20, auto = (pct(gre(s, g).tok_s, off) for s, g in ((0.10, True), (0.20, True), ("auto", False)))
    assert -5.0 <= f10 <= -0.5, f"0.10: {f10:+.1f}%"
    assert -6.5 <= f20 <= -1.5, f"0.20: {f20:+.1f}%"
    assert -9.0 <= auto <= -2.0, f"auto before the gate: {auto:+.1f}%"
    assert f10 > f20 > auto


# auto before the gate settled near parity: share 0.46-0.51          band [0.30, 0.65]      predicted
# host per streamed expert 107 -> 200 us with auto                     band [170, 230] us     predicted
def test_gre_contention():
    r = gre("auto", False)
    assert 0.30 <= r.final_share <= 0.65
    assert 170.0 <= r.host_us_per_streamed <= 230.0


# with the gate: where sharing loses, +2.0-2.3% at most (the exploration's layers)
# band: tok/s change in [-2.3%, +0.5%]                                                      predicted
def test_gre_gate_bounds_the_loss():
    r = gre("auto")
    change = pct(r.tok_s, gre(0.0).tok_s)
    assert -2.3 <= change <= 0.5, f"gated auto: {change:+.1f}% tok/s"
    assert sum(1 for s in r.layer_shares if s > 0) <= 6  # exploration (3) + a probe, of 48 layers


# --- RX 6800 + Ryzen 7 5700X3D (seed 001), IQ3_XXS, Windows ROCm ----------------------------------------
# off tok/s   ~850: 176-186   8K: 739   30K: 761      band +-12%     fitted (link H2D rate, extra dense)
@pytest.mark.parametrize("t", [850, 8192, 30000])
def test_6800_off(t):
    assert r6800(t, 0.0).tok_s == pytest.approx(S.R6800_OFF_TOK_S[t], rel=0.12)


# auto (before the gate) ~850 tokens: +37-45% tok/s           band [+15%, +60%]      predicted
# with the gate: ~90% of that                                  band [+12%, +60%]      predicted
@pytest.mark.parametrize("gated, lo", [(False, 15.0), (True, 12.0)])
def test_6800_short_prompt_gain(gated, lo):
    gain = pct(r6800(S.R6800_SHORT, "auto", gated).tok_s, r6800(S.R6800_SHORT, 0.0).tok_s)
    assert lo <= gain <= 60.0, f"{gain:+.1f}% tok/s"


# 8K / 30K: 594/593, 543/544 (0.1.39); 739/735, 761/758 (0.1.40): unchanged   exact: stream-all never shares
@pytest.mark.parametrize("t", [8192, 30000])
def test_6800_long_prompts_unchanged(t):
    auto = r6800(t, "auto", False)
    assert auto.prompt_ms == r6800(t, 0.0).prompt_ms and auto.n_cpu == 0


# --- 0.1.41 default (closing note of #1282): RTX 3060 / P100 / RTX 5070, 2K and longer unchanged ----------
# exact: with the share on by default its max is 1,024, so 2K+ chunks take the stream-all walk
# (their 512/1,000-token gains, -28..-34% / -20..-26%, are not checked: the seed names neither CPU nor model)
@pytest.mark.parametrize("name", S.DEFAULT_ON_MACHINES)
def test_default_on_2k_unchanged(name):
    sc = S.default_on(name)
    for t in (2048, 4096):
        default, off = sc.run(t, None), sc.run(t, 0.0)
        assert default.share.by_default and default.prompt_ms == off.prompt_ms and default.n_cpu == 0


# --- the gate under noisy readings (seed 002 replayed its schedule with 4% noise per reading) -------------
# where sharing loses (RX 7900 GRE): "+2.0-2.3% at most", replay worst 1.048 band: median <= +2.3%, all <= +5%
# where it wins (RTX 5090, 600 tokens): keeps ~90% of the gain                  band: every run keeps >= 60%
def test_gate_with_4pct_reading_noise():
    off = gre(0.0).prompt_ms
    losses = sorted(pct(S.GRE.run(S.GRE_PROMPT, "auto", seed=s, noise=0.04).prompt_ms, off) for s in range(5))
    assert losses[2] <= 2.3 and losses[-1] <= 5.0, f"gated losses with noise: {losses}"
    off, ungated = r5090(600, 0.0).prompt_ms, r5090(600, "auto", False).prompt_ms
    kept = [
        (off - S.R5090.run(600, "auto", seed=s, noise=0.04).prompt_ms) / (off - ungated) for s in range(3)
    ]
    assert min(kept) >= 0.6, f"kept {kept}"


# --- layers that differ (seed 002: "window time per expert differs up to 8x between layers ... each layer's
# time repeats within a few percent"): why the gate compares adjacent layers. A lognormal sigma of 0.7 on each
# layer's GPU expert work (5th-95th percentile 0.3x-3.2x).  band: as above, gate keeps >= 60%, loss <= +2.3%
def test_gate_with_heterogeneous_layers():
    off = S.R5090.run(600, 0.0, layer_spread=0.7).prompt_ms
    ungated = S.R5090.run(600, "auto", gated=False, layer_spread=0.7).prompt_ms
    kept = (off - S.R5090.run(600, "auto", layer_spread=0.7).prompt_ms) / (off - ungated)
    assert ungated < off and kept >= 0.6, f"kept {kept:.0%}"
    loss = pct(
        S.GRE.run(S.GRE_PROMPT, "auto", layer_spread=0.7).prompt_ms,
        S.GRE.run(S.GRE_PROMPT, 0.0, layer_spread=0.7).prompt_ms,
    )
    assert -0.5 <= loss <= 2.3, f"gated loss {loss:+.1f}%"
