"""strata.tokenizer's SentencePiece (`llama`) model on a hand-made vocabulary with answers worked out by hand
(llama.cpp's `llm_tokenizer_spm_session`: the highest-scoring adjacent pair that is a token merges first, the
leftmost on ties; leftovers fall back to <0xXX> byte tokens)."""

import pytest

from strata.tokenizer import Tokenizer

PIECES = [("▁", -10.0), ("a", -10.0), ("b", -10.0), ("c", -10.0), ("ab", -3.0), ("bc", -1.0), ("abc", -2.0),
          ("▁a", -4.0), ("aa", -3.0), ("▁▁", -5.0), ("x▁", -0.5), ("▁x", -6.0)]
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [p for p, _ in PIECES]
ID = {t: i for i, t in enumerate(TOKENS)}


def meta(**kw):
    m = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": TOKENS,
         "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(PIECES),
         "tokenizer.ggml.scores": [0.0] * 259 + [s for _, s in PIECES]}
    m.update({"tokenizer.ggml." + k: v for k, v in kw.items()})
    return m


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_metadata(meta())


def ids(*t):
    return [ID[x] for x in t]


def byte(c):
    return [ID[f"<0x{b:02X}>"] for b in c.encode()]


@pytest.mark.parametrize("text, expect", [
    # "▁abc": bigrams ▁a -4, ab -3, bc -1 -> bc; then a+bc = abc (-2); "▁abc" is no token
    ("abc", ids("<s>", "▁", "abc")),
    # "▁aaa": aa -3 twice -> the left one (index 1) merges; "▁aa" and "aaa" are no tokens
    ("aaa", ids("<s>", "▁", "aa", "a")),
    ("é", ids("<s>", "▁") + byte("é")),                       # no piece: UTF-8 bytes as <0xXX>
    ("x y", ids("<s>", "▁", "x▁") + byte("y")),                # "▁x▁y": x▁ (-0.5) beats ▁x (-6)
    ("", ids("<s>")),                                          # BOS alone, as SentencePiece does
    ("x<s>y", ids("<s>", "▁x", "<s>", "▁") + byte("y")),      # after a special: the space prefix again
])
def test_spm_known_answers(tok, text, expect):
    assert tok.encode(text) == expect


def test_spm_flags():
    t = Tokenizer.from_metadata(meta(add_space_prefix=False, add_eos_token=True))
    assert t.encode("abc") == ids("<s>", "abc", "</s>")
    assert t.encode("abc", add_special=False) == ids("abc")
    tok = Tokenizer.from_metadata(meta())
    assert tok.encode("<s>", parse_special=False, add_special=False) == ids("▁") + byte("<s>")
    assert tok.bos_id == 1 and tok.eos_id == 2 and tok.eog_ids == {2}


def test_spm_decode(tok):
    assert tok.decode(ids("▁", "abc")) == "abc"                     # first token's leading space dropped
    assert tok.decode(ids("<s>", "▁", "abc")) == "<s> abc"          # ... unless it follows BOS (llama.cpp)
    assert tok.decode(ids("<s>", "▁", "abc"), skip_special=True) == " abc"
    assert tok.decode(ids("▁a") + byte("é") + ids("x▁")) == "aéx "
    assert tok.piece(ID["<0x41>"]) == b"A" and tok.piece(ID["▁▁"]) == b"  "


def test_spm_word_split_is_exact():
    # "x▁" spans a word boundary, so this vocabulary must take the whole-fragment path; without it the
    # per-word cache path gives the same ids
    with_x = Tokenizer.from_metadata(meta())
    assert not with_x._enc.splittable
    m = meta()
    m["tokenizer.ggml.tokens"] = TOKENS[:-2] + ["xq", "▁x"]
    plain = Tokenizer.from_metadata(m)
    assert plain._enc.splittable
    text = "  aab abc x  x abcabc ▁ b"
    whole = plain._enc._encode_word((" " + text).replace(" ", "▁"))
    assert plain.encode(text, add_special=False) == list(whole)
