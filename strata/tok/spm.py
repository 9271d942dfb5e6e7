"""SentencePiece-style encoding of one text fragment: `llm_tokenizer_spm_session::tokenize` (llama-vocab.cpp).

The fragment (spaces already escaped to U+2581) is split into characters; every adjacent pair whose
concatenation is a vocabulary entry is a candidate bigram scored by that entry's score. The best bigram
(highest score, then leftmost) is merged until none is left. A final symbol that is not a token is emitted
byte by byte as `<0xXX>` tokens (`byte_to_token`; a bare one-byte token if there is no `<0xXX>`).

Speed-up, exact by construction: when no vocabulary entry holds U+2581 right after another character, no
symbol can straddle a "c|U+2581" boundary, so the text is cut there into words merged (and cached)
independently; merges in different words never interact, and within one word the order is unchanged.
"""

from __future__ import annotations

import heapq

import regex

from strata.tok.bpe import CACHE_WORDS
from strata.tok.vocab import Vocab

SPACE = "\u2581"
_WORDS = regex.compile(SPACE + "*[^" + SPACE + "]+|" + SPACE + "+")   # cut before each run of U+2581
_INNER_SPACE = regex.compile("[^" + SPACE + "]" + SPACE)                 # U+2581 after another character


class SpmEncoder:
    def __init__(self, vocab: Vocab):
        assert vocab.model == "llama"
        self.vocab = vocab
        self.splittable = not any(_INNER_SPACE.search(t) for t in vocab.tokens)
        self._cache: dict[str, tuple[int, ...]] = {}   # word -> ids (a pure cache)

    def encode(self, text: str, out: list[int]) -> None:
        """`text` is the fragment after the space prefix and U+2581 escaping."""
        if not self.splittable:
            out.extend(self._encode_word(text))
            return
        cache = self._cache
        for word in _WORDS.findall(text):
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= CACHE_WORDS:
                    cache.clear()
                ids = cache[word] = self._encode_word(word)
            out.extend(ids)

    def _encode_word(self, text: str) -> tuple[int, ...]:
        t2i, scores = self.vocab.token_to_id, self.vocab.scores
        sym = list(text)
        n = len(sym)
        nxt = list(range(1, n)) + [-1] if n else []
        prv = list(range(-1, n - 1))
        heap = []

        def try_add(left: int, right: int):
            if left < 0 or right < 0:
                return
            tid = t2i.get(sym[left] + sym[right])
            if tid is not None:   # ordered by score (higher first), then left index (smaller first)
                heapq.heappush(heap, (-scores[tid], left, right, len(sym[left]) + len(sym[right])))

        for i in range(1, n):
            try_add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue   # one side already merged elsewhere
            sym[left], sym[right] = sym[left] + sym[right], ""
            nxt[left] = nxt[right]
            if nxt[left] >= 0:
                prv[nxt[left]] = left
            try_add(prv[left], left)
            try_add(left, nxt[left])
        out = []
        for s in sym:
            if not s:
                continue
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte_token(b) for b in s.encode("utf-8"))
        return tuple(out)

    def _byte_token(self, b: int) -> int:
        t2i = self.vocab.token_to_id
        tid = t2i.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = t2i.get(chr(b))
        if tid is None:   # llama.cpp's token_to_id.at() throws here too
            raise KeyError(f"SPM vocabulary has no byte token <0x{b:02X}> for byte fallback")
        return tid

