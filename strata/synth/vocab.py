"""The tokenizers the synthesiser writes into its models: BPE (qwen-style, ChatML) or SentencePiece (Mixtral),
trained once on the stdlib corpus and stored as package data, so every Python and machine writes the same file.

`python -m strata.synth.vocab --write` retrains them (on the recorded corpus) and rewrites strata/data/vocab-*.json.
Full-size shapes pad the trained vocabulary with UNUSED tokens up to the real model's size (151,936 for Qwen).
"""

from __future__ import annotations

import argparse
import json
import os

from strata.data import HERE as DATA_DIR
from strata.synth.bpe import tokenizer_metadata, train_bpe, train_spm
from strata.synth.corpus import RECORDED_PYTHON, stdlib_corpus

SIZES = {"bpe": 1024, "spm": 1024}
CORPUS_BYTES = 1_000_000

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + "
           "' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}")


def _path(kind: str) -> str:
    return os.path.join(DATA_DIR, f"vocab-{kind}-{SIZES[kind]}.json")


def train(kind: str) -> dict:
    text = stdlib_corpus(max_bytes=CORPUS_BYTES).text
    if kind == "bpe":
        tokens, types, merges = train_bpe(text, SIZES[kind])
        return {"tokens": tokens, "types": types, "merges": merges}
    tokens, types, scores = train_spm(text, SIZES[kind])
    return {"tokens": tokens, "types": types, "scores": scores}


def load(kind: str) -> dict:
    with open(_path(kind), encoding="utf-8") as f:
        return json.load(f)


def tokenizer_meta_for(shape) -> dict:
    """The tokenizer.* GGUF keys for a synthesised model of `shape` (vocabulary padded to shape.n_vocab)."""
    if shape.arch == "llama":
        v = load("spm")
        return tokenizer_metadata(v["tokens"], v["types"], None, "default", "<s>", "</s>", None, MISTRAL,
                                  pad_to=shape.n_vocab, scores=v["scores"])
    v = load("bpe")
    return tokenizer_metadata(v["tokens"], v["types"], v["merges"], "qwen2", None, "<|endoftext|>", "<|im_end|>",
                              CHATML, pad_to=shape.n_vocab, pad="<|endoftext|>")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.synth.vocab")
    ap.add_argument("--write", action="store_true", help="retrain and rewrite the stored vocabularies")
    a = ap.parse_args(argv)
    if not a.write:
        ap.error("nothing to do (use --write)")
    corpus = stdlib_corpus(max_bytes=CORPUS_BYTES)
    if corpus.python_version != RECORDED_PYTHON:
        print(f"warning: the stored vocabularies were trained on Python {RECORDED_PYTHON}'s stdlib; this is "
              f"{corpus.python_version}, whose sources differ, so the result will too")
    for kind in SIZES:
        with open(_path(kind), "w", encoding="utf-8") as f:
            json.dump(train(kind), f, ensure_ascii=False, separators=(",", ":"))
        print(f"wrote {_path(kind)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
