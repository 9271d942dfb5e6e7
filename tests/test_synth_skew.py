"""`--routing-skew S`: expert popularity in a synthesised model follows a Zipf law of exponent about S, measured
by running the reference engine and fitting log(usage) on log(rank) (the fit strata-tiny's card uses)."""

import numpy as np
import pytest

from strata import models
from strata.reference.engine import RefEngine
from strata.synth.build import synthesise
from strata.synth.presets import ModelShape, _mix
from strata.synth.router import zipf_slope

SHAPE = ModelShape("qwen3moe", 2, 256, 4, 2, 64, 64, 4, 64, 1024, n_ctx=1024,
                   types=_mix(embd="Q8_0", output="Q8_0", exp_gate="Q8_0", exp_up="Q8_0", exp_down="Q8_0"))
TOKENS = 800
# Band: a fit over 64 experts from 3,200 routed slots reads about +0.2 even for uniform routing (sorting
# sampling noise makes a slope); measured here: S 0 -> 0.22..0.30, 0.9 -> 0.99..1.05, 1.5 -> 1.70..1.77.
BAND = (-0.1, 0.45)


def realised_skew(tmp_path, skew: float) -> list[float]:
    p = tmp_path / f"s{skew}.gguf"
    synthesise(SHAPE, str(p), skew=skew, seed=3)
    m = models.load(p)
    cnt = np.zeros((m.cfg.n_layer, m.cfg.n_expert))
    eng = RefEngine(m, "q8", n_ctx=TOKENS, on_routing=lambda l, ids: np.add.at(cnt[l], ids.ravel(), 1))
    eng.prefill(np.random.default_rng(0).integers(0, m.cfg.n_vocab, TOKENS).tolist(), chunk=400)
    return [zipf_slope(c) for c in cnt]


@pytest.mark.parametrize("skew", [0.0, 1.2])
def test_realised_zipf_exponent_follows_the_knob(tmp_path, skew):
    for s in realised_skew(tmp_path, skew):
        assert BAND[0] <= s - skew <= BAND[1], f"asked for {skew}, routing follows {s:.2f}"


@pytest.mark.parametrize("argv,said", [(["--layers", "0"], "--layers must be >= 1, got 0"),
                                       (["--layers", "-2"], "--layers must be >= 1, got -2"),
                                       (["--routing-skew", "-1"], "--routing-skew must be >= 0"),
                                       (["--seed", "-1"], "--seed must be >= 0")])
def test_synth_checks_its_flags_as_they_parse(tmp_path, argv, said, capsys):
    """--layers 0 wrote the preset's whole model (0 read as unset): 16 GB for qwen3-30b-a3b."""
    from strata.synth.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--preset", "qwen3-30b-a3b", "--out", str(tmp_path / "x.gguf"), *argv])
    assert e.value.code == 2 and said in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_synth_into_a_missing_directory_is_one_error_line(tmp_path, capsys):
    from strata.synth.__main__ import main

    out = tmp_path / "no" / "m.gguf"
    assert main(["--preset", "tiny-qwen3moe", "--out", str(out)]) == 1
    assert f"synth: error: {out}: No such file or directory" in capsys.readouterr().err
