"""Our deterministic vocabulary trainers and the GGUF tokenizer keys of a made-up model.

`train_bpe`: byte-level BPE (GPT-2/Qwen style) over pre-tokens of the chosen llama.cpp pre-tokeniser.
`train_spm`: a SentencePiece-style vocabulary for the `llama` tokenizer model (Mixtral): `<unk> <s> </s>`,
the 256 byte-fallback tokens, then pieces learnt by the same BPE merge loop over U+2581-escaped words
(score = minus the merge index, so llama.cpp's score-driven merging replays them in order), then single
characters.
Both merge loops take the most frequent adjacent pair, ties broken by the smaller (left id, right id), so the
result depends only on the text. `tokenizer_metadata` returns the `tokenizer.*` keys as llama.cpp reads them,
and `write_tokenizer_metadata` writes them with the GGUF value types llama.cpp's loader insists on.
"""

from __future__ import annotations

import heapq
from collections import Counter

import regex

from strata.tok.pretok import BYTE_TO_UNICODE, byte_encode, pre_tokenizer
from strata.tok.vocab import TokenType

SPACE = "\u2581"
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SPM_SPECIALS = ("<unk>", "<s>", "</s>")
# SentencePiece-style words (split_by_whitespace, _by_unicode_script, _by_number): U+2581? then a run of
# letters, of digits or of other characters; a run of U+2581 before such a word stays apart.
_SPM_WORDS = regex.compile(
    f"{SPACE}+(?={SPACE}[^{SPACE}\\s])"
    f"|{SPACE}?(?:\\p{{L}}+|\\p{{N}}+|[^\\p{{L}}\\p{{N}}{SPACE}\\s]+)"
    f"|{SPACE}+"
)


def learn_merges(words: Counter, symbols: list[str], n_new: int, forbidden: frozenset = frozenset(),
                 min_count: int = 2) -> tuple[list[tuple[str, str]], list[str]]:
    """BPE merge loop. `words` maps tuples of symbol ids (indices into `symbols`) to counts. Returns the
    merges in order and the `n_new` (or fewer) new symbol strings in order of creation. A merge whose result
    already exists reuses that symbol (its merge is still listed); one whose result is in `forbidden` is
    never made."""
    sym = list(symbols)
    sid = {s: i for i, s in enumerate(sym)}
    wsyms = [list(w) for w in words]
    wcnt = list(words.values())
    count: dict[tuple[int, int], int] = Counter()
    where: dict[tuple[int, int], set[int]] = {}
    for w, (s, c) in enumerate(zip(wsyms, wcnt)):
        for p in zip(s, s[1:]):
            count[p] += c
            where.setdefault(p, set()).add(w)
    heap = [(-c, a, b) for (a, b), c in count.items()]
    heapq.heapify(heap)
    merges, new = [], []
    while heap and len(new) < n_new:
        c, a, b = heapq.heappop(heap)
        cur = count.get((a, b), 0)
        if -c != cur:
            if cur > 0:
                heapq.heappush(heap, (-cur, a, b))   # stale entry: requeue at its current count
            continue
        if cur < min_count:
            break
        text = sym[a] + sym[b]
        if text in forbidden:
            count[(a, b)] = 0
            continue
        if text not in sid:
            sid[text] = len(sym)
            sym.append(text)
            new.append(text)
        m = sid[text]
        merges.append((sym[a], sym[b]))
        touched = set()
        for w in sorted(where.pop((a, b), ())):
            old, cw = wsyms[w], wcnt[w]
            out, i = [], 0
            while i < len(old):
                if i + 1 < len(old) and old[i] == a and old[i + 1] == b:
                    out.append(m)
                    i += 2
                else:
                    out.append(old[i])
                    i += 1
            for p in zip(old, old[1:]):
                count[p] -= cw
                touched.add(p)
                if p in where:
                    where[p].discard(w)
            for p in zip(out, out[1:]):
                count[p] += cw
                touched.add(p)
                where.setdefault(p, set()).add(w)
            wsyms[w] = out
        count.pop((a, b), None)
        for p in touched:
            if count.get(p, 0) > 0 and p != (a, b):
                heapq.heappush(heap, (-count[p], p[0], p[1]))
    return merges, new


def train_bpe(text: str, vocab_size: int, specials: list[str] | tuple[str, ...] = QWEN_SPECIALS,
              pre: str = "qwen2") -> tuple[list[str], list[int], list[str]]:
    """Byte-level BPE: (tokens, token_types, merges). Ids 0..255 are the bytes in byte order (GPT-2's
    printable spelling), then merged tokens in order of creation, then `specials` as CONTROL tokens."""
    n_new = vocab_size - 256 - len(specials)
    if n_new < 0:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for 256 bytes and {len(specials)} specials")
    base = list(BYTE_TO_UNICODE)
    idx = {c: i for i, c in enumerate(base)}
    words = Counter(byte_encode(w) for w in pre_tokenizer(pre).split(text))
    wids = Counter({tuple(idx[c] for c in w): n for w, n in words.items()})
    merges, new = learn_merges(wids, base, n_new, forbidden=frozenset(specials))
    if len(new) < n_new:
        raise ValueError(f"the text supports only {256 + len(new)} learnt tokens, fewer than {256 + n_new}")
    tokens = base + new + list(specials)
    types = [int(TokenType.NORMAL)] * (256 + len(new)) + [int(TokenType.CONTROL)] * len(specials)
    return tokens, types, [f"{l} {r}" for l, r in merges]


def train_spm(text: str, vocab_size: int) -> tuple[list[str], list[int], list[float]]:
    """SentencePiece-style vocabulary: (tokens, token_types, scores). Each line is a sentence with a dummy
    prefix (add_space_prefix); tabs, newlines and characters seen once are left to byte fallback."""
    words = Counter()
    for line in text.split("\n"):
        words.update(_SPM_WORDS.findall(SPACE + line.replace(" ", SPACE)))
    chars = Counter()
    for w, n in words.items():
        for ch in w:
            chars[ch] += n
    alphabet = sorted((c for c, n in chars.items() if n >= 2), key=lambda c: (-chars[c], c))
    fixed = list(SPM_SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    n_new = vocab_size - len(fixed) - len(alphabet)
    if n_new < 0:
        raise ValueError(f"vocab_size {vocab_size} < {len(fixed)} fixed tokens + {len(alphabet)} characters")
    idx = {c: i for i, c in enumerate(alphabet)}
    wids = Counter()
    for w, n in words.items():   # a rare character splits its word: it is never merged
        part = []
        for ch in w + "\0":
            if ch in idx:
                part.append(idx[ch])
                continue
            if len(part) > 1:
                wids[tuple(part)] += n
            part = []
    _, new = learn_merges(wids, alphabet, n_new, forbidden=frozenset(fixed))
    tokens = fixed + new + alphabet
    types = ([int(TokenType.UNKNOWN)] + [int(TokenType.CONTROL)] * 2 + [int(TokenType.BYTE)] * 256
             + [int(TokenType.NORMAL)] * (len(new) + len(alphabet)))
    scores = [0.0] * len(fixed) + [-float(i) for i in range(len(new) + len(alphabet))]
    return tokens, types, scores


# GGUF value type of each tokenizer key as llama.cpp's loader reads it (ids are uint32; a wrong type is an
# error there, so the writer must not let gguf-py infer int32).
KEY_TYPES = {
    "tokenizer.ggml.model": "str", "tokenizer.ggml.pre": "str", "tokenizer.ggml.tokens": "str[]",
    "tokenizer.ggml.token_type": "i32[]", "tokenizer.ggml.merges": "str[]", "tokenizer.ggml.scores": "f32[]",
    "tokenizer.ggml.bos_token_id": "u32", "tokenizer.ggml.eos_token_id": "u32",
    "tokenizer.ggml.eot_token_id": "u32", "tokenizer.ggml.padding_token_id": "u32",
    "tokenizer.ggml.unknown_token_id": "u32", "tokenizer.ggml.add_bos_token": "bool",
    "tokenizer.ggml.add_eos_token": "bool", "tokenizer.ggml.add_space_prefix": "bool",
    "tokenizer.chat_template": "str",
}


def tokenizer_metadata(tokens: list[str], types: list[int], merges: list[str] | None, pre: str,
                       bos: str | int | None, eos: str | int | None, eot: str | int | None,
                       chat_template: str | None, pad_to: int | None = None, *,
                       scores: list[float] | None = None, pad: str | int | None = None,
                       add_bos: bool | None = None) -> dict[str, object]:
    """The `tokenizer.*` GGUF keys of a vocabulary. With `merges` the model is `gpt2` (byte-level BPE, `pre`
    names the pre-tokeniser); with `merges=None` and `scores` it is `llama` (SentencePiece, pre "default").
    Special tokens are given by text or id. `pad_to` appends UNUSED "[PAD<id>]" tokens, as llama.cpp's
    converter does, up to a real model's vocabulary size. add_bos defaults to False for gpt2 (Qwen) and True
    for llama (Mixtral)."""
    tokens, types = list(tokens), [int(t) for t in types]
    assert len(tokens) == len(types), "tokens and types must align"
    spm = merges is None
    if spm and (scores is None or len(scores) != len(tokens)):
        raise ValueError("a SentencePiece (llama) vocabulary needs one score per token")
    scores = [float(s) for s in scores] if spm else None
    if pad_to is not None:
        if pad_to < len(tokens):
            raise ValueError(f"pad_to={pad_to} is below the vocabulary's {len(tokens)} tokens")
        floor = min(scores) - 1.0 if spm else 0.0
        for i in range(len(tokens), pad_to):
            tokens.append(f"[PAD{i}]")
            types.append(int(TokenType.UNUSED))
            if spm:
                scores.append(floor)
    index = {t: i for i, t in enumerate(tokens)}
    assert len(index) == len(tokens), "token texts must be unique"

    def tid(x):
        if x is None or isinstance(x, int):
            assert x is None or 0 <= x < len(tokens), f"token id {x} is outside the vocabulary"
            return x
        if x not in index:
            raise ValueError(f"special token {x!r} is not in the vocabulary")
        return index[x]

    meta: dict[str, object] = {
        "tokenizer.ggml.model": "llama" if spm else "gpt2",
        "tokenizer.ggml.pre": "default" if spm else pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
    }
    if spm:
        meta["tokenizer.ggml.scores"] = scores
    else:
        pre_tokenizer(pre)   # refuses an unknown pre-tokeniser now rather than at load time
        meta["tokenizer.ggml.merges"] = list(merges)
    for key, x in (("bos", bos), ("eos", eos), ("eot", eot), ("padding", pad)):
        if tid(x) is not None:
            meta[f"tokenizer.ggml.{key}_token_id"] = tid(x)
    if spm:
        meta["tokenizer.ggml.unknown_token_id"] = tid("<unk>") if "<unk>" in index else 0
        meta["tokenizer.ggml.add_space_prefix"] = True
    meta["tokenizer.ggml.add_bos_token"] = spm if add_bos is None else bool(add_bos)
    meta["tokenizer.ggml.add_eos_token"] = False
    if chat_template is not None:
        meta["tokenizer.chat_template"] = chat_template
    return meta


def write_tokenizer_metadata(writer, meta: dict[str, object]) -> None:
    """Add `meta` (from `tokenizer_metadata`) to a `gguf.GGUFWriter` with llama.cpp's value types."""
    from gguf import GGUFValueType as T

    scalar = {"str": T.STRING, "u32": T.UINT32, "bool": T.BOOL}
    array = {"str[]": T.STRING, "i32[]": T.INT32, "f32[]": T.FLOAT32}
    for key, val in meta.items():
        kind = KEY_TYPES.get(key)
        if kind is None:
            raise KeyError(f"no GGUF type is known for {key!r}")
        if kind in scalar:
            writer.add_key_value(key, val, scalar[kind])
        else:
            writer.add_key_value(key, list(val), T.ARRAY, sub_type=array[kind])


def preset_tokenizer_metadata(style: str, text: str, vocab_size: int = 4096, pad_to: int | None = None
                              ) -> dict[str, object]:
    """Tokenizer keys for a made-up model in the style of a preset: "qwen" (byte-level BPE, pre qwen2,
    ChatML specials and template, bos = pad = <|endoftext|>, eos = <|im_end|>, no BOS added, as Qwen's GGUFs)
    or "mixtral" (SentencePiece, <s>/</s>, Mixtral-Instruct template, BOS added)."""
    from strata.chat import CHATML_TEMPLATE, MIXTRAL_TEMPLATE

    if style == "qwen":
        tokens, types, merges = train_bpe(text, vocab_size, QWEN_SPECIALS, pre="qwen2")
        return tokenizer_metadata(tokens, types, merges, "qwen2", "<|endoftext|>", "<|im_end|>", None,
                                  CHATML_TEMPLATE, pad_to, pad="<|endoftext|>")
    if style == "mixtral":
        tokens, types, scores = train_spm(text, vocab_size)
        return tokenizer_metadata(tokens, types, None, "default", "<s>", "</s>", None, MIXTRAL_TEMPLATE, pad_to,
                                  scores=scores)
    raise ValueError(f"unknown tokenizer style {style!r}; supported: qwen, mixtral")
