"""The tokenizer of a GGUF file: llama.cpp's token ids (`llama_tokenize`) and text (`llama_detokenize`).

Built from the `tokenizer.*` metadata alone. Models: `gpt2` (byte-level BPE; pre-tokenisers in
`strata.tok.pretok.PRE_ALIASES`: qwen2, llama-bpe/llama3, default, gpt-2/olmo/mpt/phi-2, stablelm2, ...) and
`llama` (SentencePiece with byte fallback, as Mixtral's GGUFs). Encoding follows
`llama_vocab::impl::tokenize`:
1. special tokens are cut out of the raw text first (`tokenizer_st_partition`): every CONTROL, USER_DEFINED
   and UNKNOWN token, longest text first, each splitting every remaining raw fragment at all its occurrences
   (with parse_special=False only USER_DEFINED ones);
2. each raw fragment is encoded on its own: BPE after pre-tokenising, or SPM after escaping spaces to U+2581
   (with a leading space when add_space_prefix and the fragment is first or follows a special token);
3. BOS is prepended and EOS appended when add_special and the vocabulary's add_bos/add_eos say so.
Not reproduced: per-model LSTRIP/RSTRIP token attributes llama.cpp sets by model name (phi-3, jina, ...).
"""

from __future__ import annotations

from strata.tok.bpe import BpeEncoder
from strata.tok.detok import StreamDecoder, detokenize, pieces, token_piece
from strata.tok.pretok import PRE_ALIASES
from strata.tok.spm import SPACE, SpmEncoder
from strata.tok.vocab import CONTROL, UNKNOWN, TokenType, Vocab

__all__ = ["Tokenizer", "StreamDecoder", "TokenType", "PRE_ALIASES"]


class Tokenizer:
    def __init__(self, vocab: Vocab, chat_template: str | None = None):
        self.vocab = vocab
        self.chat_template = chat_template   # tokenizer.chat_template (jinja2 source), None when absent
        self._enc = BpeEncoder(vocab) if vocab.model == "gpt2" else SpmEncoder(vocab)
        self._pieces = pieces(vocab)

    @classmethod
    def from_metadata(cls, meta: dict[str, object]) -> "Tokenizer":
        """`meta` maps GGUF keys (`tokenizer.ggml.*`, `tokenizer.chat_template`) to their values."""
        return cls(Vocab.from_metadata(meta), meta.get("tokenizer.chat_template"))

    # --- ids ---------------------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special["eot"]

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog

    def is_eog(self, tid: int) -> bool:
        """End of generation: EOS, EOT, EOM and the end-of-turn texts llama.cpp collects
        (`llama_vocab_is_eog`)."""
        return tid in self.vocab.eog

    def is_control(self, tid: int) -> bool:
        return bool(self.vocab.attrs[tid] & CONTROL)

    def token_id(self, text: str) -> int | None:
        """Id of the token spelled exactly `text` in the vocabulary, if any."""
        return self.vocab.token_to_id.get(text)

    # --- encode ------------------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        v = self.vocab
        frags = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and v.add_bos:
            out.append(v.special["bos"])
        prev_special = True   # SPM: the first raw fragment gets the space prefix as if after a special
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                prev_special = True
            elif v.model == "llama":
                s = " " + f if v.add_space_prefix and prev_special else f
                self._enc.encode(s.replace(" ", SPACE), out)
                prev_special = False
            else:
                self._enc.encode(f, out)
        if add_special and v.add_eos:
            out.append(v.special["eos"])
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """Raw text fragments (str) and special token ids (int) in order (`tokenizer_st_partition`)."""
        v = self.vocab
        frags: list = [text]
        for tid in v.specials_by_len:
            if not parse_special and v.attrs[tid] & (CONTROL | UNKNOWN):
                continue   # user-defined tokens are split out even without parse_special
            needle = v.tokens[tid]
            if not any(isinstance(f, str) and needle in f for f in frags):
                continue
            new = []
            for f in frags:
                if isinstance(f, int) or needle not in f:
                    new.append(f)
                    continue
                parts = f.split(needle)
                for k, p in enumerate(parts):
                    if k:
                        new.append(tid)
                    if p:
                        new.append(p)
            frags = new
        return frags

    # --- decode ------------------------------------------------------------------------------------------
    def piece(self, tid: int, special: bool = True) -> bytes:
        """The bytes token `tid` stands for (`llama_token_to_piece`, lstrip 0); CONTROL/UNKNOWN tokens give
        b"" unless `special`."""
        return token_piece(self.vocab, self._pieces, tid, special)

    def decode_bytes(self, ids: list[int], remove_special: bool = False, unparse_special: bool = True
                     ) -> bytes:
        """`llama_detokenize(ids, remove_special, unparse_special)`, exactly (bytes, maybe invalid UTF-8)."""
        return detokenize(self.vocab, self._pieces, ids, remove_special, unparse_special)

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """Text of `ids`; with skip_special, a leading BOS / trailing EOS is removed (when the vocabulary adds
        them) and CONTROL tokens render as nothing. Bytes that are not valid UTF-8 (a character cut at the
        end) become U+FFFD; use `decode_bytes` or `StreamDecoder` to keep them."""
        b = self.decode_bytes(ids, remove_special=skip_special, unparse_special=not skip_special)
        return b.decode("utf-8", errors="replace")

    def stream(self, special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, special)
