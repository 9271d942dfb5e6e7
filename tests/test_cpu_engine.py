"""CPU-only generation end to end: CpuEngine's logits equal RefEngine(path="q8") bit for bit on every golden
preset (a 12-token prompt prefilled, then decode steps), and chunked prefill gives the same bits as one chunk.

Models come from the project's synthesiser (`python -m strata.synth --preset tiny-*`), written once per session
into a temporary directory; between them the four presets cover every weight type of SPEC §1.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from strata import models
from strata.accel.cpu.ops import CpuEngine
from strata.accel.cpu.pool import ExpertPool
from strata.reference.engine import RefEngine
from strata.synth.build import synthesise
from strata.synth.presets import PRESETS
from strata.synth.vocab import tokenizer_meta_for

GOLDEN = ("tiny-qwen3moe", "tiny-mixtral", "tiny-qwen2moe", "tiny-olmoe")
N_CTX = 64


@pytest.fixture(scope="module")
def pool():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = ExpertPool(2, host=True)
    yield p
    p.close()


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden")
    out = {}
    for name in GOLDEN:
        shape = PRESETS[name]
        out[name] = str(d / f"{name}.gguf")
        synthesise(shape, out[name], seed=0, name=name, tokenizer_meta=tokenizer_meta_for(shape))
    return out


def _same(a: np.ndarray, b: np.ndarray, what: str):
    diff = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
    assert diff.size == 0, f"{what}: {diff.size} logits differ, max |diff| {np.abs(a - b).max():.3g}"


@pytest.mark.parametrize("name", GOLDEN)
def test_cpu_engine_equals_reference_q8(name, model_paths, pool):
    m = models.load(model_paths[name])
    try:
        prompt = np.random.default_rng(1).integers(0, m.cfg.n_vocab, 12).tolist()
        ref = RefEngine(m, path="q8", n_ctx=N_CTX)
        cpu = CpuEngine(m, pool=pool, n_ctx=N_CTX)
        logits = ref.prefill(prompt)
        _same(cpu.prefill(prompt), logits, f"{name} prefill")
        for step in range(4):   # greedy continuation
            tok = int(np.argmax(logits[-1]))
            logits = ref.decode(tok)[None]
            _same(cpu.decode(tok)[None], logits, f"{name} decode step {step}")
    finally:
        m.close()


def test_chunked_prefill_same_bits(model_paths, pool):
    m = models.load(model_paths["tiny-qwen3moe"])
    try:
        prompt = np.random.default_rng(2).integers(0, m.cfg.n_vocab, 19).tolist()
        whole = CpuEngine(m, pool=pool, n_ctx=N_CTX).prefill(prompt)
        _same(CpuEngine(m, pool=pool, n_ctx=N_CTX).prefill(prompt, chunk=7), whole, "chunks of 7")
        _same(CpuEngine(m, pool=pool, n_ctx=N_CTX).prefill(prompt, chunk=1), whole, "token by token")
    finally:
        m.close()


def test_last_logits_only(model_paths, pool):
    """prefill(logits="last") (what generation samples from) is the last row of the full logits, chunked or not."""
    m = models.load(model_paths["tiny-mixtral"])
    try:
        prompt = np.random.default_rng(3).integers(0, m.cfg.n_vocab, 11).tolist()
        full = CpuEngine(m, pool=pool, n_ctx=N_CTX).prefill(prompt)
        for chunk in (None, 4):
            eng = CpuEngine(m, pool=pool, n_ctx=N_CTX)
            last = eng.prefill(prompt, chunk=chunk, logits="last")
            assert last.shape == (1, m.cfg.n_vocab) and eng.pos == len(prompt)
            _same(last, full[-1:], f"last logits, chunk {chunk}")
            _same(eng.decode(5), RefEngine(m, path="q8", n_ctx=N_CTX).prefill(prompt + [5])[-1], "decode after")
    finally:
        m.close()


def test_glue_equals_reference_ops():
    """Top-k with ties (the lower id first), renormalisation, RoPE (NeoX and pairs), combine in k order."""
    from strata.accel.cpu import glue
    from strata.mathfn import rope_table
    from strata.reference import linalg

    rng = np.random.default_rng(8)
    probs = rng.random((5, 16)).astype(np.float32)
    probs[0, [3, 7, 11]] = 0.99   # a three-way tie at the top
    probs[1, :] = 0.5             # all equal
    ids, w = glue.topk_rows(probs, 4)
    ref_ids = np.argsort(-probs, axis=1, kind="stable")[:, :4].astype(np.int32)
    assert np.array_equal(ids, ref_ids) and np.array_equal(w, np.take_along_axis(probs, ref_ids, axis=1))
    s = np.zeros(5, np.float32)
    for k in range(4):
        s += w[:, k]
    _same(glue.renorm_rows(w), w / s[:, None], "renorm")
    cos, sin = rope_table(64, 48, 1e4)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    pos = np.array([0, 17, 63], np.int64)
    for neox in (True, False):
        _same(glue.rope_rows(x, cos, sin, pos, 48, neox), linalg.rope(x, cos[pos], sin[pos], 48, neox), f"rope {neox}")
    T, K, D = 3, 4, 32
    ids = rng.integers(0, 6, (T, K)).astype(np.int32)
    dm = rng.standard_normal((T * K, D)).astype(np.float32)
    order = np.argsort(ids.reshape(-1), kind="stable")
    wk = rng.random((T, K)).astype(np.float32)
    y = np.empty_like(dm)
    y[order] = dm
    ref = np.zeros((T, D), np.float32)
    for k in range(K):
        ref = ref + wk[:, k, None] * y.reshape(T, K, D)[:, k]
    _same(glue.combine(dm, order, wk), ref, "combine")


def test_a_long_prompt_shows_its_progress(model_paths, pool):
    """The CPU engine calls on_layer after each block (RefEngine's hook, no arithmetic of its own: the bits stay),
    and `generate --device cpu` prints a layer's line once a second has passed (cpu/generate.py layer_progress)."""
    from strata.accel.cpu.generate import layer_progress

    m = models.load(model_paths["tiny-olmoe"])
    try:
        prompt = np.random.default_rng(4).integers(0, m.cfg.n_vocab, 9).tolist()
        seen = []
        eng = CpuEngine(m, pool=pool, n_ctx=N_CTX)
        eng.on_layer = lambda layer, t: seen.append((layer, t))
        _same(eng.prefill(prompt, chunk=5), CpuEngine(m, pool=pool, n_ctx=N_CTX).prefill(prompt), "with the hook")
        L = m.cfg.n_layer
        assert seen == [(l, 5) for l in range(L)] + [(l, 4) for l in range(L)]
    finally:
        m.close()
    now, lines = [0.0], []
    on_layer = layer_progress(4, lines.append, every_s=1.0, clock=lambda: now[0])
    for layer, t in ((0, 0.4), (1, 1.1), (2, 1.9), (3, 2.2)):
        now[0] = t
        on_layer(layer, 30000)
    assert lines == ["prefill: layer 2 of 4, 30,000 tokens, 1.1 s", "prefill: layer 4 of 4, 30,000 tokens, 2.2 s"]
