"""Byte-level BPE encoding of one text fragment: `llm_tokenizer_bpe_session::tokenize` (src/llama-vocab.cpp).

Each pre-token is byte-encoded (GPT-2's map), split into characters, and merged pair by pair: always the pair
of lowest merge rank, the leftmost one on ties (llama.cpp's priority queue orders bigrams by (rank, left
index)). Finished symbols missing from the vocabulary fall back to one token per byte where a one-byte token
exists; llama.cpp silently drops the others, and so do we. Results are cached per pre-token: the merges of a
word never depend on its neighbours.
"""

from __future__ import annotations

import heapq

from strata.tok.pretok import byte_encode
from strata.tok.vocab import Vocab

CACHE_WORDS = 1 << 18   # the word cache is emptied when it reaches this many entries (a long-running server)


class BpeEncoder:
    def __init__(self, vocab: Vocab):
        assert vocab.model == "gpt2" and vocab.pre is not None
        self.vocab = vocab
        self._cache: dict[str, tuple[int, ...]] = {}   # pre-token -> ids (a pure cache)

    def encode(self, fragment: str, out: list[int]) -> None:
        cache = self._cache
        for word in self.vocab.pre.split(fragment):
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= CACHE_WORDS:
                    cache.clear()
                ids = cache[word] = self._encode_word(byte_encode(word))
            out.extend(ids)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        t2i = self.vocab.token_to_id
        if self.vocab.pre.ignore_merges and word in t2i:
            return (t2i[word],)
        return tuple(_ids_of(merge_word(word, self.vocab.ranks), t2i))


def merge_word(word: str, ranks: dict) -> list[str]:
    """The symbols `word` ends as after BPE merging by rank (ties: leftmost)."""
    sym = list(word)                      # symbol texts; "" once merged into the left neighbour
    n = len(sym)
    if n < 2:
        return sym
    nxt = list(range(1, n)) + [-1]
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        r = ranks.get((sym[i], sym[i + 1]))
        if r is not None:
            heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
    heapq.heapify(heap)
    while heap:
        _, left, right, text = heapq.heappop(heap)
        if not sym[left] or not sym[right] or sym[left] + sym[right] != text:
            continue   # outdated bigram (llama.cpp skips it the same way)
        sym[left], sym[right] = text, ""
        nxt[left] = nxt[right]
        if nxt[left] >= 0:
            prv[nxt[left]] = left
        for a, b in ((prv[left], left), (left, nxt[left])):
            if a >= 0 and b >= 0:
                r = ranks.get((sym[a], sym[b]))
                if r is not None:
                    heapq.heappush(heap, (r, a, b, sym[a] + sym[b]))
    return [s for s in sym if s]


def _ids_of(symbols: list[str], t2i: dict) -> list[int]:
    out = []
    for s in symbols:
        tid = t2i.get(s)
        if tid is not None:
            out.append(tid)
            continue
        # Byte fallback: each UTF-8 byte of the symbol looked up as a one-byte string; only ASCII bytes can
        # be whole str tokens, the others find nothing and are dropped (as in llama.cpp).
        for b in s.encode("utf-8"):
            if b < 0x80 and chr(b) in t2i:
                out.append(t2i[chr(b)])
    return out
