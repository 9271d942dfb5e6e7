"""The hardware catalogue: every figure sourced, the required machines present, the H200 as measured."""

import pytest

from sim.hardware import catalogue, check, compose, machine
from sim.models import model

MIB = 2**20


def test_every_figure_has_a_source():
    assert check() == []


def test_required_machines():
    gpus = {m.gpu.name for m in catalogue()["machines"].values()}
    assert {
        "rtx-3060",
        "rtx-4070-ti",
        "rtx-4090",
        "rtx-5070",
        "rtx-5090",
        "rx-6800",
        "rx-7900-gre",
        "tesla-p100",
        "rtx-2080-super-max-q",
        "h200",
    } <= gpus
    assert machine("rtx5090-9950x3d").cpu.name == "ryzen9-9950x3d"  # SPEC §12 pairs
    assert machine("rx7900gre-5700x3d").cpu.name == machine("rx6800-5700x3d").cpu.name == "ryzen7-5700x3d"
    assert machine("rtx2080sq-10875h").cpu.name == "core-i7-10875h"  # seed 003


def test_h200_as_measured_here():
    h = machine("h200-host16")
    assert (h.cpu.cores, h.cpu.mem_gbps, h.gpu.vram_gib) == (16, 84.1, 141)
    link = h.link
    # pinned H2D by copy size, measured here (peers.md 3.3, 4.1): the curve returns the measured times
    assert link.h2d_us(16 * 1024) == 4.9 and link.h2d_us(MIB) == 23.4
    assert MIB * 64 / link.h2d_us(64 * MIB) / 1e3 == pytest.approx(54.0, rel=1e-3)
    assert link.h2d_us(1.5 * MIB) == pytest.approx(23.4 + 0.5 / 3 * (4 * MIB / 42.9e3 - 23.4), rel=1e-3)
    assert 2 * MIB * 1024 / link.h2d_us(2048 * MIB) / 1e3 == pytest.approx(
        55.4, rel=1e-3
    )  # beyond: 1 GiB's rate


def test_link_without_curve():
    l4 = machine("rtx4090-7950x").link
    assert l4.h2d_us(25_100_000) == pytest.approx(5.0 + 1000.0)  # latency + bytes / 25.1 GB/s


def test_compose_and_errors():
    m = compose("rtx-4090", "ryzen7-5700x3d")
    assert (m.link.name, m.host_issue_us, m.pool_workers) == ("pcie4-x16", 20.0, 8)
    assert compose("rx-6800", "ryzen7-5700x3d").host_issue_us == 107.0
    with pytest.raises(KeyError, match="no gpu 'rtx-9999'"):
        compose("rtx-9999", "ryzen7-5700x3d")
    with pytest.raises(KeyError, match="no machine 'nope'"):
        machine("nope")


def test_models():
    m = model("qwen3-30b-a3b:Q4_K_M")
    # Q4_K gate/up: 2 x 768 rows x 2048 / 256 x 144 B; down Q6_K (2048 rows x 768 / 256 x 210 B) on llama's
    # use_more_bits layers (the first and last eighth, every third between: 0-5, 8, 11, ..., 42-47), else Q4_K
    assert m.blob_bytes(0) == m.blob_bytes(8) == 1_769_472 + 1_290_240
    assert m.blob_bytes(7) == m.blob_bytes(9) == 3 * 884_736
    assert model("flash-next:IQ2_XS/Q2_0").blob_bytes(0) == 947_200 + 460_800
    assert model("flash-next:IQ2_XS").expert_type() == "IQ2_XS"  # down falls back to IQ4_NL
    assert model("flash-next-coder:IQ2_S/Q2_0").n_expert == 256
    with pytest.raises(KeyError, match="no quant mix 'Q9_K'"):
        model("qwen3-30b-a3b:Q9_K")


def test_model_from_gguf_metadata():
    from sim.models import from_gguf_metadata

    meta = {
        "general.architecture": "qwen3moe",
        "qwen3moe.block_count": 2,
        "qwen3moe.embedding_length": 256,
        "qwen3moe.attention.head_count": 4,
        "qwen3moe.attention.head_count_kv": 2,
        "qwen3moe.attention.key_length": 64,
        "qwen3moe.expert_count": 8,
        "qwen3moe.expert_used_count": 2,
        "qwen3moe.expert_feed_forward_length": 256,
        "tokenizer.ggml.tokens": ["a"] * 1000,
    }
    types = {
        f"blk.{l}.{t}.weight": q
        for l in range(2)
        for t, q in (("ffn_gate_exps", 12), ("ffn_up_exps", 12), ("ffn_down_exps", 14 if l == 0 else 12))
    }
    m = from_gguf_metadata(meta, {**types, "output.weight": 14}, "tiny.gguf")
    assert (m.n_layer, m.n_expert, m.k, m.shape.n_vocab) == (2, 8, 2, 1000)
    # Q4_K: 256 rows of 256 weights, 144 B each, per matrix; layer 0's down is Q6_K (210 B a row)
    assert m.blob_bytes(1) == 3 * 256 * 144
    assert m.blob_bytes(0) == 2 * 256 * 144 + 256 * 210
    with pytest.raises(ValueError, match="no routed-expert tensors"):
        from_gguf_metadata(meta, {"output.weight": 14})


def test_machine_calib_overrides_reach_the_costs(tmp_path):
    """A machine's measured constants (catalogue `calib`) replace the seed-fitted ones in its Costs only; an
    unknown name is an error, and a value without a source fails the catalogue check."""
    import dataclasses
    import json

    from sim.calibration import CALIB
    from sim.costs import Costs
    from sim.hardware import Machine

    base, m = machine("rtx5090-9950x3d"), model("qwen3-30b-a3b:Q4_K_M")
    tuned = dataclasses.replace(base, calib={"cpu_job_us": CALIB.cpu_job_us + 100.0})
    assert Costs(tuned, m).cpu_expert_us(0, 1) == pytest.approx(Costs(base, m).cpu_expert_us(0, 1) + 100.0)
    assert Costs(compose("rtx-5090", "ryzen9-9950x3d"), m).calib is CALIB     # nothing measured: the file's
    assert Costs(base, m).calib.gpu_experts == "mmq" != CALIB.gpu_experts     # a seed's machine: the original's
    with pytest.raises(AssertionError, match="not calibration.json fields"):
        dataclasses.replace(base, calib={"cpu_speed": 2.0})
    h = machine("h200-host16")
    assert isinstance(h, Machine) and h.calib["cpu_job_us"] > 0 and hash(h)   # measured on the H200 (sourced)
    data = json.loads(open(__import__("sim.hardware").hardware.CATALOGUE).read())
    data["machines"]["h200-host16"]["sources"].pop("calib.cpu_job_us")
    p = tmp_path / "cat.json"
    p.write_text(json.dumps(data))
    assert check(str(p)) == ["machines.h200-host16.calib.cpu_job_us"]


def test_measured_token_curve_scales_the_cpu_cost():
    """With a machine's cpu_token_curve, an expert of t tokens costs curve[t-1] times one of one token (a compute-
    bound pool, past the fixed job cost); without it, the linear unpack + mac·t model holds."""
    import dataclasses

    from sim.costs import Costs

    m = model("qwen3-30b-a3b:IQ2_XS")
    slow = dataclasses.replace(machine("h200-host16"), pool_workers=1)   # one worker: compute-bound, not DRAM
    curve = (1.0, 1.5, 1.7, 2.0, 2.5, 3.0, 3.5, 4.0)
    c = Costs(dataclasses.replace(slow, calib={**slow.calib, "cpu_token_curve": {"iq": curve}, "cpu_job_us": 0.0}), m)
    one = c.cpu_expert_us(0, 1)
    assert [round(c.cpu_expert_us(0, t) / one, 6) for t in range(1, 9)] == list(curve)
    lin = Costs(dataclasses.replace(slow, calib={**slow.calib, "cpu_token_curve": {}, "cpu_job_us": 0.0}), m)
    steps = [lin.cpu_expert_us(0, t + 1) - lin.cpu_expert_us(0, t) for t in range(1, 8)]
    assert max(steps) == pytest.approx(min(steps))


def test_cpu_pool_cost_by_worker_count():
    """A worker computes at the clock its busy cores allow (turbo_ghz with one, clock_ghz with all, linear between)
    and reads DRAM at most at one thread's bandwidth; a CPU with neither figure keeps the per-worker cost of old."""
    import dataclasses

    from sim.costs import Costs

    h = machine("h200-host16")
    c = h.cpu
    assert c.clock_at(1) == c.turbo_ghz > c.clock_at(8) > c.clock_at(c.cores) == c.clock_ghz
    assert c.clock_at(8) == pytest.approx((c.turbo_ghz * 8 + c.clock_ghz * 7) / 15)
    assert (c.read_gbps(1), c.read_gbps(4), c.read_gbps(16)) == (c.mem_gbps_1t, 4 * c.mem_gbps_1t, c.mem_gbps)
    m = model("qwen3-30b-a3b:IQ2_XS")

    def per_worker(mach, n):   # µs of one worker's time per one-token expert, past the fixed job cost
        mach = dataclasses.replace(mach, pool_workers=n, calib={**mach.calib, "cpu_job_us": 0.0})
        return n * Costs(mach, m).cpu_expert_us(0, 1)

    assert per_worker(h, 1) / per_worker(h, 14) == pytest.approx(c.clock_at(14) / c.turbo_ghz)
    seed = machine("rtx5090-9950x3d")                  # no turbo, no one-thread figure: flat, as before
    assert per_worker(seed, 1) == pytest.approx(per_worker(seed, seed.cpu.cores))
    # a type whose blob outruns the compute at one thread is held to one thread's DRAM bandwidth
    fast = dataclasses.replace(h, cpu=dataclasses.replace(c, turbo_ghz=100 * c.clock_ghz, clock_ghz=c.clock_ghz))
    one = dataclasses.replace(fast, pool_workers=1, calib={**fast.calib, "cpu_job_us": 0.0})
    assert Costs(one, m).cpu_expert_us(0, 1) == pytest.approx(m.blob_bytes(0) / (c.mem_gbps_1t * 1e3))
    with pytest.raises(AssertionError, match="turbo below"):
        dataclasses.replace(c, turbo_ghz=c.clock_ghz / 2)
