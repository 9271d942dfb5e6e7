"""Every STRATA_* environment variable, parsed once into a frozen, typed ``Config`` (SPEC §3-§10).

This module is the only place that reads the environment; the engines and the simulator take a ``Config``.
Rules of the text forms: an empty value counts as unset (``VAR= cmd`` in a shell); switches take
1/0/true/false/on/off/yes/no; anything else is a ``ConfigError`` naming the variable and the value.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import Enum
from typing import Mapping

SHARE_MAX_DEFAULT = 3072  # STRATA_PREFILL_CPU_SHARE_MAX when the share was asked for (SPEC §4)
SHARE_MAX_FLOOR = 1024  # ... never below this
SHARE_MAX_BY_DEFAULT = 1024  # ... when the share is on only because it is the default (0.1.41)
LEND_PCT_DEFAULT = 90  # an auto loan takes at most 90% of the cache (SPEC §9)
REPEAT_MIN_DEFAULT = 1024  # STRATA_PREFILL_REPEAT_MIN_TOKENS, clamped to >= 256 (SPEC §9)
REPEAT_MIN_FLOOR = 256

_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_SWITCH = {"1": True, "true": True, "on": True, "yes": True}
_SWITCH.update({"0": False, "false": False, "off": False, "no": False})


class ConfigError(ValueError):
    """A STRATA_* variable holds a value Strata cannot use; the message names it and says what is accepted."""


class ShareMode(Enum):
    OFF = "off"  # no expert goes to the CPU; output identical to a build without the feature
    FIXED = "fixed"  # a fixed fraction of the streamed experts
    AUTO = "auto"  # measured (meter) and gated (gate), SPEC §5-§6


@dataclass(frozen=True, slots=True)
class Share:
    """The prefill CPU share in force for an engine (SPEC §4)."""

    mode: ShareMode
    fraction: float = 0.0  # FIXED only: the share in (0, 1]
    by_default: bool = False  # on only because unset means auto where it qualifies

    def __post_init__(self):
        if self.mode is ShareMode.FIXED:
            assert 0.0 < self.fraction <= 1.0, f"a fixed share must be in (0, 1], got {self.fraction}"
        assert not self.by_default or self.mode is ShareMode.AUTO, "only auto can be on by default"

    @property
    def on(self) -> bool:
        return self.mode is not ShareMode.OFF


@dataclass(frozen=True, slots=True)
class Config:
    cpu_share: str | float | None = None  # None = unset, "auto", or a fraction in [0, 1] (0 = off)
    cpu_share_max: int | None = None  # STRATA_PREFILL_CPU_SHARE_MAX as given (None = unset)
    stream_min: int | None = None  # STRATA_PREFILL_STREAM_MIN (>= 0)
    ring: int | None = None  # STRATA_PREFILL_RING (>= 1; <= 8 means routed-only always)
    lend_pct: int = LEND_PCT_DEFAULT  # STRATA_PREFILL_LEND_PCT, 1..100
    dbg_cpu_gate: bool = False  # STRATA_DBG_CPU_GATE: print one line per gate reading
    pool_pipeline: bool = False  # STRATA_POOL_PIPELINE (SPEC §10)
    elastic_loan: bool = False  # STRATA_PREFILL_ELASTIC_LOAN (SPEC §9)
    head_loan: bool = False  # STRATA_PREFILL_HEAD_LOAN
    mtp_loan: bool = False  # STRATA_PREFILL_MTP_LOAN (draft resources)
    repeat_loan: bool = False  # STRATA_PREFILL_REPEAT_LOAN
    repeat_min_tokens: int = REPEAT_MIN_DEFAULT
    gemm: str = "mma"                      # STRATA_GEMM: the GPU experts' product kernel, mma (tensor cores) | simt
    gemm_q: bool = True                    # STRATA_GEMM_Q: mma dequantises the many-row experts' blobs inside the
                                           # GEMM (no fp16 scratch); off: a dequantisation kernel first
    dbg_link_gbps: float | None = None     # STRATA_DBG_LINK_GBPS: emulate a slower host->device link (GB/s)
    decode_graph: bool = True              # STRATA_DECODE_GRAPH: single-token decode as one captured graph (SPEC §8)
    prompt_graph: bool = True              # STRATA_PROMPT_GRAPH: a prompt's dense parts, pre-sync groups as graphs
    prompt_guess: bool = True              # STRATA_PROMPT_GUESS: stream a layer's likely experts before its routing
                                           # sync (policy.guess, ours)
    prompt_layer_major: bool = True        # STRATA_PROMPT_LAYER_MAJOR: a prompt of several chunks layer by layer, each
                                           # layer's experts admitted to the cache once (policy.layer_major, ours)

    def __post_init__(self):
        s = self.cpu_share
        assert s is None or s == "auto" or 0.0 <= s <= 1.0, f"cpu_share {s!r}: None, 'auto' or in [0, 1]"
        assert 1 <= self.lend_pct <= 100, f"lend_pct {self.lend_pct} outside 1..100"
        assert self.repeat_min_tokens >= REPEAT_MIN_FLOOR, "repeat_min_tokens is clamped to >= 256"
        assert self.gemm in GEMM_KINDS, f"gemm {self.gemm!r}: one of {GEMM_KINDS}"
        assert self.dbg_link_gbps is None or self.dbg_link_gbps > 0, f"dbg_link_gbps {self.dbg_link_gbps!r}: > 0"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "Config":
        def get(field: str) -> str | None:
            return (environ.get(_VARS[field]) or "").strip() or None

        ints = {f: _int(_VARS[f], get(f), *bounds) for f, bounds in _INTS.items()}
        ints["repeat_min_tokens"] = max(REPEAT_MIN_FLOOR, ints["repeat_min_tokens"])
        flags = {f: _flag(_VARS[f], get(f), default) for f, default in _FLAGS.items()}
        return cls(cpu_share=_share(get("cpu_share")), **ints, **flags,
                   gemm=_choice(_VARS["gemm"], get("gemm"), GEMM_KINDS, "mma"),
                   dbg_link_gbps=_gbps(_VARS["dbg_link_gbps"], get("dbg_link_gbps")))

    def loan_switches(self) -> list[str]:
        """The SPEC §9 loan switches that are on, by variable name. The simulator's VRAM model reads them (sim/vram.py);
        the engine does not lend decode-only VRAM yet and names them at start rather than ignore them."""
        return [_VARS[f] for f in ("elastic_loan", "head_loan", "mtp_loan", "repeat_loan") if getattr(self, f)]

    def share(self, qualifies: bool) -> Share:
        """The share in force. ``qualifies``: CUDA, one GPU, no batch slots (where unset means auto)."""
        if self.cpu_share is None:
            return Share(ShareMode.AUTO, by_default=True) if qualifies else Share(ShareMode.OFF)
        if self.cpu_share == "auto":
            return Share(ShareMode.AUTO)
        return Share(ShareMode.FIXED, self.cpu_share) if self.cpu_share > 0 else Share(ShareMode.OFF)

    def share_max(self, share: Share) -> int:
        """Chunks below this take the routed-only walk and can share (SPEC §4)."""
        if self.cpu_share_max is None:
            return SHARE_MAX_BY_DEFAULT if share.by_default else SHARE_MAX_DEFAULT
        return max(SHARE_MAX_FLOOR, self.cpu_share_max)


GEMM_KINDS = ("mma", "simt")
# fmt: off
_VARS = {f: "STRATA_PREFILL_" + f.upper() for f in (  # field -> variable: STRATA_PREFILL_<FIELD> ...
    "cpu_share", "cpu_share_max", "stream_min", "ring", "lend_pct", "elastic_loan", "head_loan", "mtp_loan",
    "repeat_loan", "repeat_min_tokens")}
_VARS.update(dbg_cpu_gate="STRATA_DBG_CPU_GATE", pool_pipeline="STRATA_POOL_PIPELINE",   # ... but these
             gemm="STRATA_GEMM", gemm_q="STRATA_GEMM_Q", dbg_link_gbps="STRATA_DBG_LINK_GBPS", decode_graph="STRATA_DECODE_GRAPH",
             prompt_graph="STRATA_PROMPT_GRAPH", prompt_guess="STRATA_PROMPT_GUESS",
             prompt_layer_major="STRATA_PROMPT_LAYER_MAJOR")
_INTS = {  # field -> (lowest, highest, default)
    "cpu_share_max": (1, None, None), "stream_min": (0, None, None), "ring": (1, None, None),
    "lend_pct": (1, 100, LEND_PCT_DEFAULT), "repeat_min_tokens": (0, None, REPEAT_MIN_DEFAULT),
}
# fmt: on
_FLAGS = {f: False for f in ("dbg_cpu_gate", "pool_pipeline", "elastic_loan", "head_loan", "mtp_loan", "repeat_loan")}
_FLAGS["decode_graph"] = _FLAGS["prompt_graph"] = _FLAGS["prompt_guess"] = True   # field -> value when unset
_FLAGS["prompt_layer_major"] = _FLAGS["gemm_q"] = True


def from_process() -> Config:
    """The process's configuration (the one call that reads ``os.environ``)."""
    return Config.from_env(os.environ)


def _share(v: str | None) -> str | float | None:
    if v is None:
        return None
    if v.lower() == "auto":
        return "auto"
    if not _NUMBER.fullmatch(v):
        raise ConfigError(
            f"STRATA_PREFILL_CPU_SHARE={v!r}: expected 'auto', a number (a fixed share, "
            f"clamped to [0, 1]; 0 turns the share off), or unset"
        )
    return min(1.0, max(0.0, float(v)))


def _gbps(name: str, v: str | None) -> float | None:
    if v is None:
        return None
    if not _NUMBER.fullmatch(v) or not float(v) > 0:
        raise ConfigError(f"{name}={v!r}: expected a bandwidth in GB/s above 0 (say 12 for PCIe 3.0 x16), or unset")
    return float(v)


def _int(name: str, v: str | None, lo: int, hi: int | None = None, default: int | None = None) -> int | None:
    if v is None:
        return default
    try:
        n = int(v, 10)
    except ValueError:
        raise ConfigError(f"{name}={v!r}: expected a whole number") from None
    if n < lo or (hi is not None and n > hi):
        span = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ConfigError(f"{name}={v!r}: expected a whole number {span}")
    return n


def _choice(name: str, v: str | None, allowed: tuple[str, ...], default: str) -> str:
    if v is None:
        return default
    if v.lower() not in allowed:
        raise ConfigError(f"{name}={v!r}: expected one of {', '.join(allowed)}")
    return v.lower()


def _flag(name: str, v: str | None, default: bool = False) -> bool:
    if v is None:
        return default
    if v.lower() in _SWITCH:
        return _SWITCH[v.lower()]
    raise ConfigError(f"{name}={v!r}: expected a switch (1/0, true/false, on/off, yes/no)")
