"""strata-tiny, the bundled trained model: its files, its tokenizer, and the reference engine against the
torch oracle.

Oracle: golden/oracle/strata_tiny/oracle.npz, written by `python golden/oracle/strata_tiny/make_oracle.py`
(torch, an independent qwen3moe on the files' dequantised weights). The reference's held-out perplexity
must equal torch's within 0.5% (the issue's bound); this runs 5 + 2 short windows (~20 s on 2 cores).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from strata import models
from strata.data import default_model_path
from strata.reference.engine import RefEngine
from strata.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "strata", "data")
ORACLE = os.path.join(ROOT, "golden", "oracle", "strata_tiny", "oracle.npz")
Q8, Q4K = (os.path.join(DATA, f"strata-tiny.{q}.gguf") for q in ("Q8_0", "Q4_K"))
PPL_REL_TOL = 0.005  # the issue: reference perplexity equals torch's within 0.5%
# Logits: the reference rounds every op's result to float32 (docs/NUMERICS.md), torch float64 rounds nothing;
# measured: max |Δ| 9.5e-7 on logits up to 12 (one float32 ulp there). 1e-4 leaves 100x that.
LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module")
def oracle():
    with np.load(ORACLE) as z:
        return dict(z)


def test_bundled_files_load_and_fit():
    expect_types = {Q8: {"Q8_0", "F32"}, Q4K: {"Q4_K", "Q6_K", "Q8_0", "F32"}}
    for path, types in expect_types.items():
        assert (
            os.path.getsize(path) < 8 * 2**20
        ), f"{path} is {os.path.getsize(path):,} bytes (keep it < 8 MiB)"
        with models.load(path) as m:
            c = m.cfg
            assert (c.arch, c.n_expert, c.n_expert_used, c.n_embd % 256) == ("qwen3moe", 16, 2, 0)
            assert m.metadata["general.name"] == "strata-tiny"
            from strata import quants

            got = {quants.get(m.qtype(n)).name for n in m.tensors.names}
            assert got == types, f"{path}: tensor types {got}, expected {types}"


def test_default_model_is_the_bundled_q8_0():
    assert os.path.samefile(default_model_path(), Q8)


def test_tokenizer_round_trip_and_end_of_text():
    with models.load(Q8) as m:
        tok = Tokenizer.from_metadata(m.metadata)
    text = "def main(argv=None):\n    parser = argparse.ArgumentParser()\n    return 0\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2, "a BPE trained on Python source should compress Python (>2 chars/token)"
    assert tok.is_eog(tok.token_id("<|endoftext|>"))


def test_oracle_windows_are_the_heldout_text(oracle):
    """The stored windows are still what the GGUF's tokenizer makes of the held-out files (only where the
    stdlib sources are the recorded ones: Python 3.11.7)."""
    from strata.synth.corpus import stdlib_corpus

    if not stdlib_corpus().recorded:
        pytest.skip("this Python's stdlib sources are not the recorded corpus")
    import sys

    sys.path.insert(0, os.path.dirname(ORACLE))
    from make_oracle import SETS, heldout_ids, spread_windows

    with models.load(Q8) as m:
        ids = heldout_ids(m)
    for name, (n, w) in SETS.items():
        assert np.array_equal(oracle[f"{name}_ids"], spread_windows(ids, n, w)), f"{name} windows are stale"


def _reference_nll(path: str, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per window: summed NLL (log-softmax in float64) and the float32 logits, from empty caches."""
    nll, logits_all = [], []
    with models.load(path) as m:
        for win in windows:
            logits = RefEngine(m, "float", n_ctx=len(win) - 1).prefill([int(t) for t in win[:-1]])  # [W, V]
            l64 = logits.astype(np.float64)
            mx = l64.max(-1)
            lse = mx + np.log(np.exp(l64 - mx[:, None]).sum(-1))
            nll.append(float((lse - l64[np.arange(len(win) - 1), win[1:]]).sum()))
            logits_all.append(logits)
    return np.asarray(nll), np.stack(logits_all)


@pytest.mark.parametrize("q, n_windows", [("Q8_0", 5), ("Q4_K", 2)])
def test_reference_perplexity_equals_torch(oracle, q, n_windows):
    win = oracle["ci_ids"][:n_windows]
    W = win.shape[1] - 1
    nll, logits = _reference_nll(os.path.join(DATA, f"strata-tiny.{q}.gguf"), win)
    ref_ppl = math.exp(nll.sum() / (n_windows * W))
    for tag in ("f64", "f32"):
        t_ppl = math.exp(oracle[f"{q}_ci_nll_{tag}"][:n_windows].sum() / (n_windows * W))
        assert (
            abs(ref_ppl / t_ppl - 1) < PPL_REL_TOL
        ), f"{q}: reference ppl {ref_ppl:.4f}, torch {tag} {t_ppl:.4f}"
    # a model that learnt nothing beyond token frequencies scores the unigram perplexity, ~650 on this text
    assert ref_ppl < 200, f"{q}: held-out perplexity {ref_ppl:.1f} is not a trained model's (unigram: ~650)"
    exp = oracle[f"{q}_logits"]  # [2, P, V] torch float64
    got = logits[:2, : exp.shape[1]]
    d = np.abs(got.astype(np.float64) - exp)
    w, p, v = np.unravel_index(int(np.argmax(d)), d.shape)
    assert d.max() < LOGIT_ATOL, (
        f"{q}: logits differ by {d.max():.3g} at window {w}, position {p}, token {v}: "
        f"reference {got[w, p, v]!r}, torch {exp[w, p, v]!r}"
    )
    assert np.array_equal(got.argmax(-1), exp.argmax(-1))
