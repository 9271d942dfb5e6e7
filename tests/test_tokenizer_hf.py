"""Byte-level BPE parity with Hugging Face `tokenizers` (an independent BPE), on the stored 4,096-token
vocabulary trained on the stdlib corpus, for every pre-tokeniser we support: hand cases (unicode, emoji, CJK,
whitespace runs, digits, contractions, special tokens, the empty string), random slices of the stdlib text
and random strings from a mixed-script alphabet (golden/oracle/tokenizer/make_oracle.py `cases`).

HF's pipeline is built as notes/tooling.md §3 shows: Split(regex, isolated) per llama.cpp pattern, ByteLevel
without its own regex, BPE (ignore_merges for llama3), specials as added tokens.
"""

import importlib.util
import os
import time

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers  # noqa: E402

from strata.synth.bpe import tokenizer_metadata  # noqa: E402
from strata.synth.corpus import stdlib_corpus  # noqa: E402
from strata.tok import pretok  # noqa: E402
from strata.tokenizer import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "make_oracle", os.path.join(HERE, "..", "golden", "oracle", "tokenizer", "make_oracle.py"))
make_oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_oracle)

PATTERNS = {"qwen2": [pretok.QWEN2_RE], "llama-bpe": [pretok.LLAMA3_RE], "gpt-2": [pretok.GPT2_RE],
            "olmo": [pretok.GPT2_RE], "default": list(pretok.DEFAULT_RES)}


@pytest.fixture(scope="module")
def vocab():
    return make_oracle.load_vocabs()["bpe"]


@pytest.fixture(scope="module")
def corpus():
    return stdlib_corpus()


@pytest.fixture(scope="module")
def strings(corpus):
    return make_oracle.cases(corpus.text)


def hf_tokenizer(v, pre):
    tk = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(v["tokens"])},
                                         merges=[tuple(m.split(" ", 1)) for m in v["merges"]],
                                         ignore_merges=pre == "llama-bpe"))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in PATTERNS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(v["tokens"], v["types"]) if ty in (3, 4)])
    return tk


def ours(v, pre):
    return Tokenizer.from_metadata(tokenizer_metadata(v["tokens"], v["types"], v["merges"], pre, None,
                                                      "<|endoftext|>", None, None))


# HF's Oniguruma regex counts U+001C..U+001F as \s, llama.cpp (and the `regex` module) do not: skip those.
def _hf_comparable(s):
    return not any("\x1c" <= c <= "\x1f" for c in s)


@pytest.mark.parametrize("pre", sorted(PATTERNS))
def test_parity_with_hf_tokenizers(vocab, strings, pre):
    ref, tok = hf_tokenizer(vocab, pre), ours(vocab, pre)
    cases = [s for s in strings if _hf_comparable(s)]
    assert len(cases) > 300
    bad = [(s, tok.encode(s), ref.encode(s, add_special_tokens=False).ids) for s in cases]
    bad = [b for b in bad if b[1] != b[2]]
    assert not bad, (f"{len(bad)}/{len(cases)} differ; first: {bad[0][0]!r}\n ours {bad[0][1]}\n"
                     f" hf   {bad[0][2]}")


def test_decode_round_trip(vocab, strings):
    tok = ours(vocab, "qwen2")   # qwen2 has no clean-up passes, so decoding restores the text exactly
    bad = [s for s in strings if tok.decode(tok.encode(s)) != s]
    assert not bad, f"{len(bad)} strings do not round-trip, first {bad[0]!r}"


def test_specials_inside_text(vocab):
    tok = ours(vocab, "qwen2")
    t2i = {t: i for i, t in enumerate(vocab["tokens"])}
    got = tok.encode("x<|im_start|>user\nhi<|im_end|>\n")
    assert got[1] == t2i["<|im_start|>"] and t2i["<|im_end|>"] in got
    assert t2i["<|im_start|>"] not in tok.encode("x<|im_start|>", parse_special=False)


def test_encode_speed_30k_tokens(vocab, corpus):
    tok = ours(vocab, "qwen2")
    text = corpus.text[: 130_000]
    t0 = time.perf_counter()
    n = len(tok.encode(text))   # a cold word cache: every distinct word is merged once
    dt = time.perf_counter() - t0
    assert n > 30_000
    assert dt < 2.0, f"{n} tokens took {dt:.2f}s"

