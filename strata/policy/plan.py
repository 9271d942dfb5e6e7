"""The prompt plan: chunk size, loan of cache slots and ring (SPEC §9; vram_plan.cpp ``plan_lend_chunks``).

Prompt buffers borrow the expert cache's last slots. A loan of k slots fits iff k + 128 <= slots and (auto)
100·k <= lend_pct·slots. Auto: the largest chunk on the 256-token grid up to the ceiling whose buffers plus
a full ring fit; if none does, the largest whose buffers plus a ring of >= 16 slots fit, with the ring cut to
what fits (ours: the original retries with a ring floor of 16). Fixed: halve the requested chunk until it
fits (no 90% rule). ``lent_bytes``: decode-only VRAM released for the prompt (the elastic loans), used
before any slot. ``prompt_loan``: what one prompt borrows of that plan (ours: only what it lays out).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

from .registry import Registry

GRID = 256  # chunk grid (tokens)
AUTO_CEILING = 8192  # auto chunks stop here unless asked for more
MIN_KEEP_SLOTS = 128  # a loan leaves at least this many cache slots
RING_FLOOR = 16


class PlanError(ValueError):
    """No chunk fits: the message says the shortfall."""


@dataclass(frozen=True, slots=True)
class LoanRequest:
    cache_slots: int  # slots in the expert cache
    slot_bytes: int  # bytes per slot (the largest blob)
    buffer_bytes: Callable[[int], int]  # prompt buffers for a chunk of t tokens, ring excluded
    ring: int  # the ring the walk wants (byte-budget ring), slots of slot_bytes
    lend_pct: int = 90  # STRATA_PREFILL_LEND_PCT
    ceiling: int = AUTO_CEILING  # largest chunk considered (auto) or requested (fixed)
    lent_bytes: int = 0  # decode-only VRAM lent to the prompt path

    def __post_init__(self):
        assert self.cache_slots >= 0 and self.slot_bytes > 0 and self.ring >= 1, self
        assert self.ceiling >= GRID, f"a chunk of at least {GRID} tokens, got {self.ceiling}"


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    chunk: int  # tokens per chunk
    loan_slots: int  # cache slots lent to the prompt path (their experts are non-resident during the prompt)
    ring: int  # staging ring slots for the stream-all walk


class PlannerKind(Enum):
    AUTO = "auto"
    FIXED = "fixed"


PLANNERS: Registry["Planner"] = Registry("chunk planner", PlannerKind)


class Planner:
    def plan(self, req: LoanRequest) -> ChunkPlan:
        raise NotImplementedError

    @staticmethod
    def loan_for(req: LoanRequest, t: int, ring: int) -> int:
        need = req.buffer_bytes(t) + ring * req.slot_bytes - req.lent_bytes
        return max(0, -(-need // req.slot_bytes))

    @staticmethod
    def _shortfall(req: LoanRequest, t: int, ring: int, max_loan: int) -> PlanError:
        need = req.buffer_bytes(t) + ring * req.slot_bytes
        have = max(0, max_loan) * req.slot_bytes + req.lent_bytes
        mib = 2**20
        return PlanError(
            f"the prompt path needs {need / mib:.0f} MiB for a {t}-token chunk with a "
            f"{ring}-slot ring, but can borrow only {have / mib:.0f} MiB ({max(0, max_loan)} of "
            f"{req.cache_slots} cache slots; {(need - have) / mib:.0f} MiB short)"
        )


@PLANNERS.register(PlannerKind.AUTO)
class LendPlanner(Planner):
    def plan(self, req: LoanRequest) -> ChunkPlan:
        max_loan = min(req.cache_slots - MIN_KEEP_SLOTS, req.lend_pct * req.cache_slots // 100)
        grid = range(req.ceiling // GRID * GRID, 0, -GRID)
        for t in grid:
            k = self.loan_for(req, t, req.ring)
            if k <= max_loan:
                return ChunkPlan(t, k, req.ring)
        room = max(0, max_loan) * req.slot_bytes + req.lent_bytes
        for t in grid:
            ring = min(req.ring, (room - req.buffer_bytes(t)) // req.slot_bytes)
            if ring >= RING_FLOOR:
                return ChunkPlan(t, self.loan_for(req, t, ring), ring)
        raise self._shortfall(req, GRID, RING_FLOOR, max_loan)


@PLANNERS.register(PlannerKind.FIXED)
class FixedChunkPlanner(Planner):
    def plan(self, req: LoanRequest) -> ChunkPlan:
        max_loan = req.cache_slots - MIN_KEEP_SLOTS
        t = req.ceiling
        while t >= 1:
            k = self.loan_for(req, t, req.ring)
            if k <= max_loan:
                return ChunkPlan(t, k, req.ring)
            t //= 2
        raise self._shortfall(req, 1, req.ring, max_loan)


def prompt_loan(req: LoanRequest, plan: ChunkPlan, tokens: int, ring: int) -> tuple[int, int]:
    """(layout chunk, loan slots) of one prompt of ``tokens`` whose walk uses ``ring`` slots (ours): it lays out
    for its own length on the grid, at most the plan's chunk, with at most the plan's ring. The plan sizes the
    largest loan; a short prompt borrows only what it uses, so fewer experts turn non-resident while it runs and
    fewer are refilled after it (SPEC §9: lent slots are refilled before the first generated token)."""
    assert tokens >= 1 and ring >= 1, (tokens, ring)
    t = min(plan.chunk, -(-tokens // GRID) * GRID)
    return t, Planner.loan_for(req, t, min(ring, plan.ring))
