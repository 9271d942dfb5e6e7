"""Whole timelines of the simulated engine (STYLE 14) on a 2-layer, 8-expert model with fixed durations.

Scenario constants (µs): attention 100, routing sync 5, grouping 0, a group of experts on the GPU 10 + 5 an
expert, a copy 40 (80 while the CPU pool is busy), host issue 30 (60 while busy), input D2H 15, CPU rows
H2D 5, CPU pool 50 an expert, combine 10. Routing (4 tokens, top-2): layer 0 routes e0 x3, e1 x2,
e2-e4 x1; layer 1 e5 x3, e6 x2, e7 x2, e0 x1. Three experts resident, hottest of the profile first:
(0, e0), (1, e5), (0, e1). Each (name, start) pair is logged when its op ends. The machine picks the launch
groups: rtx4090-7950x the original's (calib gpu_experts mmq), h200-host16 this engine's (sim/walks.py).
"""

import numpy as np
import pytest

from sim.engine import Run, prefill
from sim.hardware import machine
from sim.models import SimModel
from sim.workload import TraceRouting
from strata.policy import Config
from strata.synth.presets import ModelShape

SHAPE = ModelShape("qwen3moe", 2, 64, 2, 1, 32, 8, 2, 32, 100)
IDS = np.array([[[0, 1], [0, 2], [0, 3], [1, 4]], [[5, 6], [5, 7], [6, 7], [5, 0]]])


# fmt: off
class FixedCosts:
    by_issue = False   # host_issue_us a streamed expert, one copy a blob (sim/costs.py Costs.by_issue)
    def __init__(self, model):
        self.model = model

    def blob(self, l): return 1000
    def dense_us(self, t, ctx): return 100.0
    def combine_us(self, t): return 10.0
    def grouped_us(self, l, counts): return 10.0 + 5.0 * len(counts)
    def host_issue_us(self, busy): return 60.0 if busy else 30.0
    def copy_us(self, nbytes, busy): return 80.0 if busy else 40.0
    def sync_us(self): return 5.0
    def group_us(self, t): return 0.0
    def input_d2h_us(self, t): return 15.0
    def rows_h2d_us(self, rows): return 5.0
    def pin_us(self, nbytes): return 0.0
    def cpu_pool_us(self, l, counts): return 50.0 * len(counts)
    def head_us(self): return 0.0
# fmt: on


def run(cfg, machine_name="rtx4090-7950x"):   # a seed-era machine: the original's launch groups (mmq)
    model = SimModel("tiny", SHAPE)
    r = Run(
        machine(machine_name),
        model,
        4,
        cfg,
        cache_slots=200_000,
        routing=TraceRouting(IDS),
        costs=FixedCosts(model),
        resident=3,
        timeline=True,
    )
    return prefill(r)


def test_routed_only_off():
    # the walk in id order: one group e0 e1 (resident) e2 e3 e4 (streamed), computed once its copies landed
    r = run(Config(cpu_share=0.0))
    assert r.events == [
        ("gpu:L0 attn", 0),
        ("h2d:L0 e2", 135),
        ("h2d:L0 e3", 175),
        ("h2d:L0 e4", 215),
        ("gpu:L0 e0,e1,e2,e3,e4", 255),
        ("gpu:L0 combine", 290),
        ("gpu:L1 attn", 300),
        ("h2d:L1 e0", 435),
        ("h2d:L1 e6", 475),
        ("h2d:L1 e7", 515),
        ("gpu:L1 e0,e5,e6,e7", 555),
        ("gpu:L1 combine", 585),
        ("gpu:head", 595),
    ]
    assert r.prompt_ms == pytest.approx(0.595)
    assert (r.n_streamed, r.n_cpu, r.host_us_per_streamed) == (6, 0, 30.0)


def test_routed_only_fixed_share():
    # share 0.5 of 3 streamed -> llround(1.5) = 2 to the CPU, fewest tokens first: e2, e3 | e0, e6
    r = run(Config(cpu_share=0.5))
    assert r.events == [
        ("gpu:L0 attn", 0),
        ("gpu:L0 input d2h", 100),
        ("cpu:L0 2 experts", 120),
        ("h2d:L0 e4", 180),
        ("gpu:L0 e0,e1,e4", 260),
        ("gpu:L0 cpu rows h2d", 285),
        ("gpu:L0 combine", 290),
        ("gpu:L1 attn", 300),
        ("gpu:L1 input d2h", 400),
        ("cpu:L1 2 experts", 420),
        ("h2d:L1 e7", 480),
        ("gpu:L1 e5,e7", 560),
        ("gpu:L1 cpu rows h2d", 580),
        ("gpu:L1 combine", 585),
        ("gpu:head", 595),
    ]
    assert (r.n_streamed, r.n_cpu, r.host_us_per_streamed) == (2, 4, 60.0)  # issued while the pool was busy
    assert r.layer_shares == [0.5, 0.5]


def test_stream_all():
    # STRATA_PREFILL_STREAM_MIN=4: the 4-token chunk streams every non-resident expert, one group a layer;
    # resident experts run in id order around the groups (layer 0: before e2.., layer 1: e5 after e0..e7)
    r = run(Config(cpu_share=0.0, stream_min=4))
    assert r.events == [
        ("gpu:L0 attn", 0),
        ("gpu:L0 resident", 105),
        ("h2d:L0 group 0", 180),
        ("gpu:L0 group 0", 420),
        ("gpu:L0 combine", 445),
        ("gpu:L1 attn", 455),
        ("h2d:L1 group 1", 420),
        ("gpu:L1 group 1", 700),
        ("gpu:L1 resident", 725),
        ("gpu:L1 combine", 740),
        ("gpu:head", 750),
    ]
    assert r.n_streamed == 13  # 6 + 7 non-resident, routed or not


def test_this_engines_routed_only_groups():
    # h200-host16 (this engine's groups, sim/walks.py): the resident experts e0 e1 as one group while the first copy
    # lands, then the streamed e2 e3 e4 as one group (at most 8) once its copies landed
    r = run(Config(cpu_share=0.0), "h200-host16")
    assert r.events == [
        ("gpu:L0 attn", 0),
        ("gpu:L0 e0,e1", 105),
        ("h2d:L0 e2", 135),
        ("h2d:L0 e3", 175),
        ("h2d:L0 e4", 215),
        ("gpu:L0 e2,e3,e4", 255),
        ("gpu:L0 combine", 280),
        ("gpu:L1 attn", 290),
        ("gpu:L1 e5", 395),
        ("h2d:L1 e0", 425),
        ("h2d:L1 e6", 465),
        ("h2d:L1 e7", 505),
        ("gpu:L1 e0,e6,e7", 545),
        ("gpu:L1 combine", 570),
        ("gpu:head", 580),
    ]
    assert (r.n_streamed, r.prompt_ms) == (6, pytest.approx(0.58))


class IssueCosts(FixedCosts):
    """The host timed by what it issues (Costs.by_issue): 10 a copy run (+ 5 for its event), 20 a launch group,
    and the row layout and tables 50 after each routing sync; a run of n neighbouring blobs takes 40 n."""
    by_issue = True
    def group_us(self, t): return 50.0
    def host_group_us(self, busy): return 20.0
    def host_copy_us(self, busy, event): return 10.0 + (5.0 if event else 0.0)
    def copy_run_us(self, nbytes, count, busy): return 40.0 * count


def test_this_engines_routed_only_copies_go_before_the_layout():
    """GpuEngine.moe issues the routed-only walk's first copies right after the routing sync, before the row layout
    and the tables (the link would idle through them): layer 0's streamed e2-e4, one run, start at the sync's end
    (attention 100 + sync 5 + the run's issue 15 = 120) while the host lays out the rows until 170; the resident
    group goes at 190, the streamed one waits for its copies (120 + 3 x 40 = 240)."""
    model = SimModel("tiny", SHAPE)
    r = prefill(Run(machine("h200-host16"), model, 4, Config(cpu_share=0.0), cache_slots=200_000,
                    routing=TraceRouting(IDS), costs=IssueCosts(model), resident=3, timeline=True))
    ev = dict(r.events)
    assert ev["h2d:L0 e2-e4"] == 120 and ev["gpu:L0 e0,e1"] == 190 and ev["gpu:L0 e2,e3,e4"] == 240
    assert r.n_streamed == 6


def test_this_engines_stream_all():
    # one copy a queue entry from t = 0 (host 30 + copy 40 each: entry k lands at 70 + 40k); layer 0's routed
    # entries 0-2 form a group after its copies (150), its unrouted 3-5 are released when the walk passes them;
    # layer 1 (resident e5 first) waits for entry 12 (e7, lands at 550), its unrouted 7-10 released before it
    r = run(Config(cpu_share=0.0, stream_min=4), "h200-host16")
    gpu = [e for e in r.events if e[0].startswith("gpu:")]
    assert gpu == [
        ("gpu:L0 attn", 0),
        ("gpu:L0 e0,e1", 105),
        ("gpu:L0 e2,e3,e4", 150),
        ("gpu:L0 combine", 175),
        ("gpu:L1 attn", 185),
        ("gpu:L1 e5", 290),
        ("gpu:L1 e0,e6,e7", 550),
        ("gpu:L1 combine", 575),
        ("gpu:head", 585),
    ]
    h2d = [(name, t) for name, t in r.events if name.startswith("h2d:")]
    assert [t for _, t in h2d] == [30 + 40 * k for k in range(13)] and r.n_streamed == 13


def test_an_engines_own_plan_sets_the_chunks():
    """Run.plan (bench/share_sim.py): the engine's chunk and ring, not the simulated VRAM plan's; a 4-token
    prompt in chunks of 3 runs as 3 + 1, both routed-only, through the routed-only walk's 16 slots."""
    model = SimModel("tiny", SHAPE)
    common = dict(cache_slots=200_000, routing=TraceRouting(IDS), costs=FixedCosts(model), resident=3)
    own = prefill(Run(machine("rtx4090-7950x"), model, 4, Config(cpu_share=0.0), plan=(3, 40), **common))
    sim = prefill(Run(machine("rtx4090-7950x"), model, 4, Config(cpu_share=0.0), **common))
    assert [(s, t) for s, t, _ in own.chunks] == [(0, 3), (3, 1)]
    assert [(s, t) for s, t, _ in sim.chunks] == [(0, 4)]
    assert own.prompt_ms > sim.prompt_ms          # the second chunk repeats every layer


def test_the_shares_staging_is_pinned_at_load_as_the_engine_does():
    """accel/cpu_block.py pins the share's input and row staging once, for the largest step: no prompt's first
    shared layer pays an allocation (the original grows them lazily; the simulator did, and its meter read a
    19 ms pin as GPU time)."""
    from sim.engine import Session
    from strata.policy import Share, ShareMode, share_policy

    class PinCosts(FixedCosts):
        def pin_us(self, nbytes): return 1000.0  # noqa: E704

    model = SimModel("tiny", SHAPE)
    session = Session(share_policy(Share(ShareMode.FIXED, 0.5)))
    r = [prefill(Run(machine("rtx4090-7950x"), model, 4, Config(cpu_share=0.5), cache_slots=200_000,
                     routing=TraceRouting(IDS), costs=PinCosts(model), resident=3), session) for _ in range(2)]
    assert session.cpu_x_bytes > 0 and session.cpu_rows_bytes > 0
    assert r[0].prompt_ms == pytest.approx(r[1].prompt_ms)
