"""The tokenizers the synthesiser writes into its models (placeholder until strata.synth.bpe lands)."""

from __future__ import annotations


def tokenizer_meta_for(shape) -> dict:
    toks = [f"t{i}" for i in range(shape.n_vocab)]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.token_type": [1] * shape.n_vocab, "tokenizer.ggml.merges": ["t 0"]}
