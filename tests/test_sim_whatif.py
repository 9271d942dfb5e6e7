"""``python -m sim whatif`` answers for a machine the seeds never measured, and draws a readable plot."""

import struct
import subprocess
import sys

import pytest

from sim.hardware import compose
from sim.models import model
from sim.whatif import setting_config, whatif
from strata.policy import Config


def test_settings():
    assert setting_config("off").cpu_share == 0.0
    assert setting_config("auto").cpu_share == "auto"
    assert setting_config("default").cpu_share is None
    assert setting_config("0.3", Config(stream_min=4096)) == Config(cpu_share=0.3, stream_min=4096)


def test_report_for_an_unmeasured_machine():
    w = whatif(
        compose("rtx-4070-ti", "ryzen9-7950x"), model("qwen3-30b-a3b:Q4_K_M"), 600, lengths=(256, 1024)
    )
    text = w.report()
    for key in (
        "machine  rtx-4070-ti+ryzen9-7950x",
        "plan     cache",
        "prompt   600 tokens",
        "decode   ~",
        "advice",
    ):
        assert key in text, f"{key!r} missing from\n{text}"
    assert set(w.results) == {"off", "0.5", "auto"}
    off, auto = w.results["off"], w.results["auto"]
    assert off.n_cpu == 0 and auto.n_cpu > 0 and auto.final_share is not None
    assert [walk.value for _, _, walk in auto.chunks] == ["routed-only"]  # 600 < 3072 (auto asked for)
    assert [n for n, _ in w.curves["auto"]] == [256, 1024]
    assert all(ms > 0 for pts in w.curves.values() for _, ms in pts)


def test_cli_and_plot(tmp_path):
    pytest.importorskip("matplotlib")  # the [sim] extra; this machine has it
    png = tmp_path / "p.png"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "whatif",
            "--gpu",
            "rtx-3060",
            "--cpu",
            "ryzen9-7950x",
            "--model",
            "qwen3-30b-a3b:Q4_K_M",
            "--prompt",
            "512",
            "--share",
            "auto",
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "     auto" in out.stdout and "      off" in out.stdout and f"plot     {png}" in out.stdout
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (880, 550)


def test_decode_estimate_of_the_decode_graph():
    """Strata's decode graph reads every miss over PCIe (pcie_only): the PCIe share is 100%, and it is never faster
    than splitting the misses with the CPU pool where both sides end together; whatif uses it on CUDA only (the
engine's graph needs CUDA)."""
    from sim.costs import Costs
    from sim.decode import decode_estimate
    from sim.workload import ZipfRouting, residency

    mach, m = compose("rtx-4070-ti", "ryzen9-7950x"), model("qwen3-30b-a3b:Q4_K_M")
    prof = ZipfRouting(m.n_layer, m.n_expert, m.k, seed=0).profile()
    res = residency(prof, m.n_layer * m.n_expert // 4)
    graph = decode_estimate(Costs(mach, m), prof, res, 1024, pcie_only=True)
    split = decode_estimate(Costs(mach, m), prof, res, 1024)
    assert graph.pcie_frac == 1.0 and 0.0 < split.pcie_frac < 1.0
    assert 0.0 < graph.tok_s <= split.tok_s and graph.hit_rate == split.hit_rate
    assert whatif(mach, m, 600, settings=("off",)).decode.pcie_frac == 1.0           # CUDA: the graph
    other = compose("rx-6800", "ryzen7-5700x3d")                                          # no CUDA: split
    assert other.gpu.api != "cuda" and whatif(other, m, 600, settings=("off",)).decode.pcie_frac < 1.0


WHATIF = ["whatif", "--gpu", "rtx-4070-ti", "--cpu", "ryzen7-5700x3d", "--model", "qwen3-30b-a3b:Q4_K_M"]


@pytest.mark.parametrize("argv,said", [
    (["--prompt", "-5"], "--prompt must be >= 1, got -5"),
    (["--ctx", "0"], "--ctx must be >= 1, got 0"),
    (["--cache-slots", "-4"], "--cache-slots must be >= 0, got -4"),
    (["--ram", "0"], "--ram must be > 0, got 0"),
    (["--share", "abc"], "--share takes off, auto, default or a share in [0, 1], not 'abc'"),
    (["--share", "1.5"], "not '1.5'"),
])
def test_whatif_checks_its_flags_as_they_parse(argv, said, capsys):
    from sim.__main__ import main

    with pytest.raises(SystemExit) as e:
        main([*WHATIF, *argv])
    assert e.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("argv,said", [
    (["--gpu", "rtx-9999"], "sim whatif: error: no gpu 'rtx-9999' in the catalogue (known: "),
    (["--link", "pcie9"], "sim whatif: error: no link 'pcie9' in the catalogue (known: "),
    (["--model", "nosuch:Q4"], "sim whatif: error: no model 'nosuch' (known: "),
    (["--model", "qwen3-30b-a3b:BOGUS"], "sim whatif: error: no quant mix 'BOGUS'"),
    (["--prompt", "10000", "--ctx", "8192"], "a prompt of 10,000 tokens does not fit the context of 8,192"),
])
def test_whatif_names_an_unknown_part_in_one_line(argv, said):
    """A typo in a catalogue name is one line listing the known ones, not a traceback (last flag wins)."""
    from sim.__main__ import main

    with pytest.raises(SystemExit) as e:
        main([*WHATIF, *argv])
    assert said in str(e.value.code), e.value.code


@pytest.mark.parametrize("argv,said", [
    (["--prompts", "256,abc"], "--prompts takes an integer, not 'abc'"),
    (["--prompts", "256,-3"], "--prompts must be >= 1, got -3"),
    (["--shares", "off,xyz"], "--shares takes off, auto, default or a share in [0, 1], not 'xyz'"),
    (["--shares", ","], "--shares takes a comma list"),
    (["--workers", "0"], "--workers must be >= 1, got 0"),
])
def test_sweep_checks_its_axes_as_they_parse(argv, said, capsys):
    from sim.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["sweep", *argv])
    assert e.value.code == 2 and said in capsys.readouterr().err
