"""Pre-tokenisers of llama.cpp's byte-level BPE, and GPT-2's byte-to-unicode map.

llama.cpp (`llm_tokenizer_bpe` in src/llama-vocab.cpp) keeps, per pre-tokeniser type, an ordered list of
regexes; `unicode_regex_split` (src/unicode.cpp) applies them one after the other, each one splitting every
piece left by the previous ones into its matches and the unmatched gaps between them ("isolated" splitting).
The gpt2 and llama3 patterns run through hand-written scanners (`unicode_regex_split_custom_gpt2/_llama3`),
the others through std::regex on a text where each non-ASCII code point is collapsed to one byte standing for
its Unicode category. Both amount to the ordinary regex below, given that llama.cpp's `\\s` is Unicode's
White_Space set, which is also what the `regex` module's `\\s` matches (checked: U+001C..U+001F are not
White_Space; U+0085, U+00A0, U+3000 are). llama.cpp's category tables and the `regex` module's may be from
different Unicode versions; code points assigned in between are classified differently (none in our tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import regex

# Contractions spelled case by case as llama.cpp rewrites them: `(?i:'s)` would also match U+017F (long s),
# which llama.cpp's scanner (`unicode_tolower` + ASCII compare) does not.
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

# GPT-2's pattern; llama.cpp's string lacks the final `|\s+`, but its scanner emits a lone whitespace run
# there (`// regex: \s+`), so the alternation below is what it computes.
GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# llama 3's tokenizer.json pattern (LLAMA_VOCAB_PRE_TYPE_LLAMA3): digits in groups of up to three.
LLAMA3_RE = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's (LLAMA_VOCAB_PRE_TYPE_QWEN2): as llama 3 but every digit alone.
QWEN2_RE = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# LLAMA_VOCAB_PRE_TYPE_DEFAULT: four passes, punctuation runs first, then GPT-2, then digit runs, then ASCII
# digits in threes. (Not GPT-2's single regex, whatever the name suggests.)
DEFAULT_RES = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    """One llama.cpp pre-tokeniser type and the vocabulary flags `llama_vocab::impl::load` ties to it."""

    name: str                     # llama.cpp's LLAMA_VOCAB_PRE_TYPE_* name, lower case
    patterns: tuple[str, ...]     # applied in order, each one splitting the pieces of the previous one
    ignore_merges: bool = False   # a pre-token that is a whole vocabulary entry skips the merges (llama3)
    clean_spaces: bool = True     # detokenize's clean-up passes (" ." -> "."), llama.cpp's default for BPE
    add_bos: bool = False         # default of add_bos_token when the GGUF does not say
    compiled: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        assert self.patterns, f"pre-tokeniser {self.name!r} needs at least one pattern"
        object.__setattr__(self, "compiled", tuple(regex.compile(p) for p in self.patterns))

    def split(self, text: str) -> list[str]:
        """The pre-tokens ("words") of one text fragment, in order; their concatenation is `text`."""
        pieces = [text] if text else []
        for pat in self.compiled:
            out = []
            for piece in pieces:
                pos = 0
                for m in pat.finditer(piece):
                    s, e = m.span()
                    if s > pos:
                        out.append(piece[pos:s])   # gap between matches stays one piece
                    if e > s:
                        out.append(piece[s:e])
                    pos = e
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces


_TYPES = {
    "default": PreTokenizer("default", DEFAULT_RES),
    "gpt2": PreTokenizer("gpt2", (GPT2_RE,)),
    "llama3": PreTokenizer("llama3", (LLAMA3_RE,), ignore_merges=True, add_bos=True),
    "qwen2": PreTokenizer("qwen2", (QWEN2_RE,), clean_spaces=False),
    "stablelm2": PreTokenizer("stablelm2", (QWEN2_RE,)),
}

# `tokenizer.ggml.pre` value -> type, as the if-chain in `llama_vocab::impl::load` maps them. Only values
# whose type and flags we reproduce are listed; anything else is refused (no silent fallback).
PRE_ALIASES = {
    "default": "default",
    "gpt-2": "gpt2", "phi-2": "gpt2", "mpt": "gpt2", "olmo": "gpt2",  # GPT2, MPT, OLMO share one regex
    "llama3": "llama3", "llama-v3": "llama3", "llama-bpe": "llama3", "falcon3": "llama3",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2",
    "stablelm2": "stablelm2",
}


def pre_tokenizer(pre: str | None) -> PreTokenizer:
    """The pre-tokeniser for a `tokenizer.ggml.pre` value; missing or empty means 'default' (as llama.cpp)."""
    key = pre or "default"
    if key not in PRE_ALIASES:
        raise ValueError(
            f"unsupported tokenizer.ggml.pre {pre!r}; supported: {', '.join(sorted(PRE_ALIASES))}"
        )
    return _TYPES[PRE_ALIASES[key]]


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable code point map (`unicode_byte_to_utf8_map` in unicode.cpp): printable
    Latin-1 bytes map to themselves, the 68 others to U+0100.. in byte order."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, n = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return out


BYTE_TO_UNICODE: tuple[str, ...] = tuple(_bytes_to_unicode())
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_UNICODE)}   # str.translate table over latin-1 text


def byte_encode(word: str) -> str:
    """A pre-token's UTF-8 bytes, each spelled as its byte-level character (unicode.cpp
    `unicode_byte_encoding_process`)."""
    return word.encode("utf-8").decode("latin-1").translate(_ENCODE_TABLE)
