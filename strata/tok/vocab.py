"""A GGUF vocabulary as llama.cpp loads it (`llama_vocab::impl::load`, src/llama-vocab.cpp).

Reads the `tokenizer.*` keys into token texts, attributes, scores, special ids and flags, applying llama.cpp's
defaults and its by-text detection of end-of-turn and fill-in-the-middle tokens, so that the end-of-generation
set, the special tokens split out of raw text and the decoding flags are the ones llama.cpp would use.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from strata.tok.pretok import PreTokenizer, pre_tokenizer

# tokenizer.ggml.model values we implement: byte-level BPE and SentencePiece (SPM)
MODELS = ("gpt2", "llama")


class TokenType(enum.IntEnum):
    """`tokenizer.ggml.token_type` values (gguf.TokenType, llama.h `llama_token_type`)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Attr(enum.IntFlag):
    """llama.h `llama_token_attr`: what llama.cpp keeps per token after loading."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


# Attributes are kept as plain ints (IntFlag arithmetic is slow over 150k tokens).
UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = (int(a) for a in (
    Attr.UNKNOWN, Attr.UNUSED, Attr.NORMAL, Attr.CONTROL, Attr.USER_DEFINED, Attr.BYTE))
_TYPE_TO_ATTR = {
    TokenType.UNKNOWN: UNKNOWN, TokenType.UNUSED: UNUSED, TokenType.NORMAL: NORMAL,
    TokenType.CONTROL: CONTROL, TokenType.USER_DEFINED: USER_DEFINED, TokenType.BYTE: BYTE,
}

# Texts llama.cpp takes as end-of-turn (when no eot id is given) and as end-of-generation; both lists are
# llama-vocab.cpp's at the llama.cpp version of notes/tooling.md §4.3 and grow over time.
_EOT_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
}
_EOG_TEXTS = _EOT_TEXTS | {
    "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "<|eom_id|>", "[EOS]", "<eos>", "<turn|>",
    "<|tool_response>", "[e~[",
}
# Fill-in-the-middle tokens by text; pad/repo/file-separator ones also end generation.
_FIM_TEXTS = {
    "pre": {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
            "<|code_prefix|>", "<|prefix|>"},
    "suf": {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
            "<|code_suffix|>", "<|suffix|>"},
    "mid": {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
            "<|code_middle|>", "<|middle|>"},
    "pad": {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
    "rep": {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
    "sep": {"<|file_sep|>"},
}
_GPT_OSS_TEXTS = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}
_NAMED = _EOG_TEXTS | _GPT_OSS_TEXTS | {"<|eom_id|>"} | set().union(*_FIM_TEXTS.values())
_ID_KEYS = {   # our name -> GGUF key (llm_kv names); "seperator" is GGUF's own spelling
    "bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id", "eom": "eom_token_id",
    "unk": "unknown_token_id", "sep": "seperator_token_id", "pad": "padding_token_id",
    "mask": "mask_token_id", "fim_pre": "fim_pre_token_id", "fim_suf": "fim_suf_token_id",
    "fim_mid": "fim_mid_token_id", "fim_pad": "fim_pad_token_id", "fim_rep": "fim_rep_token_id",
    "fim_sep": "fim_sep_token_id",
}


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


@dataclass(frozen=True, slots=True)
class Vocab:
    model: str                       # "gpt2" | "llama"
    pre: PreTokenizer | None         # gpt2 only
    tokens: tuple[str, ...]          # id -> text (GGUF spelling: byte-level chars, or U+2581 for SPM spaces)
    attrs: tuple[int, ...]           # id -> `Attr` bits after llama.cpp's load-time fix-ups
    scores: tuple[float, ...]        # id -> float32 score (SPM merge priority; 0.0 when absent)
    token_to_id: dict                # text -> id
    ranks: dict                      # (left, right) -> merge rank (gpt2)
    special: dict                    # "bos", "eos", "eot", ... -> id or None
    eog: frozenset                   # ids that end generation (`special_eog_ids`)
    specials_by_len: tuple[int, ...] # CONTROL/USER_DEFINED/UNKNOWN ids, longest text first (st_partition)
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool

    def __post_init__(self):
        n = len(self.tokens)
        assert len(self.attrs) == n and len(self.scores) == n, "tokens, attrs and scores must align"
        assert len(self.token_to_id) == n, "token texts must be unique"
        assert not self.add_bos or self.special["bos"] is not None, "add_bos_token is true but no BOS id"
        assert not self.add_eos or self.special["eos"] is not None, "add_eos_token is true but no EOS id"

    @classmethod
    def from_metadata(cls, meta: dict) -> "Vocab":
        g = lambda k, d=None: meta.get("tokenizer.ggml." + k, d)
        model = g("model")
        if model not in MODELS:
            raise ValueError(f"unsupported tokenizer.ggml.model {model!r}; supported: {', '.join(MODELS)}")
        tokens = list(g("tokens") or [])
        if not tokens:
            raise ValueError("tokenizer.ggml.tokens is missing or empty")
        n = len(tokens)
        for i, t in enumerate(tokens):
            if not isinstance(t, str):
                raise TypeError(f"tokenizer.ggml.tokens[{i}] is {type(t).__name__}, not str")
            if t == "":
                tokens[i] = f"[EMPTY_{i}]"   # llama.cpp renames empty tokens the same way
        token_to_id = {}
        for i, t in enumerate(tokens):
            if token_to_id.setdefault(t, i) != i:
                raise ValueError(f"duplicate token in vocabulary: {t!r} has ids {token_to_id[t]} and {i}")

        types = g("token_type")
        if types is not None and len(types) < n:
            raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        attrs = [_TYPE_TO_ATTR.get(int(t), 0) for t in types[:n]] if types is not None else [NORMAL] * n
        scores = g("scores")
        if scores is not None and len(scores) < n:
            raise ValueError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
        scores = [_f32(float(scores[i])) for i in range(n)] if scores is not None else [0.0] * n

        ranks, pre = {}, None
        if model == "gpt2":
            pre = pre_tokenizer(g("pre"))
            merges = g("merges")
            if merges is None:
                raise ValueError("tokenizer.ggml.merges is missing (needed by the gpt2 model)")
            for i, m in enumerate(merges):
                pos = m.find(" ", 1)   # split at the first space after the first character, like llama.cpp
                pair = (m[:pos], m[pos + 1:]) if pos >= 0 else ("", "")
                ranks.setdefault(pair, i)
            special = dict.fromkeys(_ID_KEYS, None) | {"bos": 11, "eos": 11}
            add_bos, add_eos, add_space_prefix, clean_spaces = pre.add_bos, False, False, pre.clean_spaces
        else:   # SentencePiece defaults
            special = dict.fromkeys(_ID_KEYS, None) | {"bos": 1, "eos": 2, "unk": 0}
            add_bos, add_eos, add_space_prefix, clean_spaces = True, False, True, False
        add_space_prefix = bool(g("add_space_prefix", add_space_prefix))

        for name, key in _ID_KEYS.items():
            if special[name] is not None and special[name] >= n:
                special[name] = None   # default id out of range: disabled
            v = g(key)
            if v is not None and 0 <= int(v) < n:
                special[name] = int(v)   # an out-of-range id keeps the default (llama.cpp warns)
        add_bos = bool(g("add_bos_token", add_bos))
        add_eos = bool(g("add_eos_token", add_eos))
        if add_bos and special["bos"] is None:
            raise ValueError("tokenizer.ggml.add_bos_token is true but no bos_token_id is set")
        if add_eos and special["eos"] is None:
            raise ValueError("tokenizer.ggml.add_eos_token is true but no eos_token_id is set")

        eog = _detect_by_text(tokens, attrs, special)
        cache = [i for i in range(n) if attrs[i] & (CONTROL | USER_DEFINED | UNKNOWN)]
        # llama.cpp sorts by byte length with std::sort (unstable); ties are ordered by id here.
        cache.sort(key=lambda i: (-len(tokens[i].encode("utf-8")), i))
        return cls(model, pre, tuple(tokens), tuple(attrs), tuple(scores), token_to_id, ranks, special,
                   frozenset(eog), tuple(cache), add_bos, add_eos, add_space_prefix, clean_spaces)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _detect_by_text(tokens: list[str], attrs: list[int], special: dict) -> set[int]:
    """llama.cpp's load-time fix-ups by token text; mutates `attrs` and `special`, returns the EOG set.

    llama.cpp walks its token -> id hash map here, so where several tokens could be the eot (or a fim) token
    the one it keeps depends on libstdc++'s bucket order; we take the highest id, which is what that order
    gave for the vocabularies of tests/test_tokenizer_oracle.py (recent insertions tend to come first). Only
    these ids can differ from llama.cpp's; the EOG set and the token attributes cannot.
    """
    def control(i):
        attrs[i] |= CONTROL   # "control-looking token ... was not control-type": llama.cpp forces it

    named = [i for i, t in enumerate(tokens) if t in _NAMED]   # the few tokens any rule below looks at
    for i in reversed(named):
        t = tokens[i]
        if special["eot"] is None and t in _EOT_TEXTS:
            special["eot"] = i
            control(i)
        if special["eom"] is None and t == "<|eom_id|>":
            special["eom"] = i
            control(i)
        for k, texts in _FIM_TEXTS.items():
            if special["fim_" + k] is None and t in texts:
                special["fim_" + k] = i
                control(i)
    for i, t in enumerate(tokens):
        if attrs[i] & CONTROL and "unused" in t:
            attrs[i] |= UNUSED
    eog = {special[k] for k in ("fim_pad", "fim_rep", "fim_sep") if special[k] is not None}
    for i in named:
        if tokens[i] in _EOG_TEXTS:
            eog.add(i)
            control(i)
    for i in named:   # gpt-oss: always rendered
        if tokens[i] in _GPT_OSS_TEXTS:
            attrs[i] = USER_DEFINED
    eog |= {special[k] for k in ("eos", "eot", "eom") if special[k] is not None}
    texts = {tokens[i]: i for i in eog}
    # o200k_harmony / solar-open: "<|end|>" is not end-of-generation next to "<|return|>" and "<|call|>".
    if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                               or ({"<|calls|>", "<|flush|>"} <= texts.keys()) or
                               ({"<|call|>", "<|flush|>"} <= texts.keys())):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = USER_DEFINED
    # gemma4 / paddleocr: "</s>" is not end-of-generation next to "<|tool_response>".
    if "<|tool_response>" in texts and "</s>" in texts:
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = NORMAL
    return eog
