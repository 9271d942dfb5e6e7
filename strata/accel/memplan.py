"""The VRAM plan at start (SPEC §9): dense weights, KV, decode-only resources and the expert cache from the
device's free memory (or `--vram-budget`), and the prompt plan (chunk, loan, ring) from `strata.policy`.
Fails early, saying the shortfall, rather than at the first prompt.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from strata import policy
from strata.accel.buffers import attn_scratch_bytes, decode_scores_bytes, layout_bytes, temp_bytes
from strata.accel.cache import slot_bytes_for
from strata.accel.dense import dense_bytes
from strata.accel.prompt_graph import graph_temp_bytes
from strata.policy.plan import GRID, PLANNERS, ChunkPlan, LoanRequest, Planner, PlanError, PlannerKind, prompt_loan
from strata.policy.stream import ROUTED_ONLY_RING, ROUTED_ONLY_SLOTS, Walk, ring_budget_slots, ring_slots, walk_for

MIB = 2**20
RESERVE_MIB = 700             # VRAM left to others by default (the CUDA context, a display): --vram-reserve-mib
MAXT = policy.MAXT             # decode steps carry up to MAXT tokens (speculative verification)
GROUP = 16                     # experts per launch group: decode's weight scratch, and a prompt's when room allows
DECODE_SCRATCH = 0             # for_prompt's group when the prompt borrows decode's weight scratch (GROUP experts)
PROMPT_GROUPS = (16, 8)        # a prompt's weight scratch, largest first: the plan takes the largest chunk, then
                               # the largest group. Not 4: qwen3-30b-a3b's quarter cache then plans 1024-token
                               # chunks that walk stream-all through a 24-slot ring in groups of 4, 1.2-1.3x slower
                               # at 2K and 8K than 768-token chunks in groups of 8 (prefill_q8_groups_stop16.log)


class VramShortfall(RuntimeError):
    pass


def scratch_group(group: int) -> int:
    """The experts of a prompt's weight scratch: for_prompt's group, DECODE_SCRATCH read as decode's GROUP."""
    return GROUP if group == DECODE_SCRATCH else group


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
    rows: LoanRequest | None = None      # the request's layout without a weight scratch (decode's borrowed)

    def for_prompt(self, config, share, tokens: int) -> tuple[int, int, int, int]:
        """(layout chunk, ring slots, loan slots, group) of a prompt of `tokens`: its first chunk's walk sets the
        ring (the planned ring), and it borrows only what it lays out (policy.prompt_loan); the plan's chunk and
        ring when the prompt owns its buffers. A prompt shorter than the chunk takes the largest weight scratch
        whose layout still fits the planned loan (fewer, fuller launches: qwen3-30b-a3b's quarter cache at 250
        tokens, 42.4 ms in groups of 16 against 48.2 in groups of 4, prefill_q8_groups_stop16.log). A prompt whose
        first chunk walks routed-only takes decode's weight scratch instead (group DECODE_SCRATCH: GROUP experts)
        and a ring of up to policy.ROUTED_ONLY_SLOTS in the room that leaves, borrowing at most what it would
        have borrowed with a scratch of its own."""
        first = min(self.chunk, tokens)
        ring = min(self.ring, ring_slots(config, share, first, self.slot_bytes, planned=self.ring))
        if self.owned_prompt:
            return self.chunk, ring, 0, self.group
        plan = ChunkPlan(self.chunk, self.loan_slots, self.ring)
        for g, req in self.larger:
            t, loan = prompt_loan(req, plan, tokens, ring)
            if loan <= self.loan_slots:
                break
        else:
            g, (t, loan) = self.group, prompt_loan(self.request, plan, tokens, ring)
        if self.rows is not None and walk_for(config, share, first, ring) is Walk.ROUTED_ONLY:
            # a routed-only prompt borrows decode's weight scratch (idle while a prompt runs, as a layer-major
            # prompt does) and gives the room to the ring, within the loan it would take with a scratch of its own:
            # the next layer's guesses and the copies ahead of the groups wait less for slots. On the H200: qwen3's
            # quarter cache 1.07-1.09x faster at 250-900 tokens, rings of 47-64 slots in place of 18 on a loan no
            # larger (bench/decode_scratch_ab.py, bench/results/h200/ab_dscratch_q8_stop38.log)
            lay = Planner.loan_for(self.rows, t, 0)
            wide = max(ring, min(ROUTED_ONLY_SLOTS, loan - lay))
            return t, wide, lay + wide, DECODE_SCRATCH
        return t, ring, loan, g

    def lines(self) -> list[str]:
        return [f"plan: budget {self.budget / MIB:,.0f} MiB = dense {self.dense / MIB:,.0f} + KV {self.kv / MIB:,.0f}"
                f" + decode {self.decode / MIB:,.0f} + expert cache {self.cache_slots} x {self.slot_bytes / MIB:.2f}"
                f" MiB" + (f" + prompt {self.prompt_bytes / MIB:,.0f} MiB" if self.owned_prompt else ""),
                f"plan: prompt chunk {self.chunk} tokens, ring {self.ring} slots, groups of {self.group} experts, "
                + (f"borrows {self.loan_slots} cache slots ({self.loan_slots * self.slot_bytes / 2**30:.2f} GiB)"
                   if not self.owned_prompt else "own buffers (every expert fits)")]


def kv_bytes(cfg, n_ctx: int) -> int:
    return cfg.n_layer * 2 * n_ctx * cfg.n_kv * 2          # fp16 K and V


def plan_memory(model, free_bytes: int, *, n_ctx: int, vram_budget: int | None = None, reserve_mib: int = RESERVE_MIB,
                expert_cache: int | None = None, chunk: int | None = None, lend_pct: int = 90,
                groups: tuple[int, ...] = PROMPT_GROUPS, graphs: bool = True) -> MemoryPlan:
    """groups: the prompt weight scratch sizes to try, largest first (the largest chunk wins, ties the largest).
    graphs: the prompt's dense parts run as captured segments (prompt_graph.py), whose temporaries are priced by
    `graph_temp_bytes`, not the memory pool's `temp_bytes`.
    The dense ops' step temporaries are priced at the chunk the plan takes: the largest chunk that still plans
    itself with its own temporaries reserved (priced at the 8,192-token ceiling, qwen3-30b-a3b's quarter cache at
    8K context kept 1.07 GB for a 1,280-token chunk's 0.17, about 350 cache slots)."""
    cfg = model.cfg
    temps_of = _temps(graphs)
    budget = min(free_bytes, vram_budget if vram_budget else free_bytes) - reserve_mib * MIB
    b = _parts(model, n_ctx, chunk)
    slot, ceiling, decode = b.slot, b.ceiling, b.decode
    base = b.dense + b.kv + decode
    least = temps_of(cfg, min(GRID, ceiling))          # what the smallest chunk's temporaries take
    if budget - base - least < 0:
        need = base + least
        raise VramShortfall(f"the model needs {need / MIB:,.0f} MiB of VRAM before any expert (dense "
                            f"{b.dense / MIB:,.0f} + KV {b.kv / MIB:,.0f} for {n_ctx} tokens + decode "
                            f"{decode / MIB:,.0f} + step temporaries {least / MIB:,.0f}),"
                            f" but the budget is {budget / MIB:,.0f} MiB after a {reserve_mib} MiB reserve: "
                            f"{(need - budget) / MIB:,.0f} MiB short (lower --ctx, or raise --vram-budget)")
    assert groups and all(g >= 1 for g in groups), groups
    # the cache asked for (all experts by default) and the prompt path's own buffers beside it: no loan needed
    n_pairs = cfg.n_layer * cfg.n_expert
    want = min(expert_cache, n_pairs) if expert_cache is not None else n_pairs
    temps = temps_of(cfg, ceiling)
    own = b.prompt_bytes(ceiling, groups[0]) + b.ring * slot
    if budget - base - temps >= want * slot + own:
        return MemoryPlan(budget + reserve_mib * MIB, b.dense, b.kv, decode + temps, slot, want, ceiling, 0, b.ring,
                          own, True, group=groups[0])
    # a chunk's temporaries shrink the cache its loan comes from: the plan takes the largest chunk c that the loan
    # planner still reaches with c's temporaries reserved. Reaching is monotone (a smaller c frees slots, and more
    # slots never plan a smaller chunk), so a binary search over the grid finds it. A fixed chunk prices its own.
    kind = PlannerKind.FIXED if chunk else PlannerKind.AUTO

    def attempt(cap: int):
        temps = temps_of(cfg, cap)
        avail = budget - base - temps
        slots = avail // slot if expert_cache is None else min(expert_cache, avail // slot)
        if slots < 0:
            raise PlanError(f"the step temporaries of a {cap}-token chunk leave no room for the expert cache")
        return (temps, slots) + _loan_plan(b, slots, b.ceiling if kind is PlannerKind.AUTO else cap, lend_pct,
                                           groups, kind)

    def reaches(cap: int):
        """(plan parts, None) when a chunk of `cap` plans with its own temporaries reserved, else (None, why)."""
        try:
            got = attempt(cap)
        except PlanError as e:
            return None, e
        if kind is PlannerKind.AUTO and got[4].chunk < cap:
            return None, None
        return got, None

    if kind is PlannerKind.FIXED:
        cap = ceiling
        got, err = reaches(ceiling)
    else:                       # the smallest grid chunk's failure is the least the prompt path needs
        lo, hi, cap, got = 1, max(1, ceiling // GRID), None, None
        err = reaches(GRID)[1]
        while lo <= hi and err is None:
            mid = (lo + hi) // 2
            r, _ = reaches(mid * GRID)
            if r is not None:
                lo, cap, got = mid + 1, mid * GRID, r
            else:
                hi = mid - 1
    if got is None:
        avail = budget - base - temps_of(cfg, cap if kind is PlannerKind.FIXED else min(GRID, ceiling))
        raise VramShortfall(f"{err}; the expert cache has {max(0, avail // slot)} slots of {slot / MIB:.2f} MiB "
                            f"in a budget of {budget / MIB:,.0f} MiB")
    temps, slots, g, req, cp, reqs = got
    if kind is PlannerKind.AUTO:                  # the plan capped at the chunk its temporaries were priced for
        g, req, cp, reqs = _loan_plan(b, slots, cap, lend_pct, groups, kind)
    return MemoryPlan(budget + reserve_mib * MIB, b.dense, b.kv, decode + temps, slot, slots, min(cp.chunk, cap),
                      cp.loan_slots, cp.ring, cp.loan_slots * slot, False, req, group=g,
                      larger=tuple((h, r) for h, r in reqs if h > g),
                      rows=dataclasses.replace(req, buffer_bytes=b.rows_bytes))


@dataclass(frozen=True)
class _Parts:
    """What a plan needs besides the cache, independent of the budget."""

    cfg: object
    n_ctx: int
    dense: int
    kv: int
    decode: int              # decode-only buffers and ring (its step temporaries are priced with the chunk's)
    slot: int
    ceiling: int             # the largest chunk considered (a fixed chunk may be off the grid)
    ring: int                # the byte-budget ring

    def prompt_bytes(self, t: int, group: int) -> int:
        return layout_bytes(self.cfg, t, group, attn_scratch_bytes(self.cfg, t, self.n_ctx))

    def rows_bytes(self, t: int) -> int:
        """prompt_bytes without a weight scratch: a prompt that borrows decode's."""
        return layout_bytes(self.cfg, t, GROUP, attn_scratch_bytes(self.cfg, t, self.n_ctx), weights=False)


def _parts(model, n_ctx: int, chunk: int | None) -> _Parts:
    cfg = model.cfg
    slot = slot_bytes_for(model.max_blob_bytes())
    decode = (layout_bytes(cfg, MAXT, GROUP, attn_scratch_bytes(cfg, MAXT, n_ctx)) + ROUTED_ONLY_RING * slot
              + decode_scores_bytes(cfg, n_ctx))
    return _Parts(cfg, n_ctx, dense_bytes(model), kv_bytes(cfg, n_ctx), decode, slot,
                  chunk or max(GRID, min(8192, n_ctx) // GRID * GRID), ring_budget_slots(slot))


def _loan_plan(b: _Parts, slots: int, ceiling: int, lend_pct: int, groups, kind):
    """(group, LoanRequest, ChunkPlan, every group's request) of the largest chunk up to `ceiling` over the weight
    scratch sizes: it competes with the chunk's rows for the loan, and with a small cache a smaller scratch buys a
    chunk several times larger (a quarter cache of qwen3-30b-a3b at 8K context: 256 tokens with 16, 768 with 8).
    Raises the smallest scratch's PlanError when none plans."""
    best, err, reqs = None, None, []
    for g in groups:
        req = LoanRequest(cache_slots=slots, slot_bytes=b.slot, buffer_bytes=functools.partial(b.prompt_bytes, group=g),
                          ring=b.ring, lend_pct=lend_pct, ceiling=max(GRID, ceiling))
        reqs.append((g, req))
        try:
            cp = PLANNERS.get(kind)().plan(req)
        except PlanError as e:
            err = e                              # the last is the smallest scratch's: the least it needs
            continue
        if best is None or min(cp.chunk, ceiling) > min(best[2].chunk, ceiling):
            best = (g, req, cp)
    if best is None:
        raise err
    return best + (reqs,)


def _temps(graphs: bool):
    """A chunk's step temporaries, (cfg, tokens) -> bytes: with prompt graphs or without."""
    return graph_temp_bytes if graphs else temp_bytes


def budget_holding(model, n_ctx: int, cache_slots: int, reserve_mib: int = RESERVE_MIB, graphs: bool = True) -> int:
    """The VRAM budget whose plan has room for exactly `cache_slots` expert slots beside everything else it
    needs (dense weights, KV, decode buffers, the step temporaries of the chunk such a cache plans, the reserve):
    what emulating a smaller card for a given cache size takes (the benchmarks' quarter-size caches)."""
    b = _parts(model, n_ctx, None)
    try:
        _, _, cp, _ = _loan_plan(b, cache_slots, b.ceiling, 90, PROMPT_GROUPS, PlannerKind.AUTO)
    except PlanError as e:
        raise VramShortfall(f"{e}: a cache of {cache_slots} slots cannot lend a prompt its buffers") from None
    temps = _temps(graphs)(model.cfg, min(cp.chunk, b.ceiling))
    return b.dense + b.kv + b.decode + temps + reserve_mib * MIB + cache_slots * b.slot
