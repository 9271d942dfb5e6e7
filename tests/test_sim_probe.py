"""A run's pool probe: bench/cpu_pool.py pool_probe times a pool on a model's own experts as the prefill share runs
them (bench/cpu_share.py stores it per configuration), and the simulator prices that run's CPU experts by it
(sim.costs.PoolProbe) in place of the catalogue's pool model; without a probe every prediction is today's."""

import dataclasses
import os
import sys
import warnings

import pytest

from sim.costs import Costs, PoolProbe
from sim.engine import Run, prefill
from sim.hardware import machine
from sim.models import TYPE_NAME, model
from sim.whatif import setting_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

ROLES = ("exp_gate", "exp_up", "exp_down")
FLASH = ("IQ2_XS", "IQ2_XS", "IQ4_NL")   # flash-shape's experts (the H200 share runs' model)


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    """tiny-qwen2moe's shape with 16 experts a layer: layers 0 and 1 of flash-shape's expert types, layer 2 of
    Q8_0, in an arena on the host device (the blobs as the engine's pool reads them)."""
    from strata import models
    from strata.accel.arena import Arena
    from strata.accel.device.host import HostDevice
    from strata.synth.build import synthesise
    from strata.synth.presets import GGML, PRESETS

    base = PRESETS["tiny-qwen2moe"]
    types = {k: v for k, v in base.types.items() if not k.startswith("exp_")}
    types |= {r: GGML[t] for r, t in zip(ROLES, FLASH)} | {f"{r}@2": GGML["Q8_0"] for r in ROLES}
    shape = dataclasses.replace(base, n_layer=3, n_expert=16, types=types)
    path = str(tmp_path_factory.mktemp("probe") / "probe.gguf")
    synthesise(shape, path, seed=0, name="probe")
    m = models.load(path)
    dev = HostDevice()
    yield m.cfg, Arena(m, dev)
    dev.close()
    m.close()


@pytest.mark.parametrize("workers", [1, 0])
def test_the_probe_times_the_pool_on_the_models_experts(arena, workers):
    """The engine's way (submitted to the workers) and a pool of the host thread alone: 8 positive costs on the
    layers of the most common expert types, more tokens costing more where the host thread runs them alone (a
    worker and a waiting host thread on a 2-core CI box lose whole time slices to any other process)."""
    from cpu_pool import pool_probe, probe_line
    from strata.accel.cpu.pool import ExpertPool

    cfg, ar = arena
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # more threads than cores (a 1-core box) only parks them
        pool = ExpertPool(workers=workers)
    try:
        p = pool_probe(pool, ar.layers, ar.types, cfg.n_embd, cfg.n_ff_exp)
    finally:
        pool.close()
    print(probe_line(p))
    us = p["us_per_expert"]
    assert (p["workers"], tuple(p["types"]), p["layers"], p["experts"]) == (workers, FLASH, [0, 1], [16, 4])
    assert len(us) == 8 and all(u > 0 for u in us) and p["batch_us"] >= 0
    # increasing-ish: eight tokens cost more than one, the upper half more than the lower (noise moves single
    # cells; MAXT rows run a kernel of their own, so t = 8 may undercut t = 7)
    assert workers or us[-1] > us[0] and sum(us[4:]) > sum(us[:4]), us
    assert PoolProbe.from_json(p).us_per_expert == tuple(us)   # what bench/share_sim.py reads back


def _flash(layers: int = 4):
    m = model("flash-shape")
    m = dataclasses.replace(m, shape=dataclasses.replace(m.shape, n_layer=layers))
    assert tuple(TYPE_NAME[m.shape.type_of(r, 0)] for r in ROLES) == FLASH
    return m


def _modelled(costs: Costs, workers: int) -> PoolProbe:
    """A probe that measured, outside a prompt, what the catalogue's pool model gives inside one (a crowded pool's
    probe reads its in-prompt cost over calib.pool_crowded_factor)."""
    us = tuple(costs.cpu_expert_us(0, t) / costs.crowded for t in range(1, 9))
    return PoolProbe(FLASH, us, costs.calib.pool_dispatch_us, workers)


@pytest.mark.parametrize("workers, factor", [(14, 1.1), (15, 1.1), (13, 1.0), (2, 1.0)])
def test_a_pool_that_fills_the_host_costs_more_in_a_prompt_than_its_probe(workers, factor):
    """The H200 host's 16 cores: 14 workers, the engine thread and the driver fill them, and the pool runs its
    experts 1.1x slower in a prompt than in its probe (catalogue calib.pool_crowded_factor); 13 or 2 do not."""
    m = _flash()
    mach = dataclasses.replace(machine("h200-host16"), pool_workers=workers)
    probe = PoolProbe(FLASH, tuple(100.0 + 10 * t for t in range(1, 9)), 25.0, workers)
    c = Costs(mach, m, probe=probe)
    assert c.crowded == factor
    assert [c.cpu_expert_us(2, t) for t in range(1, 9)] == pytest.approx([factor * u for u in probe.us_per_expert])
    assert c.cpu_pool_us(2, [1]) == pytest.approx(25.0 + factor * 110.0)     # the batch's fixed part is as probed


def test_a_probe_replaces_the_pool_model_for_its_types():
    m = _flash()
    mach = dataclasses.replace(machine("h200-host16"), pool_workers=1)
    base = Costs(mach, m)
    probe = PoolProbe(FLASH, tuple(100.0 + 10 * t for t in range(1, 9)), 25.0, 1)
    c = Costs(mach, m, probe=probe)
    assert [c.cpu_expert_us(2, t) for t in range(1, 9)] == list(probe.us_per_expert)
    assert c.cpu_pool_us(2, [1, 3, 8]) == 25.0 + 110.0 + 130.0 + 180.0
    other = PoolProbe(("Q4_K", "Q4_K", "Q4_K"), probe.us_per_expert, 25.0, 1)   # no layer of its types
    c = Costs(mach, m, probe=other)
    assert [c.cpu_expert_us(0, t) for t in range(1, 9)] == [base.cpu_expert_us(0, t) for t in range(1, 9)]
    assert c.cpu_pool_us(0, [2]) == 25.0 + base.cpu_expert_us(0, 2)   # the batch's cost is the pool's
    with pytest.raises(AssertionError):
        PoolProbe(FLASH, (0.0,) * 8, 0.0, 1)


@pytest.mark.parametrize("workers", [14, 1])
def test_the_simulated_prompt_follows_the_probe(workers):
    """A probe that measured the model's own table predicts today's prompt to the bit; one twice as slow, a longer
    CPU-bound prompt (a fixed 0.6 share); off runs no CPU expert and does not move."""
    m = _flash()
    mach = dataclasses.replace(machine("h200-host16"), pool_workers=workers)
    same = _modelled(Costs(mach, m), workers)
    slow = dataclasses.replace(same, us_per_expert=tuple(2 * u for u in same.us_per_expert))
    ms = {}
    for setting in ("off", "0.6"):
        run = Run(mach, m, 250, cfg=setting_config(setting), cache_slots=512)
        ms[setting] = [prefill(dataclasses.replace(run, probe=p)).prompt_ms for p in (None, same, slow)]
    assert ms["off"][0] == ms["off"][1] == ms["off"][2]
    assert ms["0.6"][0] == ms["0.6"][1] < ms["0.6"][2]
    assert prefill(Run(mach, m, 250, cfg=setting_config("0.6"), cache_slots=512)).prompt_ms == ms["0.6"][0]


def test_share_sim_names_the_probe_in_its_header():
    from share_sim import probe_note

    assert probe_note(None) == ""
    p = {"types": list(FLASH), "us_per_expert": [40.2, 50, 60, 70, 80, 90, 100, 118.6], "batch_us": 31.0}
    assert probe_note(p) == ", pool probed: IQ2_XS/IQ2_XS/IQ4_NL 40..119 us an expert at 1..8 tokens + 31 us a batch"


def test_probes_through_a_run_merge_by_their_medians():
    """bench/cpu_share.py probes before the rounds and after each (the pool drifts): per t the median µs, the
    median batch µs, every probe kept; the simulator reads the merged probe like a single one."""
    from cpu_pool import merge_probes

    base = {"workers": 1, "types": list(FLASH), "experts": [32, 8], "reps": 5, "seconds": 3.0, "wall_us": {}}
    probes = [{**base, "us_per_expert": [k * (t + 1) for t in range(8)], "batch_us": b}
              for k, b in ((500.0, 100.0), (700.0, 0.0), (600.0, 40.0))]
    m = merge_probes(probes)
    assert m["us_per_expert"] == [600.0 * (t + 1) for t in range(8)] and m["batch_us"] == 40.0
    assert m["probes"] == 3 and m["each"][1] == probes[1]["us_per_expert"] and m["seconds"] == 9.0
    assert len(m["wall_us"]) == 3                          # every probe's raw medians, not the first one's alone
    p = PoolProbe.from_json(m)
    assert p.us_per_expert[0] == 600.0 and p.workers == 1


def test_the_runs_fastest_and_slowest_probe_bound_a_cell():
    """bench/share_sim.py probe_extremes: the single probes of least and most total µs (a state the pool was in),
    none without two; range_line names the cells beyond 15% with the range those probes predict."""
    from share_sim import probe_extremes, range_line

    merged = {"workers": 1, "types": list(FLASH), "us_per_expert": [2.0, 3.0], "batch_us": 5.0,
              "each": [[2.0, 3.0], [1.0, 2.5], [3.0, 2.0], [2.5, 4.0]]}
    fast, slow = probe_extremes(merged)
    assert fast["us_per_expert"] == [1.0, 2.5] and slow["us_per_expert"] == [2.5, 4.0]
    assert fast["batch_us"] == slow["batch_us"] == 5.0
    assert probe_extremes({**merged, "each": [[2.0, 3.0]]}) is None and probe_extremes(None) is None
    table = {250: {"0.3": {"ms": 100.0}, "off": {"ms": 50.0}}}
    pred, lo, hi = {(250, "0.3"): 80.0, (250, "off"): 52.0}, {(250, "0.3"): 70.0, (250, "off"): 52.0}, \
        {(250, "0.3"): 110.0, (250, "off"): 52.0}
    line = range_line(table, pred, lo, hi, [250], ["off", "0.3"])
    assert line == "beyond 15%, with the run's fastest and slowest pool probe: 250 0.3: measured 100, predicted 80 [70..110]"
    pred[(250, "0.3")] = 90.0
    assert range_line(table, pred, lo, hi, [250], ["off", "0.3"]) == "every prompt time within 15%"


def test_a_link_probe_scales_the_link_to_the_lease():
    """LinkSpec.probed: a lease whose probe reads what the catalogue's link reads (probe_factor x the queued copy's
    rate at the blob's size) leaves every H2D time as it was; a probe 10% slower makes every copy 10% longer, and
    an off prompt, which streams, longer with it."""
    mach = machine("h200-host16")
    link, blob = mach.link, 1_866_465                          # flash-shape's blob (1.78 MiB)
    ref = link.probe_factor * blob / (link.queued_us(blob) * 1e3)
    same, slow = link.probed(ref, blob), link.probed(0.9 * ref, blob)
    for n in (4096, blob, 8 * blob, 1 << 30):
        assert same.queued_us(n) == pytest.approx(link.queued_us(n))
        assert same.h2d_us(n) == pytest.approx(link.h2d_us(n))
        assert slow.queued_us(n) == pytest.approx(link.queued_us(n) / 0.9)
        assert slow.h2d_us(n) == pytest.approx(link.h2d_us(n) / 0.9)
    assert slow.probe_factor * blob / (slow.queued_us(blob) * 1e3) == pytest.approx(0.9 * ref)
    m = _flash()
    rs = [prefill(Run(dataclasses.replace(mach, link=lk), m, 250, cfg=setting_config("off"), cache_slots=512))
          for lk in (link, slow)]
    copies = [r.busy_us["h2d copies"] for r in rs]
    assert copies[1] == pytest.approx(copies[0] / 0.9)      # the same copies, each 1/0.9 as long
    # and the prompt with them, by part of it: the link idles in each layer's host layout (group_us), which the
    # longer copies fill (about half here: 4 layers of 250 tokens)
    assert rs[1].prompt_ms > rs[0].prompt_ms


def test_share_sim_names_the_link_probe_unless_the_link_is_emulated():
    from share_sim import link_note

    assert link_note(None, None) == "" and link_note(49.66, 12.0) == ""
    assert link_note(49.66, None) == ", link probed: 49.7 GB/s a blob"


def test_cpu_share_prints_a_size_classs_policy_state():
    """bench/cpu_share.py's per-class line (the engine's auto and the simulated one side by side): the meter's share
    and unclamped balance, the veto's count, the gate's verdict and its ratios."""
    from cpu_share import class_state
    from strata.policy.auto import GatedShare

    p = GatedShare()
    assert class_state(p) == ("meter share 0.50 (balance none, 0 share arms vetoed), gate do not share after 0 "
                              "eligible layers (ratios )")
    p.meter.sample(1.0, 2, 0.25, 10)             # c 0.5 ms an expert, g 0.025: balance 0.0476, under the floor
    p.gate.ratios.extend([0.97, 1.02])
    assert class_state(p) == ("meter share 0.05 (balance 0.048, 0 share arms vetoed), gate do not share after 0 "
                              "eligible layers (ratios 0.970 1.020)")


def test_a_measured_layout_replaces_the_catalogues_line():
    """Costs.group_us: the run's own layout a layer (bench/cpu_share.py, GpuEngine.stats.layout_s) at its chunk
    sizes, linear between them and flat beyond; none measured, the catalogue's line."""
    m = _flash()
    mach = machine("h200-host16")
    base = Costs(mach, m)
    cal = base.calib
    assert base.group_us(512) == pytest.approx(cal.group_us + cal.group_us_per_expert * m.n_expert
                                               + cal.group_us_per_pair * 512 * m.k)
    assert 2000 < base.group_us(250) < 2400            # flash-shape, 512 experts (share_f_full_stop25c: 1.9-2.2 ms)
    c = Costs(mach, m, layout=((1000, 2600.0), (250, 1600.0), (512, 2000.0)))   # any order
    assert [c.group_us(t) for t in (100, 250, 381, 512, 756, 1000, 2048)] == pytest.approx(
        [1600.0, 1600.0, 1800.0, 2000.0, 2300.0, 2600.0, 2600.0])
    assert Costs(mach, m, layout=((600, 900.0),)).group_us(2048) == 900.0


def test_the_simulated_prompt_follows_the_measured_layout():
    """A slower host layout lengthens an off prompt of the routed-only walk (the link idles once the first copies
    have landed), a layout equal to the catalogue's line leaves it to the bit."""
    m = _flash()
    mach = machine("h200-host16")
    same = tuple((t, Costs(mach, m).group_us(t)) for t in (250,))
    run = Run(mach, m, 250, cfg=setting_config("off"), cache_slots=512)
    ms = [prefill(dataclasses.replace(run, layout=lay)).prompt_ms for lay in (None, same, ((250, 3000.0),))]
    assert ms[0] == ms[1] < ms[2]


def test_share_sim_names_the_measured_layout():
    from share_sim import layout_note

    assert layout_note(None) == "" and layout_note({}) == ""
    assert layout_note({"1000": 2620.0, "250": 1580.0, "512": 2070.0}) == ", host layout measured: 1.6..2.6 ms a layer"


def test_cpu_share_measures_the_host_layout_per_length():
    """bench/cpu_share.py host_layout: per prompt length the median over its off prompts of the engine's layout a
    layer (GpuEngine.stats.layout_s), from LAYOUT_REPS prompts a length, each a reading from every layer."""
    from cpu_share import LAYOUT_REPS, host_layout
    from strata import models, policy
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.device.host import HostDevice
    from strata.accel.engine import GpuEngine
    from strata.policy import Share, ShareMode
    from strata.reference import golden

    m = models.load(golden.model_path("tiny-qwen3moe"))
    dev, pool = HostDevice(), ExpertPool(workers=1)
    try:
        eng = GpuEngine(m, dev, n_ctx=64, pool=pool, config=policy.Config(cpu_share=0.0))
        off = Share(ShareMode.OFF)
        got = host_layout(eng, lambda e: None, off, eng.use_share(off), [8, 24], m.cfg.n_vocab)
    finally:
        pool.close()
        dev.close()
    assert list(got) == [8, 24] and all(us > 0 for us in got.values())
    assert eng.stats.layouts == LAYOUT_REPS * 2 * m.cfg.n_layer
