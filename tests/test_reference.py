"""The reference engine: golden files to the bit, determinism across runs, threads and chunkings, placements."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata import models
from strata.models.base import Routing
from strata.reference import golden
from strata.reference.engine import ContextOverflow, RefEngine
from strata.reference.linalg import Path

GOLDEN = golden.GOLDEN_DIR
NAMES = golden.golden_models()


@pytest.fixture(scope="module")
def prompts():
    return golden.load_prompts()


@pytest.mark.parametrize("name", NAMES)
def test_golden_exact(name):
    lines = []
    ok = golden.check(names=[name], log=lines.append)
    assert ok, "\n".join(lines)


def test_golden_models_are_reproducible_from_presets(tmp_path):
    """`golden --synth` rewrites exactly the committed tiny models (the synthesiser is deterministic)."""
    golden.synth_models(str(tmp_path))
    for name in golden.MODELS:
        assert (tmp_path / f"{name}.gguf").read_bytes() == open(os.path.join(GOLDEN, f"{name}.gguf"), "rb").read()


def _first_prompt_logits(path_model, path=Path.FLOAT):
    m = models.load(path_model)
    from strata.tokenizer import Tokenizer

    ids = Tokenizer.from_metadata(m.metadata).encode(golden.load_prompts()[0][0])
    return RefEngine(m, path, n_ctx=len(ids)).prefill(ids)


def test_perturbed_weight_breaks_golden(tmp_path):
    """The golden comparison can fail: flip one byte of one expert weight and the logits move."""
    src = os.path.join(GOLDEN, "tiny-qwen3moe.gguf")
    dst = tmp_path / "m.gguf"
    shutil.copy(src, dst)
    with models.load(src) as m:
        t = m.tensors.info("blk.0.attn_v.weight")                     # Q8_0: [fp16 d | 32 int8] per block
        off = t.offset + 34 * 5 + 9                                   # one int8 weight of block 5, row 0
    b = bytearray(dst.read_bytes())
    b[off] ^= 0x5A
    dst.write_bytes(bytes(b))
    with np.load(os.path.join(GOLDEN, "tiny-qwen3moe.float.npz")) as z:
        expected = z["logits_0"]
    got = _first_prompt_logits(str(dst))
    assert golden.compare({"logits_0": expected}, {"logits_0": got}), "a changed weight must change the logits"


def test_routing_rule_change_breaks_golden(monkeypatch):
    """Renormalising qwen2moe's top-k weights (it must not) changes its golden logits."""
    import strata.models.qwen2moe as q2

    orig = q2.config_from_gguf

    def renorming(gf):
        import dataclasses

        return dataclasses.replace(orig(gf), routing=Routing.SOFTMAX_TOPK_RENORM)

    monkeypatch.setattr(q2, "config_from_gguf", renorming)
    with np.load(os.path.join(GOLDEN, "tiny-qwen2moe.float.npz")) as z:
        expected = z["logits_0"]
    got = _first_prompt_logits(os.path.join(GOLDEN, "tiny-qwen2moe.gguf"))
    assert not np.array_equal(expected, got)


_SNIPPET = """
import sys, numpy as np
from strata import models
from strata.reference.engine import RefEngine
m = models.load(sys.argv[1])
ids = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43]
for path in ("float", "q8"):
    np.save(sys.argv[2] + path + ".npy", RefEngine(m, path, n_ctx=16).prefill(ids))
"""


@pytest.mark.parametrize("name", ["tiny-olmoe", "tiny-qwen2moe"])
def test_same_bits_across_runs_and_thread_counts(tmp_path, name):
    outs = []
    for threads in ("1", "2", "2"):
        env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                   NUMBA_NUM_THREADS=threads)
        pre = str(tmp_path / f"t{threads}-{len(outs)}-")
        subprocess.run([sys.executable, "-c", _SNIPPET, os.path.join(GOLDEN, f"{name}.gguf"), pre], env=env,
                       check=True)
        outs.append({p: np.load(pre + p + ".npy") for p in ("float", "q8")})
    for o in outs[1:]:
        for p in ("float", "q8"):
            assert np.array_equal(o[p].view(np.uint32), outs[0][p].view(np.uint32)), (name, p)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_chunking_does_not_change_bits(data):
    name = data.draw(st.sampled_from(NAMES))
    path = data.draw(st.sampled_from(list(Path)))
    m = models.load(golden.model_path(name))
    ids = data.draw(st.lists(st.integers(0, m.cfg.n_vocab - 1), min_size=2, max_size=14))
    whole = RefEngine(m, path, n_ctx=len(ids)).prefill(ids)
    chunk = data.draw(st.integers(1, len(ids)))
    assert np.array_equal(RefEngine(m, path, n_ctx=len(ids)).prefill(ids, chunk=chunk), whole)
    e = RefEngine(m, path, n_ctx=len(ids))
    assert np.array_equal(np.stack([e.decode(t) for t in ids]), whole)


def test_placement_mixes_paths_per_expert():
    m = models.load(os.path.join(GOLDEN, "tiny-qwen3moe.gguf"))
    ids = [5, 17, 300, 2, 999, 45, 45, 7, 100]
    fl = RefEngine(m, Path.FLOAT, n_ctx=9).prefill(ids)
    q8 = RefEngine(m, Path.Q8, n_ctx=9).prefill(ids)
    all_q8 = RefEngine(m, Path.FLOAT, placement=lambda l, e: Path.Q8, n_ctx=9).prefill(ids)
    odd = RefEngine(m, Path.FLOAT, placement=lambda l, e: Path.Q8 if e % 2 else Path.FLOAT, n_ctx=9)
    mixed = odd.prefill(ids)
    # experts on q8 but dense on float differs from all-q8; the mix differs from both ends and repeats exactly
    assert not np.array_equal(all_q8, q8) and not np.array_equal(mixed, fl) and not np.array_equal(mixed, all_q8)
    again = RefEngine(m, Path.FLOAT, placement=lambda l, e: Path.Q8 if e % 2 else Path.FLOAT, n_ctx=9).prefill(ids)
    assert np.array_equal(mixed, again)


def test_context_overflow_is_a_clear_error():
    m = models.load(os.path.join(GOLDEN, "tiny-olmoe.gguf"))
    e = RefEngine(m, Path.FLOAT, n_ctx=4)
    with pytest.raises(ContextOverflow, match="5 tokens do not fit the context of 4"):
        e.prefill([1, 2, 3, 4, 5])


def test_logits_cli(tmp_path):
    out = tmp_path / "x.npy"
    r = subprocess.run([sys.executable, "-m", "strata.reference", "logits", "--model",
                        os.path.join(GOLDEN, "tiny-qwen3moe.gguf"), "--ids", "1,2,3", "--path", "q8",
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    x = np.load(out)
    m = models.load(os.path.join(GOLDEN, "tiny-qwen3moe.gguf"))
    assert x.shape == (3, m.cfg.n_vocab) and x.dtype == np.float32
    assert np.array_equal(x, RefEngine(m, "q8", n_ctx=3).prefill([1, 2, 3]))


def test_generate_cli_with_routing_dump(tmp_path):
    from strata import routing_trace

    f = tmp_path / "r.jsonl"
    r = subprocess.run([sys.executable, "-m", "strata.reference", "generate", "--model",
                        os.path.join(GOLDEN, "tiny-qwen3moe.gguf"), "--prompt", "def f(x):", "-n", "4", "--greedy",
                        "--dump-routing", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def f(x):")
    head, recs = routing_trace.read(str(f))
    recs = list(recs)
    assert head["n_layer"] == 2 and head["n_expert"] == 8
    assert [x["layer"] for x in recs[:2]] == [0, 1]
    first = recs[0]
    assert len(first["ids"]) == first["n_tokens"] and sum(first["counts"].values()) == first["n_tokens"] * 2
    assert {x["chunk"] for x in recs} == {0, 1, 2, 3}        # the prompt, then 3 decode steps
