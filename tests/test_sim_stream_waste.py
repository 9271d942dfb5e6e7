"""The simulated prefill takes the engine's walk choice (policy.StreamWaste, GpuEngine._prompt_chunk): a chunk that
SPEC §3 sends down the stream-all walk takes the routed-only walk while the last stream-all chunk left more than
STREAM_ALL_WASTE_MAX of its queue unrouted; the original's engine (the seeds' machines, mmq) had no such rule.

Scenario: 2 layers of 8 experts, top-2, e0 resident in each layer (7 queue entries a layer, 14 a chunk), chunks
of 1,024 tokens (stream_all_min with the share off), a ring of 16. Skewed routing: every token picks two of
e0-e2, so 5 of 7 entries a layer are streamed unrouted (71%); dense: tokens spread over all 8.
"""

import numpy as np
import pytest

from sim.engine import Run, Session, prefill
from sim.hardware import machine
from sim.models import SimModel
from sim.workload import TraceRouting
from strata.policy import Config, Walk, share_policy
from strata.policy.stream import STREAM_ALL_PROBE
from strata.synth.presets import ModelShape

SHAPE = ModelShape("qwen3moe", 2, 64, 2, 1, 32, 8, 2, 32, 100)
CHUNK, RING = 1024, 16
S, R = Walk.STREAM_ALL, Walk.ROUTED_ONLY


# fmt: off
class FixedCosts:   # µs; only the walk choice matters here
    by_issue = False   # host_issue_us a streamed expert, one copy a blob (sim/costs.py Costs.by_issue)
    def blob(self, l): return 1000
    def dense_us(self, t, ctx): return 100.0
    def combine_us(self, t): return 10.0
    def grouped_us(self, l, counts): return 10.0 + 5.0 * len(counts)
    def host_issue_us(self, busy): return 30.0
    def copy_us(self, nbytes, busy): return 40.0
    def sync_us(self): return 5.0
    def group_us(self, t): return 0.0
    def head_us(self): return 0.0
# fmt: on


class Routing(TraceRouting):   # a trace over all E experts, whichever ids it holds
    E = 8

    def counts(self, layer, start, t):
        return np.bincount(self.ids[layer, start:start + t].ravel(), minlength=self.E)


def routing(tokens: int, skewed: bool) -> Routing:
    """Token i routes to (i, i+1) mod 3 (skewed) or mod 8 (dense), in both layers."""
    n = 3 if skewed else 8
    one = np.stack([np.arange(tokens) % n, (np.arange(tokens) + 1) % n], axis=1)
    return Routing(np.stack([one, one]))


def prompt(machine_name: str, chunks: int, skewed: bool, session=None, cfg=Config(cpu_share=0.0),
           costs=FixedCosts(), **kw):
    resident = tuple(tuple(e == 0 for e in range(8)) for _ in range(2))
    kw.setdefault("layer_major", False)     # chunk by chunk: the walk choice under test (sim/layer_major.py apart)
    r = Run(machine(machine_name), SimModel("tiny", SHAPE), chunks * CHUNK, cfg, cache_slots=200_000,
            routing=routing(chunks * CHUNK, skewed), costs=costs, residency=resident, plan=(CHUNK, RING), **kw)
    session = session or Session(share_policy(r.share, r.gated))
    return prefill(r, session), session


def walks(result) -> list[Walk]:
    return [w for _, _, w in result.chunks]


def test_skewed_routing_leaves_stream_all_after_one_chunk():
    r, session = prompt("h200-host16", 3, skewed=True)
    assert walks(r) == [S, R, R]
    assert session.waste.waste == pytest.approx(10 / 14)
    # the state outlives the prompt, as the engine's: the next prompt starts on the routed-only walk
    r2, _ = prompt("h200-host16", 2, skewed=True, session=session)
    assert walks(r2) == [R, R]


def test_a_refused_chunk_counts_the_waste_and_never_probes():
    r, session = prompt("h200-host16", STREAM_ALL_PROBE + 2, skewed=True)
    assert walks(r) == [S] + [R] * (STREAM_ALL_PROBE + 1)
    assert session.waste.waste == pytest.approx(10 / 14)      # each refused chunk counted it again from its routing


def test_routing_turned_dense_takes_stream_all_at_the_next_chunk():
    """A skewed chunk, then dense ones: the first dense chunk is refused (the last count was wasteful) and counts
    its own routing dense, so the one after it takes stream-all again."""
    class Switch(Routing):   # chunk 0 skewed, the rest dense
        def counts(self, layer, start, t):
            return np.bincount((skew if start == 0 else dense).ids[layer, start:start + t].ravel(), minlength=8)

    skew, dense = routing(3 * CHUNK, True), routing(3 * CHUNK, False)
    resident = tuple(tuple(e == 0 for e in range(8)) for _ in range(2))
    r = Run(machine("h200-host16"), SimModel("tiny", SHAPE), 3 * CHUNK, Config(cpu_share=0.0),
            cache_slots=200_000, routing=Switch(skew.ids), costs=FixedCosts(), residency=resident, plan=(CHUNK, RING),
            layer_major=False)
    session = Session(share_policy(r.share, r.gated))
    assert walks(prefill(r, session)) == [S, R, S]
    assert session.waste.waste == 0.0


def test_the_stored_engines_probed_every_probe_th_refusal():
    from strata.policy import StreamWaste

    _, session = prompt("h200-host16", 1, skewed=False)
    session.waste = StreamWaste(counted=False)
    r, _ = prompt("h200-host16", STREAM_ALL_PROBE + 2, skewed=True, session=session)
    assert walks(r) == [S] + [R] * (STREAM_ALL_PROBE - 1) + [S, R]


def test_dense_routing_keeps_stream_all():
    r, session = prompt("h200-host16", 3, skewed=False)
    assert walks(r) == [S, S, S]
    assert session.waste.waste == 0.0


def test_the_original_engine_streams_everything():
    # the seeds measured the original, which queued every chunk from stream_all_min (prefill.cpp)
    r, _ = prompt("rtx4090-7950x", 3, skewed=True)
    assert walks(r) == [S, S, S]
    r, _ = prompt("rtx4090-7950x", 3, skewed=True, stream_waste=True)
    assert walks(r) == [S, R, R]


def test_a_refused_chunk_does_not_share():
    # SPEC §4: the share keeps to the chunks SPEC §3 sends down the routed-only walk, refused ones included
    # (the catalogue's costs: the share's path needs the CPU's)
    r, _ = prompt("h200-host16", 3, skewed=True, cfg=Config(cpu_share=0.5, cpu_share_max=CHUNK), costs=None)
    assert walks(r) == [S, R, R] and r.n_cpu == 0 and r.layer_shares == []
