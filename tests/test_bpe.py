"""strata.synth.bpe / corpus: deterministic trainers, vocabulary layout, and the GGUF tokenizer keys."""

import gzip
import json
import os
import time

import gguf
import numpy as np
import pytest

from strata.synth.bpe import (KEY_TYPES, preset_tokenizer_metadata, tokenizer_metadata, train_bpe, train_spm,
                              write_tokenizer_metadata)
from strata.synth.corpus import STDLIB_FILES, stdlib_corpus
from strata.tok.pretok import BYTE_TO_UNICODE
from strata.tokenizer import Tokenizer

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden", "oracle", "tokenizer")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def small():
    return stdlib_corpus(max_bytes=400_000).text


@pytest.fixture(scope="module")
def bpe(small):
    return train_bpe(small, 800, SPECIALS)


def test_bpe_layout(bpe):
    tokens, types, merges = bpe
    assert len(tokens) == len(types) == 800 and len(set(tokens)) == 800
    assert tokens[:256] == list(BYTE_TO_UNICODE) and tokens[-3:] == SPECIALS
    assert types == [1] * 797 + [3] * 3
    index = {t: i for i, t in enumerate(tokens)}
    for rank, m in enumerate(merges):   # both halves exist before their merge's result, which is a token
        left, right = m.split(" ")
        assert index[left + right] >= 256 and max(index[left], index[right]) < 797, (rank, m)


def test_bpe_deterministic(small, bpe):
    assert train_bpe(small, 800, SPECIALS) == bpe


def test_bpe_tokenizer_round_trip(small, bpe):
    tokens, types, merges = bpe
    tok = Tokenizer.from_metadata(tokenizer_metadata(tokens, types, merges, "qwen2", "<|endoftext|>",
                                                     "<|im_end|>", None, None))
    text = small[5000:15000]
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) < len(text.encode()) / 2   # it does compress


def test_spm_layout_and_round_trip(small):
    tokens, types, scores = train_spm(small, 1000)
    assert len(tokens) == len(types) == len(scores) == 1000 and len(set(tokens)) == 1000
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and tokens[3] == "<0x00>" and tokens[258] == "<0xFF>"
    assert types[:3] == [2, 3, 3] and set(types[3:259]) == {6} and set(types[259:]) == {1}
    assert scores[259:] == sorted(scores[259:], reverse=True)   # pieces in merge order, then characters
    meta = tokenizer_metadata(tokens, types, None, "default", "<s>", "</s>", None, None, scores=scores)
    tok = Tokenizer.from_metadata(meta)
    assert tok._enc.splittable   # no piece has U+2581 after another character
    text = small[7000:12000]
    ids = tok.encode(text, add_special=False)
    assert tok.decode(ids) == text and len(ids) < len(text) / 2


def test_metadata_keys_and_padding(bpe):
    tokens, types, merges = bpe
    meta = tokenizer_metadata(tokens, types, merges, "qwen2", "<|endoftext|>", "<|im_end|>", None,
                              "{{ x }}", pad_to=151_936, pad="<|endoftext|>")
    assert set(meta) <= set(KEY_TYPES)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "qwen2"
    assert len(meta["tokenizer.ggml.tokens"]) == 151_936
    assert meta["tokenizer.ggml.tokens"][-1] == "[PAD151935]"
    assert meta["tokenizer.ggml.token_type"][800:] == [5] * (151_936 - 800)
    assert meta["tokenizer.ggml.bos_token_id"] == 797 and meta["tokenizer.ggml.eos_token_id"] == 799
    assert meta["tokenizer.ggml.add_bos_token"] is False and meta["tokenizer.chat_template"] == "{{ x }}"
    small_tok = Tokenizer.from_metadata(tokenizer_metadata(tokens, types, merges, "qwen2", None, "<|im_end|>",
                                                           None, None))
    big_tok = Tokenizer.from_metadata(meta)
    s = "def f(x):\n    return x  # <|im_end|> [PAD151935]"
    assert big_tok.encode(s) == small_tok.encode(s) and big_tok.n_vocab == 151_936
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tokenizer_metadata(tokens, types, merges, "qwen2", "<nope>", None, None, None)
    with pytest.raises(ValueError, match="unsupported tokenizer.ggml.pre"):
        tokenizer_metadata(tokens, types, merges, "qwen9", None, None, None, None)


def test_gguf_round_trip(tmp_path, bpe):
    tokens, types, merges = bpe
    meta = tokenizer_metadata(tokens, types, merges, "llama-bpe", "<|im_start|>", "<|im_end|>", "<|im_end|>",
                              "{{ bos_token }}", pad="<|endoftext|>")
    spm_tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["a", "▁a"]
    spm_meta = tokenizer_metadata(spm_tokens, [2, 3, 3] + [6] * 256 + [1, 1], None, "default", "<s>", "</s>",
                                  None, None, scores=[0.0] * 259 + [-1.0, -2.0])
    for m in (meta, spm_meta):
        path = str(tmp_path / "t.gguf")
        w = gguf.GGUFWriter(path, "llama")
        write_tokenizer_metadata(w, m)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        r = gguf.GGUFReader(path)
        back = {k: r.fields[k].contents() for k in m}
        assert back == m
        expect = {"str": gguf.GGUFValueType.STRING, "u32": gguf.GGUFValueType.UINT32,
                  "bool": gguf.GGUFValueType.BOOL}
        for k in m:
            f = r.fields[k]
            kind = KEY_TYPES[k]
            if kind.endswith("[]"):
                assert f.types[0] == gguf.GGUFValueType.ARRAY
                sub = {"str[]": gguf.GGUFValueType.STRING, "i32[]": gguf.GGUFValueType.INT32,
                       "f32[]": gguf.GGUFValueType.FLOAT32}[kind]
                assert f.types[1] == sub, k
            else:
                assert f.types[0] == expect[kind], k
        assert Tokenizer.from_metadata(back).encode("ab c") == Tokenizer.from_metadata(m).encode("ab c")


def test_stored_vocabularies_are_reproducible():
    """The 4k vocabularies under golden/ retrain bit for bit from the recorded corpus (on its Python)."""
    corpus = stdlib_corpus()
    if not corpus.recorded:
        pytest.skip(f"stdlib sources of Python {corpus.python_version} differ from the recorded corpus")
    assert corpus.files == STDLIB_FILES and len(corpus.text.encode()) > 2_000_000
    stored = {k: json.load(gzip.open(os.path.join(GOLDEN, f"vocab_{k}.json.gz"), "rt"))
              for k in ("bpe", "spm")}
    t0 = time.perf_counter()
    tokens, types, merges = train_bpe(corpus.text, 4096)
    t_bpe = time.perf_counter() - t0
    b = stored["bpe"]
    assert (tokens, types, merges) == (b["tokens"], b["types"], b["merges"])
    tokens, types, scores = train_spm(corpus.text, 4096)
    assert (tokens, types) == (stored["spm"]["tokens"], stored["spm"]["types"])
    assert np.array_equal(np.float32(scores), np.float32(stored["spm"]["scores"]))
    assert t_bpe < 60, f"4k BPE on 3 MB took {t_bpe:.1f}s"


def test_presets(small):
    from strata.chat import render

    q = preset_tokenizer_metadata("qwen", small, 600, pad_to=1000)
    tok = Tokenizer.from_metadata(q)
    prompt = render(tok.chat_template, [{"role": "user", "content": "hi"}])
    ids = tok.encode(prompt)
    assert ids[0] == tok.token_id("<|im_start|>") and ids[-1] == tok.token_id("\u010a")   # "\n" byte token
    assert tok.is_eog(tok.token_id("<|im_end|>")) and tok.bos_id == tok.token_id("<|endoftext|>")
    assert tok.n_vocab == 1000 and tok.encode("x", add_special=True) == tok.encode("x", add_special=False)
    m = preset_tokenizer_metadata("mixtral", small, 800)
    tok = Tokenizer.from_metadata(m)
    text = render(tok.chat_template, [{"role": "user", "content": "hi"}], bos_token="<s>", eos_token="</s>")
    assert text == "<s>[INST] hi [/INST]"
    ids = tok.encode(text)   # llama.cpp adds BOS, and the template wrote one: two, as it warns
    assert ids[:2] == [tok.bos_id, tok.bos_id]
    with pytest.raises(ValueError, match="supported: qwen, mixtral"):
        preset_tokenizer_metadata("gemma", small)
