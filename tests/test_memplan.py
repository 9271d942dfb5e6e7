"""The memory plan against the engine's own carving (SPEC §9): whatever the plan lends a prompt chunk must hold
the buffers and the ring exactly as the engine lays them out (an off-by-alignment plan once crashed an 8K
prompt on the H200: 'buffers need 2622240512 bytes, the region has 2622240384', the ring carved 128 bytes of
alignment past the all-resident engine's own prompt buffers)."""

from dataclasses import replace
from math import prod

import numpy as np
import pytest

from strata import quants
from strata.policy import Config, Share, ShareMode
from strata.policy.stream import ROUTED_ONLY_SLOTS, Walk, walk_for
from strata.accel.buffers import Carver, carve_prompt
from strata.accel.memplan import DECODE_SCRATCH, GROUP, VramShortfall, plan_memory
from strata.models import arch_module
from strata.synth.build import Synth
from strata.synth.presets import PRESETS

MIB = 2**20


class _Region:
    """A stand-in for a lent device region: only its size matters to the carver's bounds check."""

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def __getitem__(self, sl):
        return self

    def view(self, dtype):
        return self

    def reshape(self, shape):
        return None


class _Dev:
    pass


class _Info:
    def __init__(self, ne, qtype):
        self.shape, self.qtype, self.n_elements = tuple(reversed(ne)), qtype, prod(ne)


class _Tensors:
    def __init__(self, infos):
        self.infos, self.names = infos, list(infos)

    def info(self, name):
        return self.infos[name]


class _Header:
    """A preset's model as the planner sees it (config, tensor types and sizes), without writing its GGUF."""

    def __init__(self, preset: str, layers: int):
        shape = replace(PRESETS[preset], n_layer=layers)
        s = Synth(shape, 0, 0.9, True)
        self.cfg = s.cfg
        req, _ = arch_module(shape.arch).tensor_specs(self.cfg)
        self.tensors = _Tensors({n: _Info(ne, s.qtype(n)) for n, ne in req.items()})
        self._blob = [sum(quants.get(self.tensors.info(f"blk.{l}.ffn_{r}_exps.weight").qtype).row_bytes(ne[0])
                          * ne[1] for r, ne in ((r, req[f"blk.{l}.ffn_{r}_exps.weight"]) for r in ("gate", "up",
                                                                                                    "down")))
                      for l in range(layers)]

    def max_blob_bytes(self):
        return max(self._blob)


@pytest.mark.parametrize("preset", ["flash-shape", "qwen3-30b-a3b", "olmoe-1b-7b"])
@pytest.mark.parametrize("n_ctx", [1000, 4104, 8208])
def test_every_loan_holds_the_engines_carving(preset, n_ctx):
    m = _Header(preset, 8)
    seen = {True: 0, False: 0}
    full = plan_memory(m, 1 << 42, n_ctx=n_ctx, reserve_mib=0)
    fixed = full.dense + full.kv + full.decode
    for frac in list(np.linspace(0.02, 1.0, 50)) + [None]:
        budget = None if frac is None else int(fixed + frac * m.cfg.n_layer * m.cfg.n_expert * full.slot_bytes)
        try:
            p = plan_memory(m, 1 << 42, n_ctx=n_ctx, vram_budget=budget, reserve_mib=0)
        except VramShortfall:
            continue
        seen[p.owned_prompt] += 1
        # the engine's region: its own buffers (every expert fits), else the lent cache slots
        region = _Region(p.prompt_bytes if p.owned_prompt else p.loan_slots * p.slot_bytes)
        carver = Carver(_Dev(), region)
        carve_prompt(m.cfg, p.chunk, n_ctx, p.group, p.ring, p.slot_bytes, carver)   # asserts it fits
        assert carver.used <= region.nbytes
        # each prompt borrows only its own layout and its walk's ring (policy.prompt_loan): that must fit too
        # (a prompt that lays out less, or walks a smaller ring, may take a larger weight scratch than the plan's,
        # within the planned loan; a routed-only one borrows decode's scratch and a ring of up to
        # ROUTED_ONLY_SLOTS in its room, within what it would have borrowed with its own)
        cfg, off = Config(), Share(ShareMode.OFF)
        for tokens in sorted({1, 250, 1000, p.chunk - 1, p.chunk, p.chunk + 1, n_ctx} - {0}):
            layout, ring, loan, group = p.for_prompt(cfg, off, tokens)
            assert layout <= p.chunk and loan <= p.loan_slots
            routed = walk_for(cfg, off, min(p.chunk, tokens), min(p.ring, ROUTED_ONLY_SLOTS)) is Walk.ROUTED_ONLY
            if p.owned_prompt or not routed:
                assert ring <= p.ring and group >= p.group
            else:
                assert group == DECODE_SCRATCH and min(p.ring, ROUTED_ONLY_SLOTS) <= ring <= ROUTED_ONLY_SLOTS
            if not p.owned_prompt:
                carver = Carver(_Dev(), _Region(loan * p.slot_bytes))
                if group == DECODE_SCRATCH:
                    carve_prompt(m.cfg, layout, n_ctx, GROUP, ring, p.slot_bytes, carver, (None, None))
                else:
                    carve_prompt(m.cfg, layout, n_ctx, group, ring, p.slot_bytes, carver)
    assert seen[True] and seen[False], f"the sweep must reach both kinds of plan, got {seen}"


def test_the_carver_refuses_buffers_past_its_region():
    """What makes the loan tests able to fail: carving one byte past the lent region raises, alignment included."""
    c = Carver(_Dev(), _Region(1000))
    c.take((100,), np.float32)                      # [0, 400)
    c.take((100,), np.uint8)                        # aligned to 512: [512, 612)
    c.take((232,), np.uint8)                        # [768, 1000): exactly full
    assert c.used == 1000
    with pytest.raises(MemoryError, match="1025 bytes carved, the region has 1000"):
        c.take((1,), np.uint8)                      # aligned to 1024
    dry = Carver(None, _Region(10))
    assert dry.take((100,), np.float32) is None and dry.used == 400      # a dry run only counts


@pytest.mark.parametrize("preset", ["flash-shape", "qwen3-30b-a3b"])
def test_budget_holding_gives_exactly_that_cache(preset):
    """budget_holding (the benchmarks' emulated smaller card) plans exactly the cache it was asked for."""
    from strata.accel.memplan import budget_holding

    m = _Header(preset, 8)
    for frac in (0.25, 0.5):
        want = int(frac * m.cfg.n_layer * m.cfg.n_expert)
        p = plan_memory(m, 1 << 42, n_ctx=8208, vram_budget=budget_holding(m, 8208, want))
        assert p.cache_slots == want and not p.owned_prompt


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("preset", ["flash-shape", "qwen3-30b-a3b"])
def test_the_step_temporaries_are_priced_at_the_planned_chunk(preset, graphs):
    """The dense ops' step temporaries are as large as the chunk: the plan reserves them for the chunk it takes,
    the largest the loan planner still reaches with them reserved (priced at the 8,192-token ceiling, qwen3-30b-a3b's
    quarter cache kept ~870 MiB idle, about 340 cache slots). One grid step more does not plan. With prompt graphs
    the temporaries are their regions and fixed inputs (graph_temp_bytes), without them the pool's (temp_bytes)."""
    from strata.accel.memplan import _temps, budget_holding
    from strata.policy.plan import GRID

    temp_bytes = _temps(graphs)
    m = _Header(preset, 8)
    quarter = m.cfg.n_layer * m.cfg.n_expert // 4
    budget = budget_holding(m, 8208, quarter, graphs=graphs)
    p = plan_memory(m, 1 << 42, n_ctx=8208, vram_budget=budget, graphs=graphs)
    full = plan_memory(m, 1 << 42, n_ctx=8208, graphs=graphs)       # owns its buffers: temporaries at the ceiling
    decode_only = full.decode - temp_bytes(m.cfg, 8192)
    assert p.chunk < 8192 and p.decode == decode_only + temp_bytes(m.cfg, p.chunk)
    assert p.dense + p.kv + p.decode + p.cache_slots * p.slot_bytes + 700 * MIB <= budget
    slots_then = (budget - 700 * MIB - p.dense - p.kv - full.decode) // p.slot_bytes
    assert p.cache_slots == quarter and slots_then < quarter - 50
    # the next grid step's temporaries leave too few slots for its own chunk
    from strata.accel.memplan import PROMPT_GROUPS, _loan_plan, _parts
    from strata.policy import PlannerKind

    parts = _parts(m, 8208, None)
    room = budget - 700 * MIB - parts.dense - parts.kv - parts.decode - temp_bytes(m.cfg, p.chunk + GRID)
    slots = room // p.slot_bytes
    assert _loan_plan(parts, slots, p.chunk + GRID, 90, PROMPT_GROUPS, PlannerKind.AUTO)[2].chunk < p.chunk + GRID


def test_a_chunk_that_cannot_plan_says_what_it_lacks():
    """A fixed chunk (--chunk) is planned with its own step temporaries; when its loan does not fit, the error names
    the cache that chunk leaves, not a smaller chunk's; with no fixed chunk the error is the smallest chunk's."""
    from strata.accel.prompt_graph import graph_temp_bytes as temp_bytes     # the default: prompt graphs
    from strata.accel.memplan import budget_holding

    m = _Header("qwen3-30b-a3b", 8)
    budget = budget_holding(m, 8208, m.cfg.n_layer * m.cfg.n_expert // 4)
    for chunk in (8192, 1280):
        with pytest.raises(VramShortfall) as e:
            plan_memory(m, 1 << 42, n_ctx=8208, vram_budget=budget, chunk=chunk)
        full = plan_memory(m, 1 << 42, n_ctx=8208)
        decode_only = full.decode - temp_bytes(m.cfg, 8192)
        room = budget - 700 * MIB - full.dense - full.kv - decode_only - temp_bytes(m.cfg, chunk)
        assert f"the expert cache has {max(0, room // full.slot_bytes)} slots" in str(e.value)
    with pytest.raises(VramShortfall, match="MiB short"):
        plan_memory(m, 1 << 42, n_ctx=8208, vram_budget=budget - 300 * full.slot_bytes)


def test_a_tight_loan_trades_the_weight_scratch_for_a_larger_chunk():
    """The prompt's weight scratch (experts a launch group dequantises) competes with the chunk's rows for the
    loan: with a quarter cache of qwen3-30b-a3b the 16-expert scratch leaves room for 768 tokens, the 8-expert one
    for 1,280 (head size 128: the one-pass attention needs no score buffers); the plan takes the largest chunk over
    the scratch sizes (ties: the larger scratch), and the engine's carving of that group size fits the loan."""
    from strata.accel.memplan import PROMPT_GROUPS, budget_holding

    m = _Header("qwen3-30b-a3b", 8)
    quarter = m.cfg.n_layer * m.cfg.n_expert // 4
    budget = budget_holding(m, 8208, quarter)
    # the same cache (a 768-token chunk's step temporaries are smaller than a 1,280-token one's: room to spare)
    only16 = plan_memory(m, 1 << 42, n_ctx=8208, vram_budget=budget + 400 * MIB, groups=(16,), expert_cache=quarter)
    p = plan_memory(m, 1 << 42, n_ctx=8208, vram_budget=budget)
    assert only16.group == 16 and only16.chunk == 768
    assert p.group in PROMPT_GROUPS and p.group < 16 and p.chunk >= 1.5 * only16.chunk
    assert p.cache_slots == only16.cache_slots and p.loan_slots <= only16.loan_slots
    carver = Carver(_Dev(), _Region(p.loan_slots * p.slot_bytes))
    carve_prompt(m.cfg, p.chunk, 8208, p.group, p.ring, p.slot_bytes, carver)
    # a 250-token prompt lays out 256 tokens: the 16-expert scratch fits the planned loan again (a prompt carving
    # its own scratch: rows=None)
    own = replace(p, rows=None)
    layout, ring, loan, group = own.for_prompt(Config(), Share(ShareMode.OFF), 250)
    assert (layout, group) == (256, 16) and loan <= p.loan_slots
    assert own.for_prompt(Config(), Share(ShareMode.OFF), 1000)[3] == p.group
    # walking routed-only, both borrow decode's scratch instead and give its room to the ring, within that loan
    for tokens in (250, 1000):
        o = own.for_prompt(Config(), Share(ShareMode.OFF), tokens)
        layout, ring, loan, group = p.for_prompt(Config(), Share(ShareMode.OFF), tokens)
        assert group == DECODE_SCRATCH and layout == o[0] and o[1] < ring <= ROUTED_ONLY_SLOTS and loan <= o[2]
    # each size on its own plans the chunk the choice compares; no smaller scratch would plan a larger one
    for g in PROMPT_GROUPS:
        one = plan_memory(m, 1 << 42, n_ctx=8208, vram_budget=budget + 400 * MIB, groups=(g,), expert_cache=quarter)
        assert one.chunk <= p.chunk
    # where the 16-expert scratch already reaches the ceiling, it stays
    half = budget_holding(m, 1000, m.cfg.n_layer * m.cfg.n_expert // 2)
    roomy = plan_memory(m, 1 << 42, n_ctx=1000, vram_budget=half)
    assert roomy.chunk == 768 and roomy.group == 16 and not roomy.owned_prompt
