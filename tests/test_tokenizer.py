"""strata.tokenizer on hand-made byte-level BPE vocabularies with answers worked out by hand.

The rules each case pins down are llama.cpp's (src/llama-vocab.cpp); tests/test_tokenizer_oracle.py checks
the same corners against llama.cpp itself.
"""

import pytest

from strata.tok.detok import StreamDecoder, incomplete_utf8_tail
from strata.tok.pretok import BYTE_TO_UNICODE, byte_encode, pre_tokenizer
from strata.tokenizer import Tokenizer

B = list(BYTE_TO_UNICODE)   # ids 0..255: byte b is spelled B[b]; "Ġ" is the space (byte 0x20)
EXTRA = ["ab", "bc", "abc", "Ġa", "aa", "ĠĠ", "<think>", "<|im_end|>", "<|im_start|>", "<|im",
         "<|endoftext|>"]
# <think> USER_DEFINED; <|im_end|> NORMAL (llama.cpp forces it to CONTROL); the others CONTROL
TYPES = [1] * (256 + 6) + [4, 1, 3, 3, 3]
MERGES = ["a b", "b c", "ab c", "Ġ a", "a a", "x y", "Ã ©", "Ġ Ġ"]   # "xy" and "Ã©" are merges without tokens
ID = {t: i for i, t in enumerate(B + EXTRA)}


def meta(pre="qwen2", **kw):
    m = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": B + EXTRA,
         "tokenizer.ggml.token_type": TYPES, "tokenizer.ggml.merges": MERGES}
    m.update({"tokenizer.ggml." + k: v for k, v in kw.items()})
    return m


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_metadata(meta())


def ids(*texts):
    return [ID[t] for t in texts]


@pytest.mark.parametrize("text, expect", [
    ("abc", ids("abc")),              # a b (rank 0) -> ab, then ab c (rank 2) -> abc
    ("bcab", ids("bc", "ab")),        # one word: ab (rank 0) first, then bc (rank 1); "bc ab" is no merge
    ("aaa", ids("aa", "a")),          # two equal-rank pairs: the leftmost merges
    (" abc", ids("Ġ", "abc")),        # ab (0) beats Ġa (3); then "Ġ abc" is no merge
    (" a", ids("Ġa")),
    ("xy", ids("x", "y")),            # merged to "xy", not a token: one-byte tokens x, y instead
    ("é", []),                        # merged to "Ã©", not a token: non-ASCII bytes, llama.cpp drops them
    ("ab1234", ids("ab", "1", "2", "3", "4")),   # qwen2: digits one by one
    ("", []),
])
def test_bpe_known_answers(tok, text, expect):
    assert tok.encode(text) == expect


def test_specials_split_first_longest_first(tok):
    # "<|im_start|>" (12 bytes) is cut before "<|im" (4); "<|im_end|>" was NORMAL but is forced CONTROL
    assert tok.encode("<|im_start|>ab<|im_end|><|im") == ids("<|im_start|>", "ab", "<|im_end|>", "<|im")
    assert tok.is_control(ID["<|im_end|>"])
    # without parse_special only USER_DEFINED tokens are cut out
    plain = tok.encode("<think><|im", parse_special=False)
    assert plain[0] == ID["<think>"] and ID["<|im"] not in plain
    assert plain[1:] == [ID[c] for c in "<|im"]


def test_bos_eos_defaults_and_keys():
    t = Tokenizer.from_metadata(meta())
    assert t.bos_id == 11 and t.eos_id == 11   # llama.cpp's gpt2 defaults when no id is given
    assert t.encode("ab") == ids("ab")         # qwen2: add_bos defaults to false
    t = Tokenizer.from_metadata(meta(pre="llama-bpe", bos_token_id=ID["<|im_start|>"]))
    assert t.encode("ab") == [ID["<|im_start|>"], ID["ab"]]   # llama3: add_bos defaults to true
    assert t.encode("ab", add_special=False) == [ID["ab"]]
    t = Tokenizer.from_metadata(meta(add_bos_token=True, add_eos_token=True, bos_token_id=ID["<|im_start|>"],
                                     eos_token_id=ID["<|endoftext|>"]))
    assert t.encode("ab") == [ID["<|im_start|>"], ID["ab"], ID["<|endoftext|>"]]
    with pytest.raises(ValueError, match="add_bos_token is true but"):
        Tokenizer.from_metadata({**meta(), "tokenizer.ggml.tokens": B[:10],
                                 "tokenizer.ggml.token_type": [1] * 10, "tokenizer.ggml.add_bos_token": True})


def test_eog_set(tok):
    # <|im_end|> and <|endoftext|> by text; the default eos id 11 as well
    assert tok.eog_ids == {ID["<|im_end|>"], ID["<|endoftext|>"], 11}
    # two end-of-turn texts and no eot key: llama.cpp keeps one in hash-map order, we the highest id
    assert tok.eot_id == ID["<|endoftext|>"]
    assert tok.is_eog(ID["<|endoftext|>"]) and not tok.is_eog(ID["ab"])


def test_ignore_merges_llama3():
    # "xyz" is not reachable by merges ("x y" gives no token), but with llama3's ignore_merges a whole
    # pre-token that is in the vocabulary is taken as it is
    m = meta(pre="llama-bpe")
    m["tokenizer.ggml.tokens"] = B + EXTRA + ["xyz"]
    m["tokenizer.ggml.token_type"] = TYPES + [1]
    assert Tokenizer.from_metadata(m).encode("xyz", add_special=False) == [len(B + EXTRA)]
    assert Tokenizer.from_metadata({**m, "tokenizer.ggml.pre": "qwen2"}).encode("xyz") == ids("x", "y", "z")


def test_errors_name_the_supported_values():
    with pytest.raises(ValueError, match="supported: gpt2, llama"):
        Tokenizer.from_metadata({**meta(), "tokenizer.ggml.model": "bert"})
    with pytest.raises(ValueError, match="supported: .*qwen2"):
        Tokenizer.from_metadata(meta(pre="tekken"))
    with pytest.raises(ValueError, match="duplicate token"):
        Tokenizer.from_metadata({**meta(), "tokenizer.ggml.tokens": B + EXTRA[:-1] + ["ab"]})
    with pytest.raises(ValueError, match="merges is missing"):
        Tokenizer.from_metadata({k: v for k, v in meta().items() if k != "tokenizer.ggml.merges"})


@pytest.mark.parametrize("pre, text, words", [
    ("qwen2", "Hi there  12 it's\n\n  x",
     ["Hi", " there", " ", " ", "1", "2", " it", "'s", "\n\n", " ", " x"]),
    ("llama-bpe", "1234567 IT'S", ["123", "456", "7", " IT", "'S"]),
    ("gpt-2", "IT'S 1234 ??", ["IT", "'", "S", " 1234", " ??"]),   # gpt2's contractions are lower case only
    # default: punctuation runs, then gpt2, then digit runs, then ASCII digits in threes
    ("default", "a, b!! 12345", ["a", ",", " b", "!!", " ", "123", "45"]),
    ("qwen2", "ſ's", ["ſ", "'s"]),   # the long s is a letter, and 's is a contraction, case by case
])
def test_pre_tokenizers(pre, text, words):
    assert pre_tokenizer(pre).split(text) == words


def test_byte_encode_is_gpt2_map():
    assert byte_encode(" é\n") == "ĠÃ©Ċ"
    assert len(set(B)) == 256 and B[ord("!")] == "!" and B[0] == "Ā" and B[0x20] == "Ġ"


def test_decode_and_clean_spaces():
    t = Tokenizer.from_metadata(meta(pre="gpt-2"))   # gpt2: clean_spaces on
    assert t.decode(t.encode("hello , world ?")) == "hello, world?"
    assert t.decode(t.encode("it 's a ' b ' x 'll")) == "it's a'b'x 'll"
    q = Tokenizer.from_metadata(meta())              # qwen2: off
    assert q.decode(q.encode("hello , world ?")) == "hello , world ?"
    ids_ = q.encode("<|im_start|>abc<|im_end|>")
    assert q.decode(ids_) == "<|im_start|>abc<|im_end|>"
    assert q.decode(ids_, skip_special=True) == "abc"
    assert q.decode([ID["<think>"]], skip_special=True) == "<think>"   # user-defined tokens always render


def test_incomplete_utf8():
    t = Tokenizer.from_metadata(meta())
    e = list("é".encode())   # bytes c3 a9 -> byte tokens
    assert t.decode_bytes(e[:1]) == b"\xc3"
    assert t.decode(e[:1]) == "\ufffd"
    s = StreamDecoder(t)
    assert s.feed(e[0]) == "" and s.feed(e[1]) == "é"
    assert s.feed(e[0]) == "" and s.flush() == "\ufffd"
    tails = (b"", b"a", b"\xe6", b"\xe6\x97", b"\xe6\x97\xa5", b"\xf0\x9f\xa4")
    assert [incomplete_utf8_tail(b) for b in tails] == [0, 0, 1, 2, 0, 3]


def test_piece_and_ids(tok):
    assert tok.piece(ID["Ġa"]) == b" a"
    assert tok.piece(ID["<|im_start|>"]) == b"<|im_start|>"
    assert tok.piece(ID["<|im_start|>"], special=False) == b""
    assert tok.n_vocab == 256 + len(EXTRA) and tok.token_id("abc") == ID["abc"]
    with pytest.raises(IndexError):
        tok.piece(tok.n_vocab)
