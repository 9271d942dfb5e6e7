"""`python -m strata.accel generate`'s bad input: every flag checked as it parses (a usage error naming the flag and
its range, before any model loads), a routing trace that is not one named with its line, and the GPU engine's flags
on the CPU backend said to change nothing; --dump-routing writes a trace on the CPU backend too."""

import argparse
import json

import pytest

from strata import routing_trace
from strata.accel.__main__ import build_parser, main
from strata.sampling import SamplingParams


@pytest.mark.parametrize("argv,said", [
    (["-n", "-5"], "-n must be >= 0, got -5"),
    (["-n", "ten"], "-n takes an integer, not 'ten'"),
    (["--ctx", "0"], "--ctx must be >= 1, got 0"),
    (["--chunk", "0"], "--chunk must be >= 1, got 0"),
    (["--pool-workers", "-1"], "--pool-workers must be >= 0, got -1"),
    (["--vram-reserve-mib", "-100"], "--vram-reserve-mib must be >= 0, got -100"),
    (["--vram-budget", "abc"], "not a size: 'abc'"),
    (["--expert-cache", "-3"], "--expert-cache must be >= 0"),
    (["--temp", "-1"], "--temp must be >= 0 (0: greedy), got -1"),
    (["--temp", "nan"], "--temp must be >= 0"),
    (["--top-k", "-1"], "--top-k must be >= 0 (0: off), got -1"),
    (["--top-p", "2"], "--top-p must be in (0, 1] (1: off), got 2"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--min-p", "1"], "--min-p must be in [0, 1) (0: off), got 1"),
    (["--repeat-penalty", "0"], "--repeat-penalty must be > 0 (1: off), got 0"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--top-p", "high"], "--top-p takes a number, not 'high'"),
])
def test_a_bad_flag_is_a_usage_error_naming_it(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["generate", *argv])
    assert e.value.code == 2
    assert said in capsys.readouterr().err


def test_good_flags_parse_to_their_values():
    a = build_parser().parse_args(["generate", "-n", "0", "--ctx", "64", "--chunk", "16", "--pool-workers", "0",
                                   "--temp", "0", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "7"])
    assert (a.n, a.ctx, a.chunk, a.pool_workers, a.temp, a.top_k, a.top_p, a.min_p, a.seed) == (
        0, 64, 16, 0, 0.0, 0, 1.0, 0.0, 7)


@pytest.mark.parametrize("kw,said", [(dict(top_k=-1), "top_k"), (dict(top_p=1.5), "top_p"), (dict(min_p=-0.1), "min_p"),
                                     (dict(repeat_penalty=0.0), "repeat_penalty"), (dict(seed=-2), "seed")])
def test_sampling_params_check_themselves(kw, said):
    """A ValueError, not an assert (which `python -O` would drop)."""
    with pytest.raises(ValueError, match=said):
        SamplingParams(**kw)


def _head(**kw):
    return json.dumps({"format": routing_trace.FORMAT, "version": routing_trace.VERSION, "arch": "x", "n_layer": 2,
                       "n_expert": 4, "n_expert_used": 2, **kw})


@pytest.mark.parametrize("text,said", [
    ("", "not a Strata routing trace (line 1 is not JSON: the file is empty)"),
    ("root:x:0:0:root:/root:/bin/bash\n", "not a Strata routing trace (line 1 is not JSON)"),
    ('["a", "list"]\n', "not a Strata routing trace (first line has format None)"),
    (_head(version=99) + "\n", "routing trace version 99"),
    (_head(n_layer=None) + "\n", "the trace's head has no n_layer"),
    (_head() + '\n{"layer": 0, "counts": {"1": 3}}\n{"layer": 1, "cou', "line 3 is not JSON (a trace cut short?)"),
    (_head() + '\n{"layer": 2, "counts": {"1": 3}}\n', "record 1 is not a layer's routing counts of a 2-layer"),
    (_head() + '\n{"layer": 0, "counts": {"9": 3}}\n', "record 1 is not"),
    (_head() + '\n{"layer": 0, "counts": {"1": -3}}\n', "record 1 is not"),
    (_head() + '\n{"layer": 0}\n', "record 1 is not"),
    (_head() + '\n[1, 2]\n', "record 1 is not"),
])
def test_a_trace_that_is_not_one_is_named_with_its_line(tmp_path, text, said):
    f = tmp_path / "t.jsonl"
    f.write_text(text)
    with pytest.raises(ValueError, match=None) as e:
        routing_trace.profile([str(f)])
    assert str(f) in str(e.value) and said in str(e.value), str(e.value)


def test_a_good_trace_sums_its_counts(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(_head() + '\n{"layer": 0, "counts": {"1": 3, "2": 1}}\n\n{"layer": 1, "counts": {"1": 2}}\n'
                 '{"layer": 0, "counts": {"1": 1}}\n')
    head, counts = routing_trace.profile([str(f)])
    assert head["n_expert"] == 4 and counts == {(0, 1): 4, (0, 2): 1, (1, 1): 2}


def test_generate_names_a_bad_profile_in_one_error_line(tmp_path, capsys):
    """The GPU engine (on its host twin) reads --expert-profile: a file that is not a trace is one error line."""
    f = tmp_path / "passwd"
    f.write_text("root:x:0:0:root:/root:/bin/bash\n")
    assert main(["generate", "--device", "host", "-n", "1", "--expert-profile", str(f)]) == 1
    err = capsys.readouterr().err
    assert f"strata: error: {f}: not a Strata routing trace (line 1 is not JSON)" in err
    assert "Traceback" not in err


def test_an_unwritable_dump_routing_path_is_one_error_line(tmp_path, capsys):
    bad = tmp_path / "no" / "such" / "dir.jsonl"
    assert main(["generate", "--device", "host", "-n", "1", "--dump-routing", str(bad)]) == 1
    assert f"strata: error: {bad}: cannot write the routing trace there" in capsys.readouterr().err


def test_the_cpu_backend_writes_a_trace_and_says_which_flags_change_nothing(tmp_path, capsys):
    """--dump-routing on the CPU backend: a record a layer for the prompt (one chunk) and for each decode step, the
    kernels' warm-up token not among them; the GPU engine's flags given (a reserve at its default value too) named in
    one line."""
    f = tmp_path / "cpu.jsonl"
    n = 3
    assert main(["generate", "--device", "cpu", "--greedy", "-n", str(n), "--prompt", "The cache holds",
                 "--dump-routing", str(f), "--vram-budget", "1G", "--expert-cache", "4", "--vram-reserve-mib", "700",
                 "--pool-workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "--vram-budget, --vram-reserve-mib, --expert-cache: the GPU engine's" in err
    assert "change nothing here" in err
    head, recs = routing_trace.read(str(f))
    recs = list(recs)
    L = head["n_layer"]
    assert len(recs) == L * n, (len(recs), L)         # the prompt, then n - 1 decode steps (the last token is not fed)
    assert [r["layer"] for r in recs] == list(range(L)) * n
    assert recs[0]["pos0"] == 0 and recs[0]["n_tokens"] > 1 and all(r["n_tokens"] == 1 for r in recs[L:])
    assert [r["pos0"] for r in recs[L::L]] == [recs[0]["n_tokens"] + i for i in range(n - 1)]


@pytest.mark.parametrize("argv,said", [(["-n", "-2"], "-n must be >= 0, got -2"), (["--ctx", "0"], "--ctx must be >= 1"),
                                       (["--top-p", "3"], "--top-p must be in (0, 1]")])
def test_the_reference_generate_checks_its_flags_too(argv, said, capsys):
    from strata.reference.__main__ import main as ref_main

    with pytest.raises(SystemExit) as e:
        ref_main(["generate", "--prompt", "hi", *argv])
    assert e.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_a_reader_that_goes_away_ends_generate_quietly(device):
    """`generate ... | head -c 20`: the text stops, stderr has no traceback, the exit status is 141 (128 + SIGPIPE)."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "strata.accel", "generate", "--device", device, "-n", "400",
                          "--greedy", "--ctx", "512"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.read(20)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_ctrl_c_ends_generate_with_one_line(device, tmp_path):
    """^C while generating: one line, exit status 130 (128 + SIGINT), the routing trace written so far closed."""
    import signal
    import subprocess
    import sys

    trace = tmp_path / "t.jsonl"
    # the child takes ^C as a terminal's user would, also where this test runs as a background job (a shell without
    # job control starts those with SIGINT ignored, and a child keeps that: Python then installs no handler)
    p = subprocess.Popen([sys.executable, "-m", "strata.accel", "generate", "--device", device, "-n", "400",
                          "--greedy", "--ctx", "512", "--dump-routing", str(trace)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.read(20)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    err = err.decode()
    assert p.returncode == 130, err
    assert "strata: interrupted" in err and "Traceback" not in err, err
    head, recs = routing_trace.read(str(trace))
    assert len(list(recs)) >= head["n_layer"]         # the prompt's records at least, every line whole


@pytest.mark.parametrize("wrap", [False, True])
def test_ctrl_c_inside_a_numba_call_is_an_interrupt(wrap, monkeypatch, capsys):
    """^C landing in Numba's own Python callbacks (unpickling a cached kernel's constants) comes out as a SystemError
    caused by the KeyboardInterrupt (seen in CI on test_ctrl_c_ends_generate_with_one_line): the same one line and
    status 130; any other SystemError is not swallowed."""
    import strata.accel.__main__ as entry

    def run(a):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            if wrap:
                raise SystemError("CPUDispatcher(<function launch>) returned a result with an exception set") from e
            raise

    monkeypatch.setattr(entry, "run_cpu", run)
    assert main(["generate", "--device", "cpu", "-n", "1"]) == 130
    assert capsys.readouterr().err == "\nstrata: interrupted\n"

    def other(a):
        raise SystemError("not an interrupt")

    monkeypatch.setattr(entry, "run_cpu", other)
    with pytest.raises(SystemError, match="not an interrupt"):
        main(["generate", "--device", "cpu", "-n", "1"])


def test_an_arena_past_the_available_ram_is_refused_before_pinning(monkeypatch, capsys):
    """The arena pins every routed expert: where that and HEADROOM do not fit the available host RAM, a RamShortfall
    says how much is needed and available before a byte is pinned, and `generate` prints it as one line."""
    from strata import models
    from strata.accel import arena as arena_mod
    from strata.accel.generate import model_path

    m = models.load(model_path(argparse.Namespace(model=None)))
    need = arena_mod.Arena.bytes_of(m) + arena_mod.HEADROOM

    class NoPin:
        def pinned(self, nbytes):
            raise AssertionError("pinned before the check")
    with pytest.raises(arena_mod.RamShortfall, match="GiB short") as e:
        arena_mod.Arena(m, NoPin(), available=need - 1)
    assert "host RAM" in str(e.value)
    monkeypatch.setattr(arena_mod, "available_ram", lambda: need - (1 << 20))
    assert main(["generate", "--device", "host", "-n", "1"]) == 1
    err = capsys.readouterr().err
    assert "strata: error: the arena pins every routed expert in host RAM" in err and "GiB short" in err
    monkeypatch.setattr(arena_mod, "available_ram", lambda: need)
    assert main(["generate", "--device", "host", "-n", "1"]) == 0


def test_stats_say_how_the_prompt_ran(capsys):
    """--stats on the GPU engine (the host twin): the expert cache's line, the prompt graphs' and the pre-sync
    groups' counts. The bundled model's cache holds every expert, so each of its 4 layers launches its pre-sync
    groups as one run (ExpertRunner.pre_head: plan, rows, gather, the residents' groups), a key met first running
    eagerly and met again captured: layers 1 and 3 read the same input (the odd layers' plan block, the dense
    segment's region of that parity), so layer 3 captures what layer 1 ran."""
    assert main(["generate", "--device", "host", "--greedy", "-n", "2", "--prompt", "The cache holds", "--stats"]) == 0
    err = capsys.readouterr().err
    assert "expert cache:" in err and "prompt graphs:" in err
    line = next(ln for ln in err.splitlines() if "pre-sync groups:" in ln)
    words = line.split("pre-sync groups:")[1].replace(",", "").split()
    eager, captured, replayed = int(words[0]), int(words[2]), int(words[4])
    assert eager + captured + replayed == 4 and eager >= 1 and captured >= 1, line
