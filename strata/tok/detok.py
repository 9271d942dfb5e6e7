"""Token ids back to bytes: llama.cpp's `token_to_piece` and `detokenize` (src/llama-vocab.cpp).

A piece is bytes, not text: a byte-level token may hold part of a UTF-8 character, so the joined bytes of
a whole sequence are decoded once at the end. `StreamDecoder` does the same incrementally, holding back an
incomplete trailing character until its remaining bytes arrive.
"""

from __future__ import annotations

from strata.tok.pretok import UNICODE_TO_BYTE
from strata.tok.spm import SPACE
from strata.tok.vocab import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Vocab

_HIDDEN = UNKNOWN | CONTROL   # rendered only when special=True


def pieces(vocab: Vocab) -> tuple[bytes, ...]:
    """Every token's piece with special=True (llama.cpp's `cache_token_to_piece`)."""
    return tuple(_piece(vocab, i) for i in range(vocab.n_vocab))


def _piece(vocab: Vocab, tid: int) -> bytes:
    attr, text = vocab.attrs[tid], vocab.tokens[tid]
    if attr & (_HIDDEN | USER_DEFINED):
        return text.encode("utf-8")   # verbatim, not byte-decoded
    if attr & NORMAL:
        if vocab.model == "llama":
            return text.replace(SPACE, " ").encode("utf-8")
        return _byte_decode(text)
    if attr & BYTE:
        if vocab.model == "llama" or text.startswith("<0x"):
            return bytes([int(text[3:5], 16)])   # `token_to_byte`: "<0xXX>"
        return b""
    return b""   # UNUSED / UNDEFINED render as nothing


def _byte_decode(text: str) -> bytes:
    """`llama_decode_text`: byte-level characters back to bytes; a character outside GPT-2's map becomes
    "[UNK_BYTE_0x<its utf-8 hex>" followed by the whole token text and "]", as in llama.cpp."""
    out = bytearray()
    for ch in text:
        b = UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def token_piece(vocab: Vocab, cache: tuple[bytes, ...], tid: int, special: bool, lstrip: bool = False
                ) -> bytes:
    if not 0 <= tid < vocab.n_vocab:
        raise IndexError(f"token id {tid} is outside the vocabulary (0..{vocab.n_vocab - 1})")
    if not special and vocab.attrs[tid] & _HIDDEN:
        return b""
    p = cache[tid]
    return p[1:] if lstrip and p[:1] == b" " else p


def detokenize(vocab: Vocab, cache: tuple[bytes, ...], ids: list[int], remove_special: bool,
               unparse_special: bool) -> bytes:
    """`llama_vocab::impl::detokenize`: pieces joined, SPM's leading space dropped, spaces cleaned up."""
    ids = list(ids)
    remove_space = vocab.add_space_prefix
    if remove_special and vocab.add_bos and ids and ids[0] == vocab.special["bos"]:
        remove_space = False   # sic: a dropped BOS keeps the next token's leading space
        ids = ids[1:]
    if remove_special and vocab.add_eos and ids and ids[-1] == vocab.special["eos"]:
        ids = ids[:-1]
    out = bytearray()
    for tid in ids:
        out += token_piece(vocab, cache, tid, unparse_special, lstrip=remove_space)
        remove_space = False
    return _clean_spaces(out) if vocab.clean_spaces else bytes(out)


def _clean_spaces(t: bytearray) -> bytes:
    """The three in-place passes of llama.cpp's clean_up_tokenization_spaces, index for index."""
    sp, ap = ord(" "), ord("'")
    # 1: " ?", " !", " .", " ," lose the space
    total1, total = len(t), 1 if t else 0
    for i in range(1, total1):
        x = t[i]
        if t[i - 1] == sp and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    # 2: a lone apostrophe between spaces loses both spaces
    total2, total = total, 1 if total else 0
    i = 1
    while i < total2:
        x = t[i]
        if x == ap and i + 1 < total2 and t[i - 1] == sp and t[i + 1] == sp:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    # 3: " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it)
    total3, total = total, 1 if total else 0
    for i in range(1, total3):
        x = t[i]
        if t[i - 1] == sp and x == ap and i + 1 < total3:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif i + 2 < total3 and (x1, t[i + 2]) in ((ord("r"), ord("e")), (ord("v"), ord("e"))):
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


def incomplete_utf8_tail(buf: bytes) -> int:
    """Bytes at the end of `buf` that start a UTF-8 character not yet complete (0..3), like the server's
    `validate_utf8` in llama.cpp."""
    for k in range(1, min(4, len(buf)) + 1):
        c = buf[-k]
        if c & 0xC0 == 0x80:
            continue   # continuation byte: look further back
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        return k if need > k else 0
    return 0


class StreamDecoder:
    """Incremental detokenizer: `feed(id)` returns the text that became complete. Pieces are joined as in
    llama.cpp's server streaming (no leading-space removal, no clean-up passes, which need the whole text)."""

    def __init__(self, tokenizer, special: bool = False):
        self._tok, self._special, self._buf = tokenizer, special, b""

    def feed(self, tid: int) -> str:
        self._buf += self._tok.piece(tid, special=self._special)
        k = incomplete_utf8_tail(self._buf)
        ready, self._buf = (self._buf[:-k], self._buf[-k:]) if k else (self._buf, b"")
        return ready.decode("utf-8", errors="replace")

    def flush(self) -> str:
        rest, self._buf = self._buf, b""
        return rest.decode("utf-8", errors="replace")
