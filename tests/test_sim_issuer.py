"""The simulated stream-all walk issues its copies as the engine thread does (strata/accel/stream.py Walk.prefetch):
a copy run never reaches past the watermark (entry k goes once every entry below k - R was consumed). Runs fixed in
advance once reached into the slots of their own launch group and stalled the walk: the qwen3-30b-a3b run of
stop 21 (a ring of 18, groups of 8) stopped bench/cpu_share.py's simulator column.

Scenario: one layer of 64 experts, none resident (64 queue entries), a ring of 18, groups of 8. Tokens route to
e0-e7 and to e15, e26: the walk's second group is (e15, e26), whose span (11) fits the ring, while a run of 8 from
e26 reaches e33, whose slot is e15's.
"""

import numpy as np
import pytest

from sim.engine import Run, Session, prefill
from sim.hardware import machine
from sim.models import SimModel
from strata.policy import Config, Walk, share_policy
from strata.policy.stream import walk_runs
from strata.synth.presets import ModelShape
from tests.test_sim_stream_waste import FixedCosts as WalkCosts
from tests.test_sim_stream_waste import Routing as AllExperts

SHAPE = ModelShape("qwen3moe", 1, 64, 2, 1, 32, 64, 2, 32, 100)
CHUNK, RING, GROUP = 1024, 18, 8
ROUTED = [0, 1, 2, 3, 4, 5, 6, 7, 15, 26]


class FixedCosts(WalkCosts):   # µs; the copies go by run, as the engine issues them (sim/costs.py Costs.by_issue)
    by_issue = True

    def host_group_us(self, busy):
        return 5.0

    def host_copy_us(self, busy, event):
        return 8.0

    def copy_run_us(self, nbytes, count, busy):
        return 40.0 * count


class Routing(AllExperts):
    E = 64


def test_the_scenario_has_a_group_a_fixed_run_would_stall():
    groups = walk_runs(ROUTED, GROUP, RING)
    assert groups == [ROUTED[:8], [15, 26]]
    assert 26 + GROUP - 1 - RING >= 15   # a run of a group's worth from e26 needs e15's slot


def test_stream_all_walk_with_a_group_spanning_most_of_the_ring_completes():
    ids = np.array([[ROUTED[i % len(ROUTED)], ROUTED[(i + 1) % len(ROUTED)]] for i in range(CHUNK)])
    r = Run(machine("h200-host16"), SimModel("tiny", SHAPE), CHUNK, Config(cpu_share=0.0), cache_slots=200_000,
            routing=Routing(ids[None]), costs=FixedCosts(), residency=((False,) * 64,),
            plan=(CHUNK, RING, GROUP))
    res = prefill(r, Session(share_policy(r.share, r.gated)))
    assert [w for _, _, w in res.chunks] == [Walk.STREAM_ALL]
    assert res.n_streamed == 64   # every entry, routed or not, went through the ring once
    # the walk's own work bounds it: 64 copies of 40 µs on one link
    assert res.prompt_ms * 1e3 >= 64 * 40.0


def _prompt(**kw):
    ids = np.array([[ROUTED[i % len(ROUTED)], ROUTED[(i + 1) % len(ROUTED)]] for i in range(CHUNK)])
    r = Run(machine("h200-host16"), SimModel("tiny", SHAPE), CHUNK, Config(cpu_share=0.0), cache_slots=200_000,
            routing=Routing(ids[None]), costs=FixedCosts(), residency=((False,) * 64,), plan=(CHUNK, RING, GROUP),
            **kw)
    return prefill(r, Session(share_policy(r.share, r.gated)))


def test_the_loans_refill_is_host_time_at_the_prompts_end():
    """GpuEngine._give_back issues the lent slots' refill after the logits' readback: the prompt ends that much
    later (Machine.host_refill_us a copy: one a slot, or Run.refill_copies, the runs today's engine copies;
    Run.refill_factor for engines before d7467e0)."""
    h200 = machine("h200-host16")
    base = _prompt().prompt_ms
    assert _prompt(loan=100).prompt_ms - base == pytest.approx(100 * h200.host_refill_us / 1e3)
    assert _prompt(loan=100, refill_factor=2.0).prompt_ms - base == pytest.approx(200 * h200.host_refill_us / 1e3)
    assert _prompt(loan=100, refill_copies=11).prompt_ms - base == pytest.approx(11 * h200.host_refill_us / 1e3)


def test_the_embeddings_upload_behind_the_first_copies_holds_layer_0_back():
    """Before a7c891c a stream-all chunk's first prefetch went before the embedding's upload, which queued behind
    the ring's first copies on the copy engine: the layer's compute starts after them (here 18 copies of 40 us)."""
    now, before = _prompt(), _prompt(embed_behind_prefetch=True)
    assert before.prompt_ms > now.prompt_ms
    assert before.n_streamed == now.n_streamed == 64


def test_share_sim_counts_the_engines_refill_copies():
    """bench/share_sim.py engine_refill_copies: the lent tail sorted into runs of a layer's neighbouring experts
    (strata.accel.cache.refill_runs), as the engine copies them since ac18e97; the tail the slots by layer
    (cache.by_layer, stop 39) or, for the stored engines, in the uniform fill's order."""
    import os
    import sys
    from types import SimpleNamespace

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    from share_sim import engine_refill_copies

    cfg = SimpleNamespace(n_layer=8, n_expert=128)
    # by layer: the last layers' residents, experts 0..31 of layers 4..7, a run a layer (one batch of 32 each)
    assert engine_refill_copies(cfg, 256, 128) == 4
    assert engine_refill_copies(cfg, 256, 7) == 1          # layer 7's experts 25..31
    assert engine_refill_copies(cfg, 256, 92) == 5         # layer 5's last 28, then 6 and 7, cut at 32 and 64
    assert engine_refill_copies(cfg, 256, 128, by_layer=False) == 8      # experts 16..31 of each layer
    for by_layer in (True, False):
        assert engine_refill_copies(cfg, 256, 0, by_layer) == 0
    for loan in (1, 7, 92, 124, 200):                      # a run a layer at most, cut at each event's 32 slots
        n = engine_refill_copies(cfg, 256, loan, by_layer=False)
        assert min(loan, 8) <= n <= min(loan, 8 + -(-loan // 32) - 1), (loan, n)
