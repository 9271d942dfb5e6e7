"""A routed-only prompt on decode's weight scratch (memplan.for_prompt, group DECODE_SCRATCH): the room its own
scratch took goes to the ring, within the loan it would have taken. Oracle: the same prompts on an engine whose
plan carves the prompt's own scratch (rows=None, the code before): the logits keep their bits, the loan is no
larger, the ring no smaller."""

import dataclasses

import numpy as np
import pytest

from strata import models, policy
from strata.reference import golden
from tests.test_accel_engine import _devices, device_of


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_decode_scratch_keeps_the_bits(kind, name):
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import DECODE_SCRATCH, budget_holding
    from strata.policy.plan import Planner
    from strata.policy.stream import ROUTED_ONLY_SLOTS

    m = models.load(golden.model_path(name))
    c = m.cfg
    n_ctx = 300
    prompts = [[(5 * i + 2 + 13 * j) % c.n_vocab for i in range(n)] for j, n in enumerate((7, 40, 250))]
    outs, shapes = {}, {}
    for own in (False, True):
        with device_of(kind) as dev:
            e = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget_holding(m, n_ctx, 400),
                          config=policy.Config(cpu_share=0.0))
            assert not e.plan.owned_prompt and e.plan.rows is not None
            rows = e.plan.rows
            if own:
                e.plan = dataclasses.replace(e.plan, rows=None)
            outs[own], shapes[own] = [], []
            for p in prompts:                    # prefill_each's loop, each prompt's loan checked as it ends
                e.reset()
                outs[own].append(e.prefill(p))
                shapes[own].append(e.plan.for_prompt(e.config, e.share, len(p)))
                assert e.stats.loan_slots == shapes[own][-1][2] and e.cache.lent == 0
            assert all(w == "routed-only" for _, w, _ in e.stats.chunks)
    for i, (a, b) in enumerate(zip(outs[False], outs[True])):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"prompt {i}"
    for (t, ring, loan, group), (t0, ring0, loan0, group0) in zip(shapes[False], shapes[True]):
        assert group == DECODE_SCRATCH and group0 != DECODE_SCRATCH and t == t0
        lay = Planner.loan_for(rows, t, 0)                     # its rows alone: what the scratch left to the ring
        assert ring == max(ring0, min(ROUTED_ONLY_SLOTS, loan0 - lay)) and loan == lay + ring <= loan0
