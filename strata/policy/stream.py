"""The stream plan: which walk a chunk takes, the ring size, and the order experts stream in (SPEC §3).

Pure functions of the chunk, the configuration and the residency; the engine and the simulator call the same
ones. Sequences of flags are indexed by expert id (numpy arrays and lists both work).
"""

from __future__ import annotations

from enum import Enum
from typing import Sequence

from .env import Config, Share

STREAM_ALL_MIN_OFF = 1024  # stream_all_min() without the share and without an override
ROUTED_ONLY_RING = 8  # prefill.cpp STAGE: the routed-only walk's transfers in flight ahead of compute
# ours: the routed-only walk's device slots hold those 8 beside the 8 being computed (groups of 8), so copies
# never wait for the group before. 8 slots in groups of 4 cost qwen3's 250-token prompt 17% on the H200 (29.6 ->
# 34.6 ms, twice the launches, host-bound; bench/results/h200/prefill_q8_ring8.log)
ROUTED_ONLY_SLOTS = 2 * ROUTED_ONLY_RING
RING_BUDGET_BYTES = 384 * 1_382_400  # #583 byte budget: 384 Q2_0 blobs' worth of ring (SPEC §3)
RING_MIN, RING_MAX = 16, 512  # clamp of the byte-budget ring (ring_cap() without the fused ring)


class Walk(Enum):
    ROUTED_ONLY = "routed-only"  # after the routing sync, stream the routed non-resident experts (8 ahead)
    STREAM_ALL = "stream-all"  # at chunk start, queue every non-resident expert of every layer


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
    """Device ring slots for a chunk of ``chunk`` tokens: the routed-only walk's 16 below stream_all_min() or
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


def stream_all_queue(resident_by_layer: Sequence[Sequence[bool]]) -> list[tuple[int, int]]:
    """The stream-all walk's queue: every non-resident (layer, expert), layer by layer, in id order, routed or
    not. Entry k uses ring slot k mod R and is issued once entry k - R was consumed."""
    return [(l, e) for l, res in enumerate(resident_by_layer) for e in range(len(res)) if not res[e]]
