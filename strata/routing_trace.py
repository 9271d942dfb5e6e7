"""Routing traces (`--dump-routing`) and expert profiles (`--expert-profile`), shared by the engines and sim/.

Trace format, JSON Lines:
  line 1   {"format": "strata-routing", "version": 1, "arch": str, "n_layer": L, "n_expert": E, "n_expert_used": K}
  then one {"chunk": c, "pos0": p, "n_tokens": T, "layer": l, "ids": [[e, ...] * T], "counts": {e: n, ...}}
           per chunk and layer, in execution order; "ids" is [T, K] (each token's routed experts in k order),
           "counts" the tokens per routed expert (SPEC §3's cnt[e]). A decode step is a chunk of one token.
A profile is the (layer, expert) routing counts summed over one or more traces, hottest first.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Iterator

FORMAT, VERSION = "strata-routing", 1


class RoutingWriter:
    def __init__(self, path: str, model):
        c = model.cfg
        try:
            self.f = open(path, "w", encoding="utf-8")
        except OSError as e:
            raise ValueError(f"{path}: cannot write the routing trace there ({e.strerror})") from None
        self.f.write(json.dumps({"format": FORMAT, "version": VERSION, "arch": c.arch, "n_layer": c.n_layer,
                                 "n_expert": c.n_expert, "n_expert_used": c.n_expert_used}) + "\n")
        self.engine = None

    def bind(self, engine) -> None:
        """The engine whose `pos` and `n_chunks` give each record its chunk and position."""
        self.engine = engine

    def layer(self, layer: int, ids) -> None:
        ids = [[int(e) for e in row] for row in ids]
        cnt = Counter(e for row in ids for e in row)
        rec = {"chunk": self.engine.n_chunks if self.engine else 0, "pos0": self.engine.pos if self.engine else 0,
               "n_tokens": len(ids), "layer": int(layer), "ids": ids,
               "counts": {str(e): n for e, n in sorted(cnt.items())}}
        self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.f.close()


def read(path: str) -> tuple[dict, Iterator[dict]]:
    """(the trace's head, its records in order). A file that is not a trace, of another version, or with a line
    that is not JSON (a trace cut short) is a ValueError naming the file and the line."""
    f = open(path, encoding="utf-8")
    try:
        first = f.readline()
        try:
            head = json.loads(first)
        except json.JSONDecodeError:
            raise ValueError(f"{path}: not a Strata routing trace (line 1 is not JSON"
                             f"{'' if first else ': the file is empty'})") from None
        fmt = head.get("format") if isinstance(head, dict) else None
        if fmt != FORMAT:
            raise ValueError(f"{path}: not a Strata routing trace (first line has format {fmt!r})")
        if head.get("version") != VERSION:
            raise ValueError(f"{path}: routing trace version {head.get('version')} (this Strata reads {VERSION})")
        for k in ("n_layer", "n_expert"):
            if not isinstance(head.get(k), int) or head[k] < 1:
                raise ValueError(f"{path}: the trace's head has no {k} (a positive integer): {first.strip()[:120]}")
    except BaseException:
        f.close()
        raise

    def records():
        with f:
            for i, line in enumerate(f, 2):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError:
                        raise ValueError(f"{path}: line {i} is not JSON (a trace cut short?)") from None

    return head, records()


def profile(paths: list[str]) -> tuple[dict, Counter]:
    """Summed (layer, expert) -> token count over traces of one model. A record whose layer, experts or counts
    are not the head's shape is a ValueError naming the file and the record."""
    total, head0 = Counter(), None
    for p in paths:
        head, recs = read(p)
        if head0 and (head["n_layer"], head["n_expert"]) != (head0["n_layer"], head0["n_expert"]):
            raise ValueError(f"{p}: trace of a different model shape than {paths[0]}")
        head0 = head0 or head
        L, E = head["n_layer"], head["n_expert"]
        for i, r in enumerate(recs, 1):
            try:
                layer, counts = r["layer"], r["counts"]
                got = [(int(e), n) for e, n in counts.items()]
                ok = isinstance(layer, int) and 0 <= layer < L and all(
                    0 <= e < E and isinstance(n, int) and n >= 0 for e, n in got)
            except (KeyError, TypeError, AttributeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"{p}: record {i} is not a layer's routing counts of a {L}-layer, {E}-expert "
                                 f"model: {json.dumps(r)[:120]}")
            for e, n in got:
                total[(layer, e)] += n
    return head0, total


def hottest_first(counts: Counter, n_layer: int, n_expert: int) -> list[tuple[int, int]]:
    """Every (layer, expert), most-routed first; unseen ones after, in (layer, expert) order (stable)."""
    pairs = [(l, e) for l in range(n_layer) for e in range(n_expert)]
    return sorted(pairs, key=lambda p: -counts.get(p, 0))
