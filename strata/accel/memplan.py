"""The VRAM plan at start (SPEC §9): dense weights, KV, decode-only resources and the expert cache from the
device's free memory (or `--vram-budget`), and the prompt plan (chunk, loan, ring) from `strata.policy`.
Fails early, saying the shortfall, rather than at the first prompt.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from strata import policy
from strata.accel.buffers import attn_scratch_bytes, layout_bytes, temp_bytes
from strata.accel.cache import slot_bytes_for
from strata.accel.dense import dense_bytes
from strata.policy.plan import GRID, PLANNERS, ChunkPlan, LoanRequest, PlanError, PlannerKind, prompt_loan
from strata.policy.stream import ROUTED_ONLY_RING, ring_budget_slots, ring_slots

MIB = 2**20
MAXT = policy.MAXT             # decode steps carry up to MAXT tokens (speculative verification)
GROUP = 16                     # experts per launch group: decode's weight scratch, and a prompt's when room allows
PROMPT_GROUPS = (16, 8)        # a prompt's weight scratch, largest first: the plan takes the largest chunk, then
                               # the largest group. Not 4: qwen3-30b-a3b's quarter cache then plans 1024-token
                               # chunks that walk stream-all through a 24-slot ring in groups of 4, 1.2-1.3x slower
                               # at 2K and 8K than 768-token chunks in groups of 8 (prefill_q8_groups_stop16.log)


class VramShortfall(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    budget: int              # bytes the engine may use
    dense: int
    kv: int
    decode: int              # decode-only resources (their buffers and ring) + step temporaries
    slot_bytes: int
    cache_slots: int         # expert cache capacity (slots)
    chunk: int               # prompt chunk tokens
    loan_slots: int          # cache slots the prompt path borrows (0 when it owns its buffers)
    ring: int                # stream-all ring slots
    prompt_bytes: int        # prompt buffers + ring
    owned_prompt: bool       # prompt buffers allocated beside the cache instead of borrowed from it
    request: LoanRequest | None = None   # what the loan planner was asked (None when the prompt owns its buffers)
    group: int = GROUP       # experts a prompt launch group dequantises at most (its weight scratch)
    larger: tuple = ()       # (group, LoanRequest) of the larger scratches, largest first: a short prompt's layout
                             # may fit one of them in the planned loan

    def for_prompt(self, config, share, tokens: int) -> tuple[int, int, int, int]:
        """(layout chunk, ring slots, loan slots, group) of a prompt of `tokens`: its first chunk's walk sets the
        ring (the routed-only walk's 16 slots, the planned ring for stream-all), and it borrows only what it lays
        out (policy.prompt_loan); the plan's chunk and ring when the prompt owns its buffers. A prompt shorter
        than the chunk takes the largest weight scratch whose layout still fits the planned loan (fewer, fuller
        launches: qwen3-30b-a3b's quarter cache at 250 tokens, 42.4 ms in groups of 16 against 48.2 in groups of 4,
        prefill_q8_groups_stop16.log)."""
        first = min(self.chunk, tokens)
        ring = min(self.ring, ring_slots(config, share, first, self.slot_bytes, planned=self.ring))
        if self.owned_prompt:
            return self.chunk, ring, 0, self.group
        plan = ChunkPlan(self.chunk, self.loan_slots, self.ring)
        for g, req in self.larger:
            t, loan = prompt_loan(req, plan, tokens, ring)
            if loan <= self.loan_slots:
                return t, ring, loan, g
        t, loan = prompt_loan(self.request, plan, tokens, ring)
        return t, ring, loan, self.group

    def lines(self) -> list[str]:
        return [f"plan: budget {self.budget / MIB:,.0f} MiB = dense {self.dense / MIB:,.0f} + KV {self.kv / MIB:,.0f}"
                f" + decode {self.decode / MIB:,.0f} + expert cache {self.cache_slots} x {self.slot_bytes / MIB:.2f}"
                f" MiB" + (f" + prompt {self.prompt_bytes / MIB:,.0f} MiB" if self.owned_prompt else ""),
                f"plan: prompt chunk {self.chunk} tokens, ring {self.ring} slots, groups of {self.group} experts, "
                + (f"borrows {self.loan_slots} cache slots ({self.loan_slots * self.slot_bytes / 2**30:.2f} GiB)"
                   if not self.owned_prompt else "own buffers (every expert fits)")]


def kv_bytes(cfg, n_ctx: int) -> int:
    return cfg.n_layer * 2 * n_ctx * cfg.n_kv * 2          # fp16 K and V


def plan_memory(model, free_bytes: int, *, n_ctx: int, vram_budget: int | None = None, reserve_mib: int = 700,
                expert_cache: int | None = None, chunk: int | None = None, lend_pct: int = 90,
                groups: tuple[int, ...] = PROMPT_GROUPS) -> MemoryPlan:
    """groups: the prompt weight scratch sizes to try, largest first (the largest chunk wins, ties the largest)."""
    cfg = model.cfg
    budget = min(free_bytes, vram_budget if vram_budget else free_bytes) - reserve_mib * MIB
    slot = slot_bytes_for(model.max_blob_bytes())
    n_pairs = cfg.n_layer * cfg.n_expert
    dense, kv = dense_bytes(model), kv_bytes(cfg, n_ctx)
    ceiling = chunk or max(GRID, min(8192, n_ctx) // GRID * GRID)     # a fixed chunk may be off the grid
    decode = layout_bytes(cfg, MAXT, GROUP, attn_scratch_bytes(cfg, MAXT, n_ctx)) + ROUTED_ONLY_RING * slot
    temps = temp_bytes(cfg, ceiling)     # the dense ops' step temporaries come from the memory pool
    fixed = dense + kv + decode + temps
    avail = budget - fixed
    if avail < 0:
        raise VramShortfall(f"the model needs {fixed / MIB:,.0f} MiB of VRAM before any expert (dense "
                            f"{dense / MIB:,.0f} + KV {kv / MIB:,.0f} for {n_ctx} tokens + decode {decode / MIB:,.0f}"
                            f" + step temporaries {temps / MIB:,.0f}),"
                            f" but the budget is {budget / MIB:,.0f} MiB after a {reserve_mib} MiB reserve: "
                            f"{-avail / MIB:,.0f} MiB short (lower --ctx, or raise --vram-budget)")
    ring = ring_budget_slots(slot)

    assert groups and all(g >= 1 for g in groups), groups

    def prompt_bytes(t: int, group: int) -> int:
        return layout_bytes(cfg, t, group, attn_scratch_bytes(cfg, t, n_ctx))

    # the cache asked for (all experts by default) and the prompt path's own buffers beside it: no loan needed
    want = min(expert_cache, n_pairs) if expert_cache is not None else n_pairs
    own = prompt_bytes(ceiling, groups[0]) + ring * slot
    if avail >= want * slot + own:
        return MemoryPlan(budget + reserve_mib * MIB, dense, kv, decode + temps, slot, want, ceiling, 0, ring, own,
                          True, group=groups[0])
    slots = avail // slot if expert_cache is None else min(expert_cache, avail // slot)
    kind = PlannerKind.FIXED if chunk else PlannerKind.AUTO
    # the weight scratch competes with the chunk's rows for the loan: with a small cache a smaller scratch buys a
    # chunk several times larger (a quarter cache of qwen3-30b-a3b at 8K context: 256 tokens with 16, 768 with 8)
    best, err, reqs = None, None, []
    for g in groups:
        req = LoanRequest(cache_slots=slots, slot_bytes=slot, buffer_bytes=functools.partial(prompt_bytes, group=g),
                          ring=ring, lend_pct=lend_pct, ceiling=max(GRID, ceiling))
        reqs.append((g, req))
        try:
            cp = PLANNERS.get(kind)().plan(req)
        except PlanError as e:
            err = e                              # the last is the smallest scratch's: the least it needs
            continue
        if best is None or min(cp.chunk, ceiling) > min(best[2].chunk, ceiling):
            best = (g, req, cp)
    if best is None:
        raise VramShortfall(f"{err}; the expert cache has {slots} slots of {slot / MIB:.2f} MiB in a budget of "
                            f"{budget / MIB:,.0f} MiB") from None
    g, req, cp = best
    return MemoryPlan(budget + reserve_mib * MIB, dense, kv, decode + temps, slot, slots, min(cp.chunk, ceiling),
                      cp.loan_slots, cp.ring, cp.loan_slots * slot, False, req, group=g,
                      larger=tuple((h, r) for h, r in reqs if h > g))


def budget_holding(model, n_ctx: int, cache_slots: int, reserve_mib: int = 700) -> int:
    """The VRAM budget whose plan has room for exactly `cache_slots` expert slots beside everything else it
    needs (dense weights, KV, decode buffers and step temporaries, the reserve): what emulating a smaller card
    for a given cache size takes (the benchmarks' quarter-size caches)."""
    full = plan_memory(model, 1 << 62, n_ctx=n_ctx, reserve_mib=reserve_mib)   # those parts ignore the budget
    return full.dense + full.kv + full.decode + reserve_mib * MIB + cache_slots * full.slot_bytes
