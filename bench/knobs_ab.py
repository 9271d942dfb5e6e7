"""In one process: prompts on two quarter-cache engines that differ only in a MoeBlock scheduling knob, CUDA only
(bench/kernel_ab.py's harness: two engines on one arena, arms alternating, medians, per-round ratios, logits compared
bit for bit: the knobs move host work, not arithmetic).

Knobs, set on one engine: rows_on_device (a MoeBlock attribute: a prompt layer's pairs laid out on the device, the
sync downloading counts only; off: on the host from the downloaded ids); guess_p (the engine's RouteMemory.p_min:
guess an expert a chunk routes with at least this probability); pre_groups (a MoeBlock attribute: launch groups of a
prompt layer's cache hits issued before its routing sync, strata/accel/presync.py; 0: none; pre_guessed: of a guessed
walk's experts); gemm_q (the engine's gemm_q_types: 0 dequantises every many-row expert into the fp16 scratch
first); pre_min_tokens (a MoeBlock attribute: the chunks that take those groups whatever their layer's
residency; pre_wide_tokens: below it, narrow layers only, presync.takes_pre); pre_head (a MoeBlock attribute: those
groups' plan, rows, gather and residents' groups as one graph; 0: each launched alone). Not kept, run in earlier forms of
this script: guess_ahead (stop 45: the next layer's guess picked before the routing sync, its copies issued after
the combine, 0.988-0.997x, knobs_ab_q8_stop45.log) and guess_depth (stop 46, branch stop46-guess-depth: layers
guessed ahead, knobs_depth_q48_*_stop46.log).

python bench/knobs_ab.py MODEL.gguf 250,600,900,2048 ROUNDS OLD NEW [FRAC]
    OLD, NEW: each arm's knobs, name=value[,name=value] (rows_on_device=0 rows_on_device=1; guess_p=0.3); FRAC: the
    share of the experts each engine's cache holds (default 0.25, the benchmark's quarter cache; 1: all resident)"""
import sys

import numpy as np

from kernel_ab import AB
from prefill import quarter_engines      # bench/prefill.py

KNOBS = {"rows_on_device": lambda e, v: setattr(e, "rows_on_device", bool(int(v))),
         "guess_p": lambda e, v: setattr(e.routes, "p_min", float(v)),
         "pre_groups": lambda e, v: setattr(e, "pre_groups", int(v)),
         "pre_guessed": lambda e, v: setattr(e, "pre_guessed", int(v)),
         "pre_min_tokens": lambda e, v: setattr(e, "pre_min_tokens", int(v)),
         "pre_wide_tokens": lambda e, v: setattr(e, "pre_wide_tokens", int(v)),
         "pre_head": lambda e, v: setattr(e, "pre_head", bool(int(v))),
         "pre_graphs": lambda e, v: setattr(e, "pre_graphs", e.pre_graphs if int(v) else None),
         "gemm_q": lambda e, v: setattr(e, "gemm_q_types", e.gemm_q_types if int(v) else frozenset())}


def knobs(spec: str) -> list[tuple[str, str]]:
    out = [tuple(kv.split("=", 1)) for kv in spec.split(",") if kv]
    bad = [k for k, _ in out if k not in KNOBS]
    assert not bad, f"knobs {bad}: not of {tuple(KNOBS)}"
    return out


class KnobAB(AB):
    """kernel_ab.AB's prompts on two engines, each with its own knobs."""

    def __init__(self, path: str, old: str, new: str, rounds: int, frac: float = 0.25):
        self.dev, self.m, self.arena, (eo, en) = quarter_engines(path, 2, frac=frac)
        for e, spec in ((eo, old), (en, new)):
            for k, v in knobs(spec):
                KNOBS[k](e, v)
        self.arms, self.rounds = {"old": (eo, None), "new": (en, None)}, rounds

    def use(self, md: str) -> None:
        """Nothing to swap: each arm is its own engine."""


path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
old, new = sys.argv[4], sys.argv[5]
frac = float(sys.argv[6]) if len(sys.argv) > 6 else 0.25
ab = KnobAB(path, old, new, rounds, frac)
print(f"old = {old}, new = {new}, cache {frac:.2f} of the experts", flush=True)
ab.prompts(lengths, np.random.default_rng(0))
for md, (e, _) in ab.arms.items():
    s = e.stats
    print(f"{md}: guessed {s.guessed} experts, {s.guessed_unrouted} unrouted, {s.guessed_missed} routed ones missed; "
          f"streamed {s.streamed_experts}", flush=True)
