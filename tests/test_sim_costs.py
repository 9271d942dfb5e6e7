"""The simulator's GPU expert cost model for this engine (sim/costs.py, calib gpu_experts "rows_gemm") and its launch
groups (sim/walks.py): the engine's constants and grouping rules, a group's cost written out, and every expert op
of the all-resident engine's measured prompts (GPU-bound, so its op times are kernel times) against the model."""

import dataclasses
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sim import walks
from sim.calibration import CALIB
from sim.costs import FEW_ROWS, GEMM_Q_TILES, GEMM_ROWS, Costs, takes_gemm_q
from sim.hardware import machine
from sim.models import model
from sim.workload import TraceRouting

H200 = machine("h200-host16")
RESULTS = Path(__file__).parent.parent / "bench" / "results" / "h200"


def sim_model(preset: str, layers: int = 8):
    """The bench's synthetic models (python -m strata.synth --preset P --layers 8): the preset's own types."""
    m = model(preset)
    return dataclasses.replace(m, shape=dataclasses.replace(m.shape, n_layer=layers))


def test_the_engines_constants():
    from strata.accel import memplan, moe

    assert (FEW_ROWS, GEMM_ROWS, GEMM_Q_TILES) == (moe.FEW_ROWS, moe.GEMM_BM, moe.GEMM_Q_TILES)
    assert walks.GROUP == memplan.GROUP


def test_a_group_takes_gemm_q_as_the_engine_decides():
    """sim.costs.takes_gemm_q against the engine's: rows_host.many_tile's row tile (128 rows where every many-row
    member has more than 64), the tiles group_tiles cuts, moe.takes_gemm_q."""
    from strata.accel.moe import GEMM_BM, takes_gemm_q as engine_takes
    from strata.accel.rows_host import many_tile

    rng = random.Random(1)
    seen = set()
    for _ in range(500):
        many = [rng.choice([9, 30, 64, 65, 100, 128, 129, 400]) for _ in range(rng.randint(0, 16))]
        bm = many_tile(np.array(many, np.int64), FEW_ROWS, GEMM_BM, 2 * GEMM_BM)
        tiles = sum(-(-n // bm) for n in many)
        want = engine_takes(bm, tiles, len(many))
        assert takes_gemm_q(many) == want, (many, bm, tiles)
        seen.add(want)
    assert seen == {True, False}


def test_a_gemm_q_groups_cost_written_out():
    """qwen3-30b-a3b (Q4_K: family k), rows 3 | 9, 40, 64: one expert by expert_rows, three by gemm_q (one tile
    each, at calib's rate a million weights); launches: swiglu, expert_rows x2, gemm_q x2 (gate|up one matrix).
    A rate-less family keeps the scratch path's price."""
    c, g = Costs(H200, sim_model("qwen3-30b-a3b")), H200.gpu
    full = c.calib
    W = 3 * 2048 * 768
    bw = g.mem_gbps * 1e3
    q = W / 1e6 * full.gpu_gemm_q_us_per_mw["k"]
    swiglu = (3 + 9 + 40 + 64) * 768 * 10 / (bw * full.gpu_bw_eff)
    want = 5 * full.gpu_group_launch_us + 3 * c.rows_us(0) + 3 * q + swiglu
    assert c.grouped_us(0, [3, 9, 40, 64]) == pytest.approx(want, rel=1e-12)
    assert c.gemm_q_us(0, 65) == pytest.approx(2 * q)                    # a second tile dequantises again
    none = Costs(H200, sim_model("qwen3-30b-a3b"), dataclasses.replace(CALIB, gpu_gemm_q_us_per_mw={}))
    scratch = 7 * full.gpu_group_launch_us + 3 * none.rows_us(0) + sum(
        none.dequant_us(0) + none.gemm_us(0, n) for n in (9, 40, 64)) + swiglu
    assert none.gemm_q_us(0, 9) is None and none.grouped_us(0, [3, 9, 40, 64]) == pytest.approx(scratch, rel=1e-12)


def test_groups_as_the_engine_forms_them():
    """walks.resident_groups against ExpertRunner.resident_groups (one rule, policy.resident_runs, fed the
    simulator's rows), and policy.walk_runs against a hand-written reading of its rule."""
    from strata.accel.moe import ExpertRunner
    from strata.policy import walk_runs

    rng = random.Random(0)
    for _ in range(200):
        rows = [rng.choice([1, 3, 8, 9, 40, 200]) for _ in range(rng.randint(1, 150))]
        cap = rng.choice([1, 8, 16])
        runner = SimpleNamespace(few_rows=FEW_ROWS, bufs=SimpleNamespace(w_d=np.zeros((cap, 1))))
        lay = SimpleNamespace(cnt=np.array(rows))
        want = ExpertRunner.resident_groups(runner, list(range(len(rows))), lay)
        assert walks.resident_groups(rows, cap) == want
        entries = sorted(rng.sample(range(400), rng.randint(1, 100)))
        if rng.random() < 0.3:                          # the routed-only walk's: consecutive (walk_runs' chunks)
            entries = list(range(rng.randint(0, 50), rng.randint(51, 300)))
        ring, limit = rng.choice([6, 16, 30, 284]), rng.choice([4, 8, 16])
        got = walk_runs(entries, limit, ring)
        assert [k for g in got for k in g] == entries                  # every entry, in order, once
        assert all(len(g) <= limit and g[-1] - g[0] < ring for g in got)
        # each group closes only because the next entry would break a rule
        assert all(len(a) == limit or b[0] - a[0] >= ring for a, b in zip(got, got[1:]))


def test_compute_order():
    # GpuEngine.moe: resident 0 while the first copies land, one after each streamed group, the rest last
    assert walks.compute_order(3, 2) == [("res", 0), ("str", 0), ("res", 1), ("str", 1), ("res", 2), ("free", -1)]
    assert walks.compute_order(0, 2) == [("str", 0), ("str", 1), ("free", -1)]
    assert walks.compute_order(2, 0) == [("free", -1), ("res", 0), ("res", 1)]


def test_a_groups_cost_written_out():
    """qwen3-30b-a3b (Q4_K experts: gate|up one matrix), rows 1, 8 | 9, 64, 65: two experts by expert_rows (9 rows,
    each decoding its blob), three dequantised, GEMM tiles 1 + 1 + 2; launches: swiglu, expert_rows x2, dequant x2,
    gemm_grouped x2."""
    c, g = Costs(H200, sim_model("qwen3-30b-a3b")), H200.gpu
    full = c.calib
    W = 3 * 2048 * 768                              # weights an expert
    blob = W * 144 // 256                           # Q4_K: 144 bytes a 256-weight block
    assert c.blob(0) == blob and full.gpu_experts == "rows_gemm"
    bw = g.mem_gbps * 1e3
    rows = blob / (bw * full.gpu_rows_bw_eff)
    deq = (blob + 2 * W) / (bw * full.gpu_dequant_bw_eff)
    tile = 2 * 64 * W / (g.fp16_tflops * 1e6 * full.gpu_gemm_eff)      # one 64-row tile's multiply-adds
    floor = 2 * W / (bw * full.gpu_gemm_bw_eff)                          # the expert's fp16 weights read once
    gemm = max(tile, floor) + max(tile, floor) + max(2 * tile, floor)    # 9 | 64 | 65 rows: 1, 1, 2 tiles
    swiglu = (1 + 8 + 9 + 64 + 65) * 768 * 10 / (bw * full.gpu_bw_eff)
    want = 7 * full.gpu_group_launch_us + 9 * rows + 3 * deq + gemm + swiglu
    assert c.grouped_us(0, [1, 8, 9, 64, 65]) == pytest.approx(want, rel=1e-12)
    assert c.gemm_us(0, 65) == pytest.approx(max(2 * tile, floor))
    mixed = sim_model("flash-shape")                # IQ2_XS gate|up, IQ4_NL down: still one gate|up matrix
    assert Costs(H200, mixed).grouped_us(0, [1]) == pytest.approx(
        3 * full.gpu_group_launch_us + Costs(H200, mixed).rows_us(0) + 10 * 640 / (bw * full.gpu_bw_eff))


# GPU ms of the expert ops (gemm_grouped + dequant + expert_rows + swiglu) of one all-resident prompt, the engine
# of stop 21 (bench/results/h200/prefill_ops_q8_stop21.log, prefill_ops_f8_stop21.log; one prompt timed, random
# tokens). band: +-12% (the fit's largest prompt is qwen3 at 250 tokens, +10%: its expert_rows read +20%)
OP_LOGS = {
    ("qwen3-30b-a3b", "share_q_real_stop21", 250): 1.25 + 1.34 + 1.72 + 0.10,
    ("qwen3-30b-a3b", "share_q_real_stop21", 1000): 4.04 + 2.34 + 1.27 + 0.28,
    ("qwen3-30b-a3b", "share_q_real_stop21", 2048): 7.56 + 2.61 + 1.17 + 0.49,
    ("flash-shape", "share_f_full_stop21", 250): 3.81 + 5.04 + 18.50 + 0.40,
    ("flash-shape", "share_f_full_stop21", 1000): 11.80 + 15.49 + 21.47 + 0.94,
    ("flash-shape", "share_f_full_stop21", 2048): 20.57 + 24.73 + 15.86 + 1.50,
}


@pytest.mark.parametrize("preset, trace, tokens", list(OP_LOGS))
def test_expert_ops_of_an_all_resident_prompt(preset, trace, tokens):
    """Each layer's routed experts, from the routing of that stop's cpu_share runs (the first `tokens` of its
    2,048-token random prompt; the op logs' prompts were other random tokens), in the resident engine's groups
    (one chunk, 16-expert scratch, memplan's plan when every expert fits), priced as stop 21's engine ran them:
    every many-row expert by dequant + gemm_grouped."""
    m, routing = sim_model(preset), TraceRouting.load(f"{RESULTS}/{trace}_routing.npz")
    c = Costs(H200, m, dataclasses.replace(CALIB, gpu_gemm_q_us_per_mw={}))     # stop 21's engine: no gemm_q
    ms = 0.0
    for l in range(m.n_layer):
        rows = [int(n) for n in routing.counts(l, 0, tokens) if n > 0]
        ms += sum(c.grouped_us(l, [rows[i] for i in g]) for g in walks.resident_groups(rows, 16)) / 1e3
    assert ms == pytest.approx(OP_LOGS[(preset, trace, tokens)], rel=0.12)
