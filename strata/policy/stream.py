"""The stream plan: which walk a chunk takes, the ring size, and the order experts stream in (SPEC §3).

Pure functions of the chunk, the configuration and the residency; the engine and the simulator call the same
ones. Sequences of flags are indexed by expert id (numpy arrays and lists both work).
"""

from __future__ import annotations

from enum import Enum
from typing import Iterator, Sequence

import numpy as np

from .env import Config, Share

STREAM_ALL_MIN_OFF = 1024  # stream_all_min() without the share and without an override
ROUTED_ONLY_RING = 8  # prefill.cpp STAGE: the routed-only walk's transfers in flight ahead of compute
# ours: the routed-only walk computes its experts in launch groups of up to ROUTED_ONLY_GROUP, its device slots
# holding later groups' copies beside the group being computed, so copies never wait for the group before. The
# Python host enqueues each group's launches and copies, and a short prompt is host-bound: 8 slots in groups of 4
# cost qwen3's 250-token prompt 17% on the H200 against 16 in groups of 8 (prefill_q8_ring8.log); flash-shape's
# 250-token prompt spent ~45 ms of host time in 280 groups of 8 (prefill_host_profile_stop18.log). The slots hold
# four groups, three groups' copies in flight beside the group computing: on the H200 flash-shape's prompts under
# 1,024 tokens took 0.955-0.986 of the time with 64 slots as with 32, for 32 more lent cache slots (+1% streamed;
# routed_ring_ab_stop19.log). A plan's smaller stream-all ring caps it (memplan.for_prompt).
ROUTED_ONLY_GROUP = 16
ROUTED_ONLY_SLOTS = 4 * ROUTED_ONLY_GROUP
RING_BUDGET_BYTES = 384 * 1_382_400  # #583 byte budget: 384 Q2_0 blobs' worth of ring (SPEC §3)
RING_MIN, RING_MAX = 16, 512  # clamp of the byte-budget ring (ring_cap() without the fused ring)


class Walk(Enum):
    ROUTED_ONLY = "routed-only"  # after the routing sync, stream the routed non-resident experts (8 ahead)
    STREAM_ALL = "stream-all"  # at chunk start, queue every non-resident expert of every layer
    LAYER_MAJOR = "layer-major"  # ours: a prompt's chunks layer by layer, each layer's experts admitted once
    #                              (policy.layer_major); walk_for never returns it


# ours: the stream-all walk streams every non-resident expert, routed or not; where routing is skewed most of that
# traffic is waste. On the H200 (bench/results/h200/walk_ab_stop17.log, same plan, interleaved): qwen3-30b-a3b's
# quarter cache in 1,280-token chunks streamed 15.1 GB for an 8K prompt on stream-all against 6.1 GB routed-only,
# 533.7 against 330.8 ms; flash-shape, 9% of its streamed bytes unrouted, ran a 2K prompt 11% faster on stream-all.
STREAM_ALL_WASTE_MAX = 0.25   # a chunk takes stream-all while the last one left at most this share unrouted
# the probes of stops 23-33 (StreamWaste(counted=False), for the simulator's runs of those engines): after this
# many chunks kept off stream-all, one took it again to re-measure;
STREAM_ALL_PROBE = 8
STREAM_ALL_PROBE_MAX = 64     # each probe that found the walk still wasteful doubled that wait, up to this: qwen3's
                              # 8K prompt (7 chunks) paid about one stream-all chunk in every prompt at 8 (+18 ms
                              # of ~300, prefill_timeline_q8_stop23.log), and ~20 ms in the prompts that carried
                              # one at 64 (prefill_q8_r7_stop33.log)


class StreamWaste:
    """Whether a chunk that SPEC §3 sends down the stream-all walk may take it (ours): the unrouted share of the
    stream-all queue of the last such chunk, kept across chunks and prompts. A refused chunk takes the routed-only
    walk, and (`counted`) counts from its own routing what that queue would have held unrouted: the queue is every
    non-resident expert, and the routing says which of them no token routed, the very count the walk measures, with
    nothing streamed for it (`note` takes either). So routing that turns dense again is seen at the next chunk.
    Without `counted` (stops 23-33), a refused chunk measured nothing: every STREAM_ALL_PROBE-th refusal was admitted
    to measure again, a probe that found the walk still wasteful doubled the refusals before the next one, up to
    STREAM_ALL_PROBE_MAX, and one that found it dense started over at STREAM_ALL_PROBE."""

    def __init__(self, counted: bool = True):
        self.counted = counted
        self.waste: float | None = None        # unrouted entries / queue entries of the last such chunk
        self.refused = 0                       # refusals since the last admitted chunk (not counted: the probes)
        self.every = STREAM_ALL_PROBE          # refusals before the next probe

    @property
    def dense(self) -> bool:
        """Nothing measured yet, or the last stream-all chunk left at most STREAM_ALL_WASTE_MAX unrouted."""
        return self.waste is None or self.waste <= STREAM_ALL_WASTE_MAX

    def admit(self) -> bool:
        if self.dense:
            return True
        if self.counted:                       # the refused chunk counts the waste itself
            return False
        self.refused += 1
        if self.refused >= self.every:
            self.refused = 0
            return True
        return False

    def note(self, entries: int, unrouted: int) -> None:
        """A chunk SPEC §3 sends down stream-all ended: the walk's queue held (or, refused and counted, would have
        held) `entries` experts, `unrouted` of them routed to no token."""
        if not entries:
            return
        probe = not self.dense                 # admitted while the last one was wasteful
        self.waste = unrouted / entries
        if self.dense:
            self.every = STREAM_ALL_PROBE
        elif probe:
            self.every = min(2 * self.every, STREAM_ALL_PROBE_MAX)


def stream_all_min(cfg: Config, share: Share) -> int:
    """prefill.cpp ``stream_all_min()``: the override, else the share's max when it is on, else 1024."""
    if cfg.stream_min is not None:
        return cfg.stream_min
    if share.on:
        return cfg.share_max(share)
    return STREAM_ALL_MIN_OFF


def ring_budget_slots(max_blob_bytes: int) -> int:
    """Ring slots the byte budget buys for the largest expert blob, clamped to [16, 512]."""
    assert max_blob_bytes > 0, "an expert blob has at least one byte"
    return min(RING_MAX, max(RING_MIN, RING_BUDGET_BYTES // max_blob_bytes))


def ring_slots(cfg: Config, share: Share, chunk: int, max_blob_bytes: int, planned: int | None = None) -> int:
    """Device ring slots for a chunk of ``chunk`` tokens: the routed-only walk's 64 below stream_all_min() or
    with an override <= 8, else the override, else the planned ring (the loan planner's) or the byte-budget
    ring."""
    if chunk < stream_all_min(cfg, share) or _routed_only_asked(cfg):
        return ROUTED_ONLY_SLOTS
    if cfg.ring is not None:
        return min(RING_MAX, max(RING_MIN, cfg.ring))
    return planned if planned is not None else ring_budget_slots(max_blob_bytes)


def _routed_only_asked(cfg: Config) -> bool:
    return cfg.ring is not None and cfg.ring <= ROUTED_ONLY_RING      # STRATA_PREFILL_RING <= 8


def walk_for(cfg: Config, share: Share, chunk: int, ring: int) -> Walk:
    """prefill.cpp: stream_all = ring > STAGE && T >= stream_all_min() (ring fixed at layout time); a ring
    override <= 8 asks for the routed-only walk."""
    if ring > ROUTED_ONLY_RING and chunk >= stream_all_min(cfg, share) and not _routed_only_asked(cfg):
        return Walk.STREAM_ALL
    return Walk.ROUTED_ONLY


def routed_only_order(cnt: Sequence[int], resident: Sequence[bool], on_cpu: Sequence[int] = ()) -> list[int]:
    """The experts the routed-only walk streams, in id order: routed, not resident, not on the CPU."""
    cpu = set(on_cpu)
    return [e for e in range(len(cnt)) if cnt[e] > 0 and not resident[e] and e not in cpu]


def unrouted_waste(cnt, resident) -> tuple[int, int]:
    """One layer's part of a refused chunk's count (StreamWaste.counted): the stream-all queue's entries there (the
    non-resident experts) and how many of them its routing leaves unrouted. cnt [E] tokens per expert, resident [E]."""
    off = ~np.asarray(resident, bool)
    return int(off.sum()), int((off & (np.asarray(cnt) == 0)).sum())


def stream_all_queue(resident_by_layer: Sequence[Sequence[bool]]) -> list[tuple[int, int]]:
    """The stream-all walk's queue: every non-resident (layer, expert), layer by layer, in id order, routed or
    not. Entry k uses ring slot k mod R and is issued once entry k - R was consumed."""
    return [(l, e) for l, res in enumerate(resident_by_layer) for e in range(len(res)) if not res[e]]


class IssueOrder:
    """Which entries of a walk's queue of (layer, expert) the engine thread may issue, in which copy runs: entry k
    goes once every entry below k - R was consumed (the watermark); a run is neighbouring experts of one layer in
    neighbouring slots, ending at the ring's wrap and the watermark's reach. Entries may be consumed out of order
    (an unrouted entry inside a group's span). strata/accel/stream.py Walk issues its copies by it and
    sim/walks.py HostIssue times them by it."""

    def __init__(self, entries: Sequence[tuple[int, int]], ring: int, base: int = 0):
        self.entries, self.R, self.base = entries, ring, base      # entry k -> slot (base + k) mod R
        self.issued = 0                                  # entries [0, issued) have their copy enqueued
        self.consumed = 0                                # the watermark: entries [0, consumed) are all done
        self._done = np.zeros(len(entries) + 1, bool)

    def grew(self) -> None:
        """Entries were appended to the queue (a guessed walk takes, after the sync, the routed experts it missed)."""
        self._done = np.concatenate([self._done, np.zeros(len(self.entries) + 1 - self._done.size, bool)])

    def done(self, k: int) -> bool:
        return bool(self._done[k])

    def _limit(self) -> int:
        return min(len(self.entries), self.consumed + self.R)

    def _run(self, limit: int) -> tuple[int, int]:
        k0 = self.issued
        l, e0 = self.entries[k0]
        k1 = k0 + 1
        while k1 < limit and (self.base + k1) % self.R and self.entries[k1] == (l, e0 + k1 - k0):
            k1 += 1
        self.issued = k1
        return k0, k1

    def prefetch(self) -> Iterator[tuple[int, int]]:
        """The runs [k0, k1) of every entry whose slot is free now, each marked issued as it is handed out."""
        limit = self._limit()
        while self.issued < limit:
            yield self._run(limit)

    def up_to(self, k: int) -> Iterator[tuple[int, int]]:
        """The runs up to entry k (a group's last, before its launch)."""
        while self.issued <= k:
            limit = self._limit()
            assert self.issued < limit, f"walk: entry {k} beyond the ring's reach ({limit})"
            yield self._run(limit)

    def consume(self, ks) -> None:
        """Entries `ks` have their readers enqueued (or were not routed): the watermark moves past them."""
        assert not self._done[ks].any(), f"an entry of {ks} consumed twice"
        self._done[ks] = True
        while self._done[self.consumed]:
            self.consumed += 1


GROUP_RESIDENT = 64  # experts a launch group from the cache holds at most (few launches for a layer's cache hits)


def resident_runs(many: Sequence[bool], scratch: int) -> list[list[int]]:
    """A layer's resident experts (row order; many[i]: expert i has more rows than the few-row path takes) in
    launch groups: runs of at most GROUP_RESIDENT, of which at most `scratch` need the fp16 weight scratch.
    Indices into `many`; the engine (strata/accel/moe.py) and the simulator (sim/walks.py) both group this way."""
    out, cur, n_many = [], [], 0
    for i, m in enumerate(many):
        m = bool(m)
        if cur and (len(cur) == GROUP_RESIDENT or n_many + m > scratch):
            out.append(cur)
            cur, n_many = [], 0
        cur.append(i)
        n_many += m
    return out + ([cur] if cur else [])


def routed_group(ring: int, scratch: int) -> int:
    """Experts a routed-only launch group holds at most: ROUTED_ONLY_GROUP, half the ring (at least one group's
    copies land while the group before computes), and the weight scratch. The engine and the simulator group this
    way."""
    return max(1, min(ROUTED_ONLY_GROUP, ring // 2, scratch))


def walk_runs(entries: Sequence[int], limit: int, ring: int) -> list[list[int]]:
    """Walk entries (ascending queue indices) in launch groups of at most `limit` spanning fewer than `ring`
    entries, so a group's last copy can always be issued while its first slot is still held."""
    n = len(entries)
    if n and limit <= ring and entries[-1] - entries[0] == n - 1:   # consecutive (the routed-only walk's queue):
        e = list(entries)                                           # no group can span the ring, so chunks
        return [e[i:i + limit] for i in range(0, n, limit)]
    out, cur = [], []
    for k in entries:
        if cur and (len(cur) == limit or k - cur[0] >= ring):
            out.append(cur)
            cur = []
        cur.append(k)
    return out + ([cur] if cur else [])


def routed_groups(entries: Sequence[tuple[int, int]], ks: Sequence[int], routed: set[int], limit: int,
                  ring: int):
    """A layer's walk entries `ks` (ascending indices into the queue `entries` of (layer, expert)) split into
    launch groups of the routed ones (walk_runs) and the unrouted ones to release as the groups pass them:
    unrouted[first entry of a group] = those before it, unrouted[None] = those after the last. The stream-all
    walk's queue holds unrouted entries."""
    kept = [k for k in ks if entries[k][1] in routed]
    groups = walk_runs(kept, limit, ring)
    last = {g[-1]: g for g in groups}
    unrouted, pending = {}, []
    for k in ks:
        if entries[k][1] not in routed:
            pending.append(k)
        elif k in last and pending:
            unrouted[last[k][0]] = pending
            pending = []
    if pending:
        unrouted[None] = pending
    return groups, unrouted
