"""Parts of strata.tokenizer (the entry point): pre-tokenisers, the GGUF vocabulary as llama.cpp loads it,
the BPE and SentencePiece encoders, and detokenization."""
