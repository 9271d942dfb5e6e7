"""strata.tokenizer against llama.cpp itself: ids, detokenized bytes and special ids stored by
golden/oracle/tokenizer/make_oracle.py (llama-cpp-python's `llama_tokenize` / `llama_detokenize` on
vocabulary-only GGUFs). Every configuration must agree exactly on every stored string."""

import gzip
import importlib.util
import json
import os

import pytest

from strata.tokenizer import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE_DIR = os.path.join(HERE, "..", "golden", "oracle", "tokenizer")
_spec = importlib.util.spec_from_file_location("make_oracle", os.path.join(ORACLE_DIR, "make_oracle.py"))
make_oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_oracle)
NULL = -1   # LLAMA_TOKEN_NULL


@pytest.fixture(scope="module")
def oracle():
    with gzip.open(os.path.join(ORACLE_DIR, "oracle.json.gz"), "rt", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def vocabs():
    return make_oracle.load_vocabs()


def test_oracle_matches_generator(oracle):
    # the stored file was made from the configurations the generator lists now
    assert oracle["configs"] == make_oracle.CONFIGS
    assert len(oracle["cases"]) == len(make_oracle.HAND_CASES) + make_oracle.N_RANDOM + make_oracle.N_FUZZ


@pytest.mark.parametrize("name", [c["name"] for c in make_oracle.CONFIGS])
def test_same_as_llama_cpp(oracle, vocabs, name):
    cfg = next(c for c in oracle["configs"] if c["name"] == name)
    want = oracle["results"][name]
    tok = Tokenizer.from_metadata(make_oracle.build_meta(cfg, vocabs))
    nul = lambda x: NULL if x is None else x
    assert (tok.n_vocab, nul(tok.bos_id), nul(tok.eos_id), nul(tok.eot_id)) == \
        (want["n_vocab"], want["bos"], want["eos"], want["eot"])
    assert (tok.vocab.add_bos, tok.vocab.add_eos) == (want["add_bos"], want["add_eos"])
    assert sorted(tok.eog_ids) == want["eog"]
    ref = {key: make_oracle.unpack(oracle["results"], oracle["cases"], name, key)
           for key in ("ids", "ids_plain", "detok", "detok_skip")}
    idx = want["cases"]
    assert idx == make_oracle.case_indices(cfg) and all(len(v) == len(idx) for v in ref.values())
    bad = []
    for k, i in enumerate(idx):
        s = oracle["cases"][i]
        ref_ids = ref["ids"][k]   # detokenize llama.cpp's ids, so a tokenize difference is not counted twice
        got = {"ids": tok.encode(s, add_special=True, parse_special=True),
               "ids_plain": tok.encode(s, add_special=False, parse_special=False),
               "detok": tok.decode_bytes(ref_ids, remove_special=False, unparse_special=True),
               "detok_skip": tok.decode_bytes(ref_ids, remove_special=True, unparse_special=False)}
        bad += [(key, s, val, ref[key][k]) for key, val in got.items() if val != ref[key][k]]
    assert not bad, (f"{name}: {len(bad)} differences over {len(idx)} strings x 4 checks; first: {bad[0][0]} "
                     f"of {bad[0][1]!r}\n ours      {bad[0][2]}\n llama.cpp {bad[0][3]}")
