"""Regenerate the llama.cpp tokenizer oracle (golden/oracle/tokenizer/oracle.json.gz).

    python golden/oracle/tokenizer/make_oracle.py --llama-python VENV/bin/python [--retrain]

Writes one vocabulary-only GGUF per configuration in CONFIGS (tokenizer keys from strata.synth.bpe plus the
minimal `llama` hyper-parameters llama.cpp's loader requires), then runs llama.cpp (llama-cpp-python's
low-level API, in the interpreter given by --llama-python) on every case string: `llama_tokenize` with
(add_special, parse_special) = (True, True) and (False, False), `llama_detokenize` of the first result with
(remove_special, unparse_special) = (False, True) and (True, False), and the vocabulary's special ids and
end-of-generation set. tests/test_tokenizer_oracle.py compares strata.tokenizer with all of it.

The two trained vocabularies (4,096 tokens: byte-level BPE and SentencePiece) are stored next to this file
(vocab_*.json.gz) rather than retrained, since the stdlib text they come from differs between Python
versions; --retrain rebuilds them from strata.synth.corpus (only on the recorded Python).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
ORACLE = os.path.join(HERE, "oracle.json.gz")
VOCAB_FILES = {"bpe": os.path.join(HERE, "vocab_bpe.json.gz"), "spm": os.path.join(HERE, "vocab_spm.json.gz")}
VOCAB_SIZE = 4096
N_RANDOM = 150   # corpus slices
N_FUZZ = 100     # strings drawn from a mixed-script alphabet

# Tiny hand-made vocabularies for the corners: merges whose result is not a token (llama.cpp falls back to
# single-byte tokens and drops non-ASCII bytes), an unreachable token, a USER_DEFINED token, a NORMAL-typed
# "<|im_end|>" (llama.cpp forces CONTROL), overlapping specials of different lengths.
HAND_BPE_MERGES = ["a b", "b c", "ab c", "Ġ a", "a a", "x y", "Ã ©", "Ġ Ġ", "ĠĠ Ġ"]
HAND_BPE_EXTRA = ["ab", "bc", "abc", "Ġa", "aa", "ĠĠ", "ĠĠĠ", "unreachable"]
HAND_BPE_SPECIAL = [("<think>", 4), ("<|im_end|>", 1), ("<|im_start|>", 3), ("<|im", 3), ("[PAD]", 5)]
HAND_SPM_PIECES = [("▁", -10.0), ("a", -10.0), ("b", -10.0), ("c", -10.0), ("ab", -3.0), ("bc", -1.0),
                   ("abc", -2.0), ("▁a", -4.0), ("aa", -3.0), ("▁▁", -5.0), ("x▁", -0.5), ("▁x", -6.0)]

CONFIGS = [   # special tokens by text; add_bos None = key absent (llama.cpp's default for the type)
    dict(name="bpe_qwen2", vocab="bpe", pre="qwen2", bos="<|endoftext|>", eos="<|im_end|>", eot=None,
         pad="<|endoftext|>", add_bos=False, pad_to=None),
    dict(name="bpe_qwen2_151936", vocab="bpe", pre="qwen2", bos="<|endoftext|>", eos="<|im_end|>", eot=None,
         pad="<|endoftext|>", add_bos=False, pad_to=151936),
    dict(name="bpe_llama3", vocab="bpe", pre="llama-bpe", bos="<|endoftext|>", eos="<|im_end|>", eot=None,
         pad=None, add_bos=None, pad_to=None),
    dict(name="bpe_default", vocab="bpe", pre="default", bos="<|im_start|>", eos="<|endoftext|>", eot=None,
         pad=None, add_bos=True, pad_to=None),
    dict(name="bpe_gpt2", vocab="bpe", pre="gpt-2", bos=None, eos="<|endoftext|>", eot="<|im_end|>",
         pad=None, add_bos=False, pad_to=None),
    dict(name="bpe_olmo", vocab="bpe", pre="olmo", bos=None, eos="<|endoftext|>", eot=None, pad=None,
         add_bos=False, pad_to=None),
    dict(name="bpe_hand", vocab="bpe_hand", pre="qwen2", bos="<|im_start|>", eos="<|im_end|>", eot=None,
         pad=None, add_bos=True, pad_to=None, slices=False),
    dict(name="spm", vocab="spm", pre=None, bos="<s>", eos="</s>", eot=None, pad=None, add_bos=None,
         pad_to=None),
    dict(name="spm_32000", vocab="spm", pre=None, bos="<s>", eos="</s>", eot=None, pad=None, add_bos=None,
         pad_to=32000),
    dict(name="spm_hand", vocab="spm_hand", pre=None, bos="<s>", eos="</s>", eot=None, pad=None, add_bos=None,
         pad_to=None, slices=False),
    dict(name="spm_hand_noprefix", vocab="spm_hand", pre=None, bos="<s>", eos="</s>", eot=None, pad=None,
         add_bos=True, add_eos=True, add_space_prefix=False, pad_to=None, slices=False),
]

HAND_CASES = [
    "", " ", "  ", "\n", "\n\n\n", " \n ", "\t\tx", "\r\n", "hello world", "Hello World!!", "abc", "bcab",
    "aaa",    " abc", "  abc", "   abc", "xy", "é", "café", "naïve café — 日本語 テキスト 🤖", "12345678901234567890",
    "3.14159 + 2,718", "don't won't I'm you're they've we'll she'd IT'S", "'''quoted'''", "ſ 's 'S 'ſ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "a<|endoftext|>b<|im_end|>c", "<|im", "<|im_",
    "<think>x</think>", "<s>hi</s>", "x<s>y", "<unk>", "<0x41>", "[PAD]", "   leading and trailing   ",
    "tabs\tand\nnew\r\nlines\r\n", "emoji 👍🏽 family 👨‍👩‍👧 flags 🇫🇷", "中文分词测试，标点！",
    "Ελληνικά кириллица עברית العربية",
    "x" * 300, " " * 50 + "x", "def f(x):\n    return x ** 2\n", "$$$ ^^^ ||| ~~~ +++ <<< >>> === ```",
    "a\u00a0b\u3000c\u2028d\u0085e", "ＡＢＣ１２３", "ǅungla Ⅻ ½ ²", "e\u0301 combining", "\u200bzero width",
    "hello , world . ok ? yes ! it 's I 'm we 're they 've don 't she 'd we 'll ' quoted ' end",
    "a ' b ' c", " 's", "x ,", "\x1c\x1d\x1e\x1f", "x\x00y", "▁already▁escaped", "  \t \n  \t x",
]
_FUZZ_ALPHABET = (list("abcxyz ABC  \n\t\r0123456789'.,!?;:-_()[]{}<>|$+=^~`\"#%&*/\\@") +
                  ["é", "ß", "日本", "語", "🤖", "👍🏽", "\u00a0", "\u3000", "ſ", "İ", "Ⅻ", "½", "\u0301",
                   "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "'s", "'LL", "  ", "\n\n", "123456"])


def cases(corpus_text: str) -> list[str]:
    rng = random.Random(1234)
    out = list(HAND_CASES)
    for _ in range(N_RANDOM):
        a = rng.randrange(len(corpus_text) - 300)
        out.append(corpus_text[a:a + rng.randrange(1, 300)])
    for _ in range(N_FUZZ):
        out.append("".join(rng.choice(_FUZZ_ALPHABET) for _ in range(rng.randrange(1, 40))))
    return out


def case_indices(cfg: dict) -> list[int]:
    """Which of `cases()` a configuration is run on: all, or (slices=False) the hand and fuzz strings only."""
    n_hand = len(HAND_CASES)
    idx = range(n_hand + N_RANDOM + N_FUZZ)
    return [i for i in idx if cfg.get("slices", True) or not n_hand <= i < n_hand + N_RANDOM]


def pack(results: dict, strings: list[str]) -> dict:
    """Shrink the stored results: a list equal to an earlier configuration's becomes {"same_as": name}; a
    detokenized text is stored as None when it equals its input, as text when it is valid UTF-8, else as
    {"hex": ...}."""
    out = {}
    for name, r in results.items():
        r = dict(r)
        for key in ("detok", "detok_skip"):
            texts = []
            for i, h in zip(r["cases"], r[key]):
                b = bytes.fromhex(h)
                try:
                    t = b.decode("utf-8")
                    texts.append(None if t == strings[i] else t)
                except UnicodeDecodeError:
                    texts.append({"hex": h})
            r[key] = texts
        for key in ("ids", "ids_plain", "detok", "detok_skip"):
            for prev, pr in out.items():
                if pr["cases"] == r["cases"] and pr[key] == r[key]:
                    r[key] = {"same_as": prev}
                    break
        out[name] = r
    return out


def unpack(results: dict, strings: list[str], name: str, key: str) -> list:
    """Inverse of `pack` for one field: ids lists, or detokenized bytes."""
    v = results[name][key]
    while isinstance(v, dict):
        v = results[v["same_as"]][key]
    if key.startswith("detok"):
        idx = results[name]["cases"]
        return [strings[i].encode() if t is None else bytes.fromhex(t["hex"]) if isinstance(t, dict)
                else t.encode() for i, t in zip(idx, v)]
    return v


def hand_vocabs() -> dict:
    from strata.tok.pretok import BYTE_TO_UNICODE

    toks = list(BYTE_TO_UNICODE) + HAND_BPE_EXTRA + [t for t, _ in HAND_BPE_SPECIAL]
    types = [1] * (256 + len(HAND_BPE_EXTRA)) + [ty for _, ty in HAND_BPE_SPECIAL]
    spm = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [p for p, _ in HAND_SPM_PIECES]
    return {
        "bpe_hand": dict(tokens=toks, types=types, merges=list(HAND_BPE_MERGES)),
        "spm_hand": dict(tokens=spm, types=[2, 3, 3] + [6] * 256 + [1] * len(HAND_SPM_PIECES),
                         scores=[0.0] * 259 + [s for _, s in HAND_SPM_PIECES]),
    }


def load_vocabs() -> dict:
    vocabs = {k: json.load(gzip.open(p, "rt", encoding="utf-8")) for k, p in VOCAB_FILES.items()}
    return vocabs | hand_vocabs()


def build_meta(cfg: dict, vocabs: dict) -> dict:
    """The tokenizer keys of configuration `cfg` (shared with tests/test_tokenizer_oracle.py)."""
    from strata.synth.bpe import tokenizer_metadata

    v = vocabs[cfg["vocab"]]
    spm = "scores" in v
    meta = tokenizer_metadata(v["tokens"], v["types"], None if spm else v["merges"], cfg["pre"], cfg["bos"],
                              cfg["eos"], cfg["eot"], None, cfg["pad_to"], scores=v.get("scores"),
                              pad=cfg["pad"], add_bos=cfg["add_bos"])
    if cfg["add_bos"] is None:
        del meta["tokenizer.ggml.add_bos_token"]
    if "add_eos" in cfg:
        meta["tokenizer.ggml.add_eos_token"] = cfg["add_eos"]
    if "add_space_prefix" in cfg:
        meta["tokenizer.ggml.add_space_prefix"] = cfg["add_space_prefix"]
    return meta


def write_gguf(path: str, meta: dict) -> None:
    import gguf

    from strata.synth.bpe import write_tokenizer_metadata

    w = gguf.GGUFWriter(path, "llama")
    # what llama.cpp's `llm_load_hparams` needs before it reads the vocabulary (vocab_only loads no tensors)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_rope_dimension_count(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(meta["tokenizer.ggml.tokens"]))
    write_tokenizer_metadata(w, meta)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def worker(job_path: str) -> None:
    """Runs inside the llama-cpp-python interpreter; imports nothing from strata."""
    import ctypes

    import llama_cpp as L

    job = json.load(open(job_path, encoding="utf-8"))
    L.llama_backend_init()
    results = {}
    for name, path in job["ggufs"].items():
        p = L.llama_model_default_params()
        p.vocab_only = True
        model = L.llama_model_load_from_file(path.encode(), p)
        assert model, f"llama.cpp could not load {path}"
        vocab = L.llama_model_get_vocab(model)
        n_vocab = L.llama_vocab_n_tokens(vocab)

        def tokenize(s: bytes, add_special: bool, parse_special: bool) -> list[int]:
            cap = len(s) + 16
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(vocab, s, len(s), buf, cap, add_special, parse_special)
            assert n >= 0, n
            return list(buf[:n])

        def detok(ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
            arr = (L.llama_token * max(1, len(ids)))(*ids)
            cap = 64 + 64 * len(ids)
            out = ctypes.create_string_buffer(cap)
            n = L.llama_detokenize(vocab, arr, len(ids), out, cap, remove_special, unparse_special)
            assert n >= 0, n
            return out.raw[:n]

        r = {"n_vocab": n_vocab, "bos": L.llama_vocab_bos(vocab), "eos": L.llama_vocab_eos(vocab),
             "eot": L.llama_vocab_eot(vocab), "add_bos": bool(L.llama_vocab_get_add_bos(vocab)),
             "add_eos": bool(L.llama_vocab_get_add_eos(vocab)),
             "eog": [i for i in range(n_vocab) if L.llama_vocab_is_eog(vocab, i)],
             "ids": [], "ids_plain": [], "detok": [], "detok_skip": []}
        r["cases"] = job["indices"][name]
        for i in r["cases"]:
            b = job["cases"][i].encode("utf-8")
            ids = tokenize(b, True, True)
            r["ids"].append(ids)
            r["ids_plain"].append(tokenize(b, False, False))
            r["detok"].append(detok(ids, False, True).hex())
            r["detok_skip"].append(detok(ids, True, False).hex())
        results[name] = r
        L.llama_model_free(model)
    json.dump({"llama_cpp_python": L.__version__, "results": results}, open(job["out"], "w"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", required=True, help="VENV/bin/python of tools/build_llama_cpp.sh")
    ap.add_argument("--retrain", action="store_true", help="retrain the stored 4k vocabularies first")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    sys.path.insert(0, ROOT)
    from strata.synth.bpe import train_bpe, train_spm
    from strata.synth.corpus import stdlib_corpus

    corpus = stdlib_corpus()
    if a.retrain or not all(os.path.exists(p) for p in VOCAB_FILES.values()):
        if not corpus.recorded:
            sys.exit("the stdlib corpus differs from the recorded one; use the stored vocabularies")
        t, ty, m = train_bpe(corpus.text, VOCAB_SIZE)
        st, sty, ss = train_spm(corpus.text, VOCAB_SIZE)
        params = {"corpus_python": corpus.python_version, "corpus_sha256": corpus.sha256,
                  "corpus_files": len(corpus.files), "vocab_size": VOCAB_SIZE}
        for key, body in (("bpe", dict(tokens=t, types=ty, merges=m, trainer="train_bpe(pre='qwen2')")),
                          ("spm", dict(tokens=st, types=sty, scores=ss, trainer="train_spm"))):
            with gzip.GzipFile(VOCAB_FILES[key], "wb", mtime=0) as f:
                f.write(json.dumps(params | body, ensure_ascii=False).encode("utf-8"))
    vocabs = load_vocabs()
    strings = cases(corpus.text)
    with tempfile.TemporaryDirectory() as tmp:
        ggufs = {}
        for cfg in CONFIGS:
            ggufs[cfg["name"]] = os.path.join(tmp, cfg["name"] + ".gguf")
            write_gguf(ggufs[cfg["name"]], build_meta(cfg, vocabs))
        job = os.path.join(tmp, "job.json")
        indices = {cfg["name"]: case_indices(cfg) for cfg in CONFIGS}
        json.dump({"ggufs": ggufs, "cases": strings, "indices": indices, "out": os.path.join(tmp, "out.json")},
                  open(job, "w"))
        subprocess.run([a.llama_python, os.path.abspath(__file__), "--worker", job], check=True)
        got = json.load(open(os.path.join(tmp, "out.json")))
    doc = {"generator": "golden/oracle/tokenizer/make_oracle.py", "llama_cpp_python": got["llama_cpp_python"],
           "corpus_python": corpus.python_version, "configs": CONFIGS, "cases": strings,
           "results": pack(got["results"], strings)}
    with gzip.GzipFile(ORACLE, "wb", mtime=0) as f:
        f.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    print(f"wrote {ORACLE}: {len(CONFIGS)} configurations x {len(strings)} strings")


if __name__ == "__main__":
    main()
