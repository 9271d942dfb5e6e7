"""The chunk/loan planner (SPEC §9, vram_plan.cpp plan_lend_chunks), on hand-computed budgets."""

import pytest

from strata.policy import PLANNERS, ChunkPlan, LoanRequest, PlanError, PlannerKind, prompt_loan

MIB = 2**20


def req(slots, ring=384, lend_pct=90, ceiling=8192, lent=0):
    # slots of 1 MiB; buffers 64 MiB + 32 KiB per token (8192 tokens -> 320 MiB)
    return LoanRequest(
        cache_slots=slots,
        slot_bytes=MIB,
        buffer_bytes=lambda t: 64 * MIB + t * 32 * 1024,
        ring=ring,
        lend_pct=lend_pct,
        ceiling=ceiling,
        lent_bytes=lent,
    )


@pytest.mark.parametrize(
    "slots, lend_pct, lent, plan",
    [
        (2000, 90, 0, ChunkPlan(8192, 704, 384)),  # 320 + 384 MiB fits in min(1872, 1800)
        (700, 90, 0, ChunkPlan(3840, 568, 384)),  # loan <= min(572, 630): 64 + t/32 + 384 <= 572 -> 3840
        (600, 90, 0, ChunkPlan(768, 472, 384)),  # loan <= 472: 64 + 24 + 384
        (1000, 50, 0, ChunkPlan(1536, 496, 384)),  # STRATA_PREFILL_LEND_PCT=50: loan <= 500
        (600, 90, 100 * MIB, ChunkPlan(3840, 468, 384)),  # 100 MiB of decode-only VRAM lent first
        (500, 90, 0, ChunkPlan(8192, 372, 52)),  # no full ring fits: the largest chunk with a ring >= 16
        (300, 90, 0, ChunkPlan(2816, 172, 20)),  # loan <= 172: 64 + 88 + 20
    ],
)
def test_auto(slots, lend_pct, lent, plan):
    assert PLANNERS.create(PlannerKind.AUTO).plan(req(slots, lend_pct=lend_pct, lent=lent)) == plan


def test_shortfall_is_said():
    with pytest.raises(
        PlanError,
        match=r"needs 88 MiB for a 256-token chunk with a 16-slot ring, but can "
        r"borrow only 22 MiB \(22 of 150 cache slots; 66 MiB short\)",
    ):
        PLANNERS.create(PlannerKind.AUTO).plan(req(150))


def test_fixed_halves_without_the_90_percent_rule():
    # loan <= 600 - 128 = 472: 8192 (704), 4096 (576), 2048 (512), 1024 (480) do not fit, 512 (464) does
    assert PLANNERS.create(PlannerKind.FIXED).plan(req(600)) == ChunkPlan(512, 464, 384)


@pytest.mark.parametrize(
    "tokens, ring, got",
    [
        (250, 8, (256, 80)),  # 64 + 256/32 + 8: its own layout on the grid, the routed-only walk's 8 slots
        (1000, 8, (1024, 104)),  # 64 + 32 + 8
        (3840, 384, (3840, 568)),  # a full chunk borrows the plan's loan
        (9000, 384, (3840, 568)),  # a longer prompt too (it runs in chunks of 3840)
        (9000, 999, (3840, 568)),  # never a ring beyond the plan's
    ],
)
def test_a_prompt_borrows_only_what_it_lays_out(tokens, ring, got):
    r = req(700)
    plan = PLANNERS.create(PlannerKind.AUTO).plan(r)
    assert plan == ChunkPlan(3840, 568, 384)
    assert prompt_loan(r, plan, tokens, ring) == got
