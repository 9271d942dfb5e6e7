"""STRATA_* parsing (SPEC §4, §9): every accepted form, every rejected one, and the resolved share."""

import os
import pathlib
import re

import pytest

from strata.policy import Config, ConfigError, ShareMode, from_process


def cfg(**env):
    return Config.from_env({f"STRATA_{k}": v for k, v in env.items()})


def test_defaults():
    c = Config.from_env({})
    assert c == Config()
    assert (c.cpu_share, c.cpu_share_max, c.stream_min, c.ring) == (None, None, None, None)
    assert (c.lend_pct, c.repeat_min_tokens) == (90, 1024)
    assert not any((c.dbg_cpu_gate, c.pool_pipeline, c.elastic_loan, c.head_loan, c.mtp_loan, c.repeat_loan))
    assert c.decode_graph and c.prompt_graph                # on unless turned off


@pytest.mark.parametrize(
    "value, qualifies, mode, fraction, by_default",
    [
        (None, True, ShareMode.AUTO, 0.0, True),  # unset: auto where it qualifies (CUDA, one GPU, no slots)
        (None, False, ShareMode.OFF, 0.0, False),  # ... off elsewhere
        ("auto", False, ShareMode.AUTO, 0.0, False),
        ("AUTO", True, ShareMode.AUTO, 0.0, False),
        ("0.5", True, ShareMode.FIXED, 0.5, False),
        (".25", True, ShareMode.FIXED, 0.25, False),
        ("1.7", True, ShareMode.FIXED, 1.0, False),  # clamped to [0, 1]
        ("1e-1", True, ShareMode.FIXED, 0.1, False),
        ("0", True, ShareMode.OFF, 0.0, False),
        ("0.0", True, ShareMode.OFF, 0.0, False),
        ("-0.3", True, ShareMode.OFF, 0.0, False),  # clamps to 0 = off
        ("", True, ShareMode.AUTO, 0.0, True),  # empty counts as unset
    ],
)
def test_share_forms(value, qualifies, mode, fraction, by_default):
    env = {} if value is None else {"STRATA_PREFILL_CPU_SHARE": value}
    s = Config.from_env(env).share(qualifies)
    assert (s.mode, s.fraction, s.by_default) == (mode, fraction, by_default)
    assert s.on == (mode is not ShareMode.OFF)


@pytest.mark.parametrize("bad", ["abc", "nan", "inf", "0.5x", "1/2", "on", "1_0"])
def test_share_rejects(bad):
    with pytest.raises(ConfigError, match=re.escape(f"STRATA_PREFILL_CPU_SHARE={bad!r}")):
        cfg(PREFILL_CPU_SHARE=bad)


def test_share_max():
    on_default = cfg().share(True)
    asked = cfg(PREFILL_CPU_SHARE="auto").share(True)
    assert cfg().share_max(on_default) == 1024  # on by default
    assert cfg().share_max(asked) == 3072  # asked for
    assert cfg(PREFILL_CPU_SHARE_MAX="512").share_max(asked) == 1024  # floor
    assert cfg(PREFILL_CPU_SHARE_MAX="5000").share_max(on_default) == 5000  # explicit wins over the default
    with pytest.raises(ConfigError, match="STRATA_PREFILL_CPU_SHARE_MAX='2k': expected a whole number"):
        cfg(PREFILL_CPU_SHARE_MAX="2k")


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("PREFILL_STREAM_MIN", "-1", "expected a whole number >= 0"),
        ("PREFILL_STREAM_MIN", "1.5", "expected a whole number"),
        ("PREFILL_RING", "0", "expected a whole number >= 1"),
        ("PREFILL_LEND_PCT", "0", "expected a whole number in 1..100"),
        ("PREFILL_LEND_PCT", "101", "expected a whole number in 1..100"),
        ("DBG_CPU_GATE", "maybe", "expected a switch"),
        ("POOL_PIPELINE", "2", "expected a switch"),
        ("PREFILL_REPEAT_MIN_TOKENS", "many", "expected a whole number"),
        ("DBG_LINK_GBPS", "fast", "expected a bandwidth in GB/s above 0"),
        ("DBG_LINK_GBPS", "0", "expected a bandwidth in GB/s above 0"),
        ("DBG_LINK_GBPS", "-12", "expected a bandwidth in GB/s above 0"),
        ("DECODE_GRAPH", "sometimes", "expected a switch"),
        ("PROMPT_GRAPH", "abc", "expected a switch"),
        ("PROMPT_GUESS", "abc", "expected a switch"),
    ],
)
def test_rejects_name_the_variable(name, value, message):
    with pytest.raises(ConfigError, match=re.escape(f"STRATA_{name}={value!r}: {message}")):
        cfg(**{name: value})


def test_values():
    c = cfg(
        PREFILL_STREAM_MIN="4096",
        PREFILL_RING="8",
        PREFILL_LEND_PCT="75",
        DBG_CPU_GATE="1",
        POOL_PIPELINE="on",
        PREFILL_ELASTIC_LOAN="true",
        PREFILL_HEAD_LOAN="YES",
        PREFILL_MTP_LOAN="0",
        PREFILL_REPEAT_LOAN="1",
        PREFILL_REPEAT_MIN_TOKENS="50000",
    )
    assert (c.stream_min, c.ring, c.lend_pct) == (4096, 8, 75)
    assert (c.dbg_cpu_gate, c.pool_pipeline, c.elastic_loan, c.head_loan, c.mtp_loan, c.repeat_loan) == (
        True,
        True,
        True,
        True,
        False,
        True,
    )
    assert c.repeat_min_tokens == 50000
    assert c.dbg_link_gbps is None and cfg(DBG_LINK_GBPS="12.5").dbg_link_gbps == 12.5
    assert cfg(PREFILL_REPEAT_MIN_TOKENS="100").repeat_min_tokens == 256  # clamped to >= 256
    assert not cfg(DECODE_GRAPH="0").decode_graph and cfg(DECODE_GRAPH="on").decode_graph
    assert not cfg(PROMPT_GRAPH="0").prompt_graph and cfg(PROMPT_GRAPH="1").prompt_graph
    assert not cfg(PROMPT_GUESS="off").prompt_guess and cfg().prompt_guess
    assert not cfg(GEMM_Q="0").gemm_q and cfg().gemm_q
    with pytest.raises(ConfigError, match=re.escape("STRATA_GEMM_Q='maybe': expected a switch")):
        cfg(GEMM_Q="maybe")


def test_from_process(monkeypatch):
    monkeypatch.setenv("STRATA_PREFILL_CPU_SHARE", "0.3")
    assert from_process().cpu_share == 0.3


def test_env_is_read_in_one_place():
    """ARCHITECTURE: environment variables are read in policy/env.py alone."""
    root = pathlib.Path(__file__).resolve().parents[1]
    pattern = re.compile(r"os\.environ|os\.getenv|getenv\(")
    offenders = [
        str(p.relative_to(root))
        for d in ("strata", "sim")
        for p in (root / d).rglob("*.py")
        if p.name != "env.py" and "STRATA_" in p.read_text() and pattern.search(p.read_text())
    ]
    assert offenders == [], f"these read STRATA_* variables outside strata/policy/env.py: {offenders}"
